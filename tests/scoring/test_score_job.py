"""`onnxrank score` on the tiny model: scores equal Reranker.score, input order and ids kept, bad rows
in the side file, both formats both ways, and refusals that protect a half-finished run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scoring_fixtures import BAD_LINES, DOCUMENTS, QUERIES, make_lines

from onnxrank import Reranker
from onnxrank.cli import main
from onnxrank.scoring.records import BadRow, PairRow, check_line, check_record
from onnxrank.scoring.shards import parts_dir_for


@pytest.fixture(scope="module")
def fp32(tiny_model_dir: Path) -> Reranker:
    return Reranker.from_dir(tiny_model_dir, device="cpu", precision="fp32")


def expected(lines: list[str], reranker: Reranker) -> tuple[list[int], list[str], np.ndarray]:
    """Rows, ids and Reranker.score logits of the good lines: the independent reference."""
    good = [(row, json.loads(line)) for row, line in enumerate(lines)
            if isinstance(check_line(row, line, ("id",)), PairRow)]
    scores = reranker.score([(record["query"], record["document"]) for _, record in good])
    return [row for row, _ in good], [record.get("id") for _, record in good], scores


def run_score(*argv: str) -> int:
    return main(["score", "--precision", "fp32", "--device", "cpu", "--no-progress", *argv])


@pytest.mark.parametrize(("line", "reason"), BAD_LINES)
def test_each_bad_row_kind_has_its_reason(line: str, reason: str) -> None:
    checked = check_line(4, line, ("id",))
    assert isinstance(checked, BadRow) and checked.row == 4
    assert checked.reason.startswith(reason), checked.reason


def test_good_rows_keep_ids_and_empty_documents() -> None:
    assert check_record(0, {"query": "q", "document": "", "id": 3}, ("id", "other")) == PairRow(
        0, "q", "", (3, None))


def test_jsonl_to_parquet_scores_equal_reranker_score_in_input_order(
    tmp_path: Path, tiny_model_dir: Path, fp32: Reranker, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = make_lines(60, bad_every=7)
    (tmp_path / "pairs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    output = tmp_path / "scores.parquet"
    assert run_score("--input", str(tmp_path / "pairs.jsonl"), "--output", str(output),
                     "--model", str(tiny_model_dir), "--shard-rows", "16") == 0
    rows, ids, scores = expected(lines, fp32)
    table = pq.read_table(output)
    assert table.column_names == ["row", "id", "score"]
    assert table.schema.field("score").type == pa.float32()
    assert table.column("row").to_pylist() == rows
    assert table.column("id").to_pylist() == ids
    np.testing.assert_allclose(table.column("score").to_numpy(), scores, rtol=0, atol=1e-5,
                               err_msg="onnxrank score vs Reranker.score on the tiny model")
    bad = [json.loads(line) for line in
           (tmp_path / "scores.bad_rows.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [record["row"] for record in bad] == [row for row in range(60) if row % 7 == 6]
    assert [record["reason"][:12] for record in bad] == [
        BAD_LINES[(row // 7) % len(BAD_LINES)][1][:12] for row in range(60) if row % 7 == 6]
    assert not parts_dir_for(output).exists()
    out = capsys.readouterr().out
    assert re.search(rf"scored {len(rows)} pairs -> .*scores.parquet \(8 bad rows -> ", out), out


def test_parquet_to_jsonl_keeps_parquet_id_types_and_extra_id_columns(
    tmp_path: Path, tiny_model_dir: Path, fp32: Reranker
) -> None:
    records = [{"qid": row // 4, "docid": f"d{row}", "query": QUERIES[row % 3],
                "document": DOCUMENTS[row % len(DOCUMENTS)]} for row in range(23)]
    records[5]["query"] = None  # a null in a Parquet column is a missing field
    pq.write_table(pa.Table.from_pylist(records), tmp_path / "pairs.parquet")
    output = tmp_path / "scores.jsonl"
    assert run_score("--input", str(tmp_path / "pairs.parquet"), "--output", str(output),
                     "--model", str(tiny_model_dir), "--id-columns", "qid,docid",
                     "--bad-rows", str(tmp_path / "bad.jsonl")) == 0
    written = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    good = [row for row in range(23) if row != 5]
    assert [record["row"] for record in written] == good
    assert [(record["qid"], record["docid"]) for record in written] == [
        (row // 4, f"d{row}") for row in good]
    reference = fp32.score([(records[row]["query"], records[row]["document"]) for row in good])
    np.testing.assert_allclose([record["score"] for record in written], reference, atol=1e-5)
    bad = json.loads((tmp_path / "bad.jsonl").read_text(encoding="utf-8"))
    assert (bad["row"], bad["reason"]) == (5, "missing field 'query'")


def test_an_existing_output_needs_overwrite(tmp_path: Path, tiny_model_dir: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pairs.jsonl").write_text("\n".join(make_lines(5)) + "\n", encoding="utf-8")
    output = tmp_path / "scores.jsonl"
    output.write_text("keep me\n", encoding="utf-8")
    argv = ("--input", str(tmp_path / "pairs.jsonl"), "--output", str(output),
            "--model", str(tiny_model_dir))
    assert run_score(*argv) == 2
    assert f"--output {output} already exists; pass --overwrite to replace it" in capsys.readouterr().err
    assert output.read_text(encoding="utf-8") == "keep me\n"
    assert run_score(*argv, "--overwrite") == 0
    assert len(output.read_text(encoding="utf-8").splitlines()) == 5


def test_a_parts_dir_from_other_settings_is_not_resumed(tmp_path: Path, tiny_model_dir: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from onnxrank.scoring.shards import ShardManifest, save_manifest

    (tmp_path / "pairs.jsonl").write_text("\n".join(make_lines(5)) + "\n", encoding="utf-8")
    output = tmp_path / "scores.jsonl"
    parts = parts_dir_for(output)
    parts.mkdir()
    save_manifest(parts, ShardManifest(settings={"input": str((tmp_path / "pairs.jsonl").resolve()),
                                                 "shard_rows": 999}))
    assert run_score("--input", str(tmp_path / "pairs.jsonl"), "--output", str(output),
                     "--model", str(tiny_model_dir)) == 2
    err = capsys.readouterr().err
    assert re.search(r"belongs to an interrupted run with model=None, this run has model=\{", err), err
    assert not output.exists()


def test_flags_are_checked(tmp_path: Path, tiny_model_dir: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "pairs.csv").write_text("q,d\n", encoding="utf-8")
    assert run_score("--input", str(tmp_path / "pairs.csv"), "--output", str(tmp_path / "s.jsonl"),
                     "--model", str(tiny_model_dir)) == 2
    assert ("--input " + str(tmp_path / "pairs.csv") + " has suffix '.csv'; use one of .jsonl, "
            ".ndjson, .json, .parquet, .pq (JSON lines or Parquet)") in capsys.readouterr().err
    assert run_score("--input", str(tmp_path / "pairs.jsonl"), "--output", str(tmp_path / "s.jsonl"),
                     "--id-columns", "id,score") == 2
    assert "--id-columns 'id,score' names ['score']" in capsys.readouterr().err
    assert run_score("--input", "p.jsonl", "--output", "s.jsonl", "--actors", "2") == 2
    assert "--actors 2 applies only with --ray" in capsys.readouterr().err
    assert run_score("--input", "p.jsonl", "--output", "s", "--ray", "--shard-rows", "5") == 2
    assert "--shard-rows does not apply with --ray" in capsys.readouterr().err


def test_progress_bar_counts_every_row_with_pairs_per_second(
    tmp_path: Path, fp32: Reranker, capsys: pytest.CaptureFixture[str]
) -> None:
    from onnxrank.scoring import score_file

    lines = make_lines(30, bad_every=10)
    (tmp_path / "pairs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary = score_file(fp32, tmp_path / "pairs.jsonl", tmp_path / "scores.jsonl", shard_rows=8,
                         show_progress=True)
    assert (summary.rows, summary.scored, summary.bad_rows, summary.shards) == (30, 27, 3, 4)
    final = capsys.readouterr().err.replace("\r", "\n").strip().splitlines()[-1]
    assert re.search(r"scoring: 100%.* 30/30 \[.* pairs/s\]", final), final


def test_flags_have_score_scoped_environment_twins(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pairs.jsonl").write_text("\n".join(make_lines(12)) + "\n", encoding="utf-8")
    monkeypatch.setenv("ONNXRANK_SCORE_INPUT", str(tmp_path / "pairs.jsonl"))
    monkeypatch.setenv("ONNXRANK_SCORE_OUTPUT", str(tmp_path / "scores.jsonl"))
    monkeypatch.setenv("ONNXRANK_SCORE_ID_COLUMNS", "")
    monkeypatch.setenv("ONNXRANK_SCORE_PROGRESS", "false")
    monkeypatch.setenv("ONNXRANK_MODEL", str(tiny_model_dir))
    assert main(["score", "--precision", "fp32"]) == 0
    first = json.loads((tmp_path / "scores.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert sorted(first) == ["row", "score"]
