"""The helper commands docs/scale.md uses: sample_pairs (the measurement's input) and compare."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from onnxrank.scoring import compare, sample_pairs


def write_dataset(directory: Path) -> None:
    directory.mkdir()
    (directory / "queries.jsonl").write_text(
        "".join(json.dumps({"id": f"q{i}", "text": f"query {i}"}) + "\n" for i in range(3)))
    (directory / "corpus.jsonl").write_text(
        "".join(json.dumps({"id": f"d{i}", "text": f"document {i}"}) + "\n" for i in range(5)))


def test_sample_pairs_is_deterministic_and_cycles_queries(tmp_path: Path) -> None:
    write_dataset(tmp_path / "data")
    for name in ("a.jsonl", "b.jsonl"):
        assert sample_pairs.main(["--dataset", str(tmp_path / "data"), "--pairs", "7",
                                  "--out", str(tmp_path / name)]) == 0
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    records = [json.loads(line) for line in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [record["query"] for record in records] == [f"query {i % 3}" for i in range(7)]
    assert all(record["id"] == f"q{i % 3}:d{record['document'].split()[1]}"
               for i, record in enumerate(records))
    with pytest.raises(ValueError, match=re.escape("queries.jsonl not found in")):
        sample_pairs.write_pairs(tmp_path, 3, tmp_path / "c.jsonl")


def test_compare_local_files_and_a_ray_directory(tmp_path: Path, tiny_model_dir: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    pq.write_table(pa.table({"row": [0, 2], "score": pa.array([1.0, 2.0], pa.float32())}),
                   tmp_path / "local.parquet")
    (tmp_path / "local.jsonl").write_text('{"row": 0, "score": 1.0}\n{"row": 2, "score": 2.5}\n')
    (tmp_path / "ray").mkdir()
    pq.write_table(pa.table({"score": pa.array([1.0005, None, 2.0], pa.float32()),
                             "error": [None, "blank line", None]}), tmp_path / "ray" / "a.parquet")
    assert compare.main([str(tmp_path / "local.parquet"), str(tmp_path / "ray")]) == 0
    assert "2 scored rows in both, same rows; max |score difference| 5.00e-04" in capsys.readouterr().out
    assert compare.main([str(tmp_path / "local.parquet"), str(tmp_path / "ray"), "--atol", "0"]) == 1
    assert compare.main([str(tmp_path / "local.parquet"), str(tmp_path / "local.jsonl")]) == 1
    pq.write_table(pa.table({"row": [0], "score": pa.array([1.0], pa.float32())}),
                   tmp_path / "short.parquet")
    assert compare.main([str(tmp_path / "short.parquet"), str(tmp_path / "ray")]) == 1
    assert "scored rows differ: 1 in" in capsys.readouterr().out
    manifest = json.loads((tiny_model_dir / "manifest.json").read_text())
    effect = manifest["variants"]["int8"]["fidelity"]["batch_1_vs_64_max_abs_diff"]
    assert compare.batch_effect(tiny_model_dir, "int8") == effect
    with pytest.raises(ValueError, match="has no batch_1_vs_64_max_abs_diff for variant 'fp32'"):
        compare.batch_effect(tiny_model_dir, "fp32")
