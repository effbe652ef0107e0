"""The shipped data files: byte-for-byte rebuild, first-stage candidate lists in two regimes, parts
and calibration that share nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest

from onnxrank.export.validate import (
    CALIBRATION,
    HELD_OUT,
    MIXED,
    SHORT,
    SUBSET_MIN_GROUP_PAIRS,
    TUNING,
    load_calibration_pairs,
    load_validation_pairs,
)
from onnxrank.export.validation_data import CANDIDATES, MIXED_WORDS, QUERIES, SHORT_WORDS

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
        "wrote tuning 16 groups / 480 pairs, held_out 20 groups / 600 pairs, calibration 12 groups "
        "/ 360 pairs (30 BM25 candidates a group, regimes short, mixed) and 416 head pairs to "
        f"{tmp_path}")
    for name in DATA_FILES:
        shipped = resources.files("onnxrank.data").joinpath(name).read_bytes()
        assert (tmp_path / name).read_bytes() == shipped, f"{name} differs from the shipped file"


def test_groups_are_candidate_lists_of_one_part_and_regime_each() -> None:
    rows = _rows("validation_pairs.jsonl") + _rows("calibration_pairs.jsonl")
    groups: dict[str, list[dict[str, object]]] = {}
    for row in rows:
        groups.setdefault(str(row["group"]), []).append(row)
    assert {len(members) for members in groups.values()} == {CANDIDATES}
    kinds: Counter[tuple[object, object, str]] = Counter()
    for members in groups.values():
        assert len({(row["part"], row["regime"], row["query"]) for row in members}) == 1
        kinds[(members[0]["part"], members[0]["regime"], str(members[0]["group"]).split(":")[0])] += 1
    assert kinds == {(part, regime, collection): counts[column]
                     for part, counts in QUERIES.items() for regime in (SHORT, MIXED)
                     for column, collection in enumerate(("cranfield", "cacm"))}
    words = {regime: [len(str(row["passage"]).split()) for row in rows if row["regime"] == regime]
             for regime in (SHORT, MIXED)}
    # short: one document's first words (a document shorter than the drawn length stays whole)
    assert max(words[SHORT]) <= SHORT_WORDS[1]
    assert all(len(row["doc_ids"]) == 1 for row in rows if row["regime"] == SHORT)  # type: ignore[arg-type]
    # mixed: from a few words to past the model's 512 tokens, several documents run together
    assert min(words[MIXED]) <= 2 * MIXED_WORDS[0] and max(words[MIXED]) >= 400
    assert max(len(row["doc_ids"]) for row in rows if row["regime"] == MIXED) > 1  # type: ignore[arg-type]


def test_parts_and_calibration_share_no_query_passage_or_document() -> None:
    rows = _rows("validation_pairs.jsonl") + _rows("calibration_pairs.jsonl")
    head = _rows("standin_head_pairs.jsonl")
    by_part = {part: [row for row in rows if row["part"] == part]
               for part in (TUNING, HELD_OUT, CALIBRATION)}
    assert [len(members) for members in by_part.values()] == [480, 600, 360]

    def documents(members: list[dict[str, object]]) -> set[tuple[str, str]]:
        return {(str(row["group"]).split(":")[0], str(doc_id))
                for row in members for doc_id in row["doc_ids"]}  # type: ignore[attr-defined]

    head_documents = {("cranfield", str(row["doc_id"])) for row in head}
    for part, members in by_part.items():
        queries = {(row["query"], row["regime"]) for row in members}
        # one query serves one regime of one part
        assert len({query for query, _ in queries}) == len(queries), part
        assert {str(row["query"]) for row in members}.isdisjoint(str(row["query"]) for row in head)
        assert documents(members).isdisjoint(head_documents), part
        for other, other_members in by_part.items():
            if other <= part:
                continue
            assert {row["query"] for row in members}.isdisjoint(row["query"] for row in other_members)
            assert {row["passage"] for row in members}.isdisjoint(
                row["passage"] for row in other_members)
            assert documents(members).isdisjoint(documents(other_members)), (part, other)


def test_loaders_read_each_pairs_part_and_regime() -> None:
    pairs = load_validation_pairs()
    shipped = _rows("validation_pairs.jsonl")
    assert [(pair.group, pair.part, pair.regime) for pair in pairs] == [
        (row["group"], row["part"], row["regime"]) for row in shipped]
    assert load_validation_pairs(part=HELD_OUT) == [pair for pair in pairs if pair.part == HELD_OUT]
    assert {pair.part for pair in load_calibration_pairs()} == {CALIBRATION}
    with pytest.raises(ValueError, match="part must be one of tuning, held_out or None, got 'test'"):
        load_validation_pairs(part="test")


def test_a_validation_subset_is_each_groups_first_pairs_of_both_parts_and_regimes() -> None:
    pairs = load_validation_pairs()
    # (limit, groups, pairs per group): two groups at least, each cut to the first pairs of its
    # BM25 list and never below SUBSET_MIN_GROUP_PAIRS; 300 pairs take whole groups of 30
    for limit, groups, per_group in ((16, 2, SUBSET_MIN_GROUP_PAIRS), (48, 2, 24), (100, 4, 25),
                                     (300, 10, 30)):
        subset = load_validation_pairs(limit)
        chosen = list(dict.fromkeys(pair.group for pair in subset))
        assert len(chosen) == groups, limit
        assert subset == [pair for group in chosen
                          for pair in [p for p in pairs if p.group == group][:per_group]], limit
        assert {pair.part for pair in subset} == {TUNING, HELD_OUT}, limit
        # each part alternates regimes, short first: four groups or more hold both
        assert {pair.regime for pair in subset} == ({SHORT, MIXED} if groups >= 4 else {SHORT}), limit
    # the fewest groups: each part's first, short passages
    smallest = load_validation_pairs(1)
    assert {(pair.part, pair.regime) for pair in smallest} == {(TUNING, SHORT), (HELD_OUT, SHORT)}
    assert len(smallest) == 2 * SUBSET_MIN_GROUP_PAIRS


def test_a_calibration_subset_is_whole_groups_spread_over_the_file() -> None:
    everything = load_calibration_pairs()
    groups = list(dict.fromkeys(pair.group for pair in everything))
    subset = load_calibration_pairs(75)  # 12 groups of 30 pairs: 75 rounds to 2 (2.5) whole groups
    chosen = list(dict.fromkeys(pair.group for pair in subset))
    assert chosen == [groups[0], groups[-1]]
    assert {pair.regime for pair in subset} == {SHORT, MIXED}
    assert subset == [pair for pair in everything if pair.group in chosen]
    assert load_calibration_pairs(1) == [pair for pair in everything if pair.group == groups[0]]
    assert load_calibration_pairs(10_000) == everything
    with pytest.raises(ValueError, match="calibration pairs must be >= 1, got 0"):
        load_calibration_pairs(0)
