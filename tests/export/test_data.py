"""The shipped data files: byte-for-byte rebuild, disjoint calibration pairs, the held-out split."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from onnxrank.export.validate import (
    HELD_OUT_GROUPS,
    load_calibration_pairs,
    load_validation_pairs,
)

REPO = Path(__file__).parents[2]
# CI clones the repository with shared/ beside it; a missing collection must fail, not skip
SHARED_DATA = REPO.parent / "shared" / "data"
DATA_FILES = ("validation_pairs.jsonl", "calibration_pairs.jsonl", "standin_head_pairs.jsonl")


def _rows(name: str) -> list[dict[str, object]]:
    text = resources.files("onnxrank.data").joinpath(name).read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_validation_data_command_rebuilds_the_shipped_files_byte_for_byte(tmp_path: Path) -> None:
    assert (SHARED_DATA / "cranfield" / "corpus.jsonl").is_file(), (
        f"the shared collections are missing at {SHARED_DATA}")
    completed = subprocess.run(
        [sys.executable, "-m", "onnxrank.export.validation_data", "--data", str(SHARED_DATA),
         "--out-dir", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == (
        f"wrote 33 validation groups (13 of them extra held-out groups: {', '.join(HELD_OUT_GROUPS[7:])}), "
        f"320 calibration pairs and 416 head pairs to {tmp_path}")
    for name in DATA_FILES:
        shipped = resources.files("onnxrank.data").joinpath(name).read_bytes()
        assert (tmp_path / name).read_bytes() == shipped, f"{name} differs from the shipped file"


def test_calibration_pairs_share_nothing_with_the_validation_pairs() -> None:
    validation, calibration = _rows("validation_pairs.jsonl"), _rows("calibration_pairs.jsonl")
    assert len(calibration) == 320
    assert {str(row["query"]) for row in validation}.isdisjoint(str(row["query"]) for row in calibration)
    assert {str(row["passage"]) for row in validation}.isdisjoint(
        str(row["passage"]) for row in calibration)
    # not even an abstract inside a long passage: document ids per collection are disjoint too

    def documents(rows: list[dict[str, object]]) -> set[tuple[str, str]]:
        return {(str(row["group"]).split(":")[0], str(doc_id))
                for row in rows for doc_id in row["doc_ids"]}  # type: ignore[attr-defined]

    assert documents(validation).isdisjoint(documents(calibration))
    assert {pair.part for pair in load_calibration_pairs()} == {"calibration"}


def test_a_calibration_subset_is_whole_groups_spread_over_the_file() -> None:
    everything = load_calibration_pairs()
    groups = list(dict.fromkeys(pair.group for pair in everything))
    subset = load_calibration_pairs(40)  # 20 groups of 16 pairs: 40 rounds to 2 (2.5) whole groups
    chosen = list(dict.fromkeys(pair.group for pair in subset))
    assert chosen == [groups[0], groups[-1]]
    assert subset == [pair for pair in everything if pair.group in chosen]
    assert load_calibration_pairs(1) == [pair for pair in everything if pair.group == groups[0]]
    assert load_calibration_pairs(10_000) == everything
    with pytest.raises(ValueError, match="calibration pairs must be >= 1, got 0"):
        load_calibration_pairs(0)


def test_held_out_part_is_fixed_whole_groups_sharing_no_text_with_tuning() -> None:
    pairs = load_validation_pairs()
    held_out = [pair for pair in pairs if pair.part == "held_out"]
    tuning = [pair for pair in pairs if pair.part == "tuning"]
    assert {pair.group for pair in held_out} == set(HELD_OUT_GROUPS)
    assert (len(held_out), len(tuning)) == (320, 208)
    assert {pair.group for pair in held_out}.isdisjoint(pair.group for pair in tuning)
    assert {pair.query for pair in held_out}.isdisjoint(pair.query for pair in tuning)
    assert {pair.passage for pair in held_out}.isdisjoint(pair.passage for pair in tuning)
    assert load_validation_pairs(part="held_out") == held_out
    # nor a query the stand-in's head was fitted on (it scores every held-out pair in the docs)
    assert {pair.query for pair in held_out}.isdisjoint(
        str(row["query"]) for row in _rows("standin_head_pairs.jsonl"))
    with pytest.raises(ValueError, match="part must be one of tuning, held_out or None, got 'test'"):
        load_validation_pairs(part="test")
