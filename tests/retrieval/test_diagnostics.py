"""`onnxrank diagnose` and the diagnostics library on the tiny bag-of-words models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from retrieval_fixtures import loads_come_first, write_jsonl, write_model_dir

from onnxrank import Reranker
from onnxrank.cli import main
from onnxrank.retrieval import HybridRetriever
from onnxrank.retrieval.diagnostics import diagnose, load_queries

QUERIES = [
    {"id": "q1", "text": "heat conduction in slabs"},
    {"id": "q2", "text": "operating system time sharing"},
    {"id": "q3", "text": "flow past a plate"},
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture()
def queries_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "queries.jsonl", QUERIES)


def test_cli_writes_the_report_and_both_plots(
    tmp_path: Path, index_dir: Path, bow_reranker_dir: Path, queries_file: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "report"
    argv = ["diagnose", "--index", str(index_dir), "--queries", str(queries_file), "--out", str(out),
            "--model", str(bow_reranker_dir), "--rerank-top-n", "6"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    warning = "WARNING: reranker 'bow-reranker' is not relevance-trained"
    assert warning in printed
    for name in ("rerank_scores.png", "score_vs_length.png"):
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
    report = json.loads((out / "report.json").read_text())
    assert report["warning"].startswith(warning) and report["relevance_trained"] is False
    assert warning in (out / "report.md").read_text()
    assert [query["query_id"] for query in report["queries"]] == ["q1", "q2", "q3"]
    assert report["summary"]["scored_candidates"] == 18  # 3 queries x 6 candidates


def test_models_load_before_the_timed_stages(
    tmp_path: Path, index_dir: Path, bow_reranker_dir: Path, queries_file: Path, load_events: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "report"
    argv = ["diagnose", "--index", str(index_dir), "--queries", str(queries_file), "--out", str(out),
            "--model", str(bow_reranker_dir), "--rerank-top-n", "6", "--fusion", "convex"]
    assert main(argv) == 0
    assert load_events[:2] == ["load embedder", "load reranker"] and loads_come_first(load_events)
    assert load_events.count("rerank stage") == len(QUERIES)
    report = json.loads((out / "report.json").read_text())
    assert set(report["load_ms"]) == {"embedder_ms", "dense_index_ms", "reranker_ms"}
    assert report["fusion"]["fusion"] == "convex"
    assert set(report["queries"][0]["stage_ms"]) == {"lexical", "dense", "fusion", "rerank", "total"}
    assert "Before the first query: model load " in (out / "report.md").read_text()
    assert "(model load " in capsys.readouterr().out


def test_figures_match_an_independent_computation(index_dir: Path, bow_reranker_dir: Path) -> None:
    reranker = Reranker.from_dir(bow_reranker_dir, device="cpu", threads=1)
    retriever = HybridRetriever.open(index_dir)
    try:
        diagnosis = diagnose(retriever, [(q["id"], q["text"]) for q in QUERIES], reranker, rerank_top_n=6)
        for query in diagnosis.queries:
            fused = retriever.search(query.query, k=10)
            passages = [f"{hit.title} {hit.text}" for hit in fused]
            scores = reranker.score([(query.query, passage) for passage in passages])
            order = sorted(range(len(fused)), key=lambda index: (-scores[index], index))
            assert query.fused == [hit.chunk_id for hit in fused]
            assert query.reranked == [fused[index].chunk_id for index in order]
            assert query.overlap == len(set(query.fused) & set(query.reranked)) / 10
            assert query.top1_changed == (query.fused[0] != query.reranked[0])
    finally:
        retriever.close()
    summary = diagnosis.summary()
    lengths, scores = np.asarray(diagnosis.lengths, float), np.asarray(diagnosis.scores, float)
    assert summary["length_score_pearson"] == pytest.approx(np.corrcoef(lengths, scores)[0, 1])
    assert summary["top1_changed"] == sum(query.top1_changed for query in diagnosis.queries)


def test_a_relevance_trained_model_carries_no_warning(
    tmp_path: Path, index_dir: Path, queries_file: Path
) -> None:
    trained = write_model_dir(tmp_path / "trained", task="rerank", name="trained", relevance_trained=True)
    out = tmp_path / "report"
    assert main(["diagnose", "--index", str(index_dir), "--queries", str(queries_file), "--out", str(out),
                 "--model", str(trained)]) == 0
    assert json.loads((out / "report.json").read_text())["warning"] is None
    assert "not relevance-trained" not in (out / "report.md").read_text()


def test_an_unavailable_backend_is_reported(tmp_path: Path, index_dir: Path, queries_file: Path) -> None:
    out = tmp_path / "report"
    assert main(["diagnose", "--index", str(index_dir), "--queries", str(queries_file), "--out", str(out),
                 "--model", "absent", "--models-dir", str(tmp_path)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["scored_candidates"] == 0
    assert report["summary"]["mean_overlap_at_10"] is None
    assert "scored nothing on 3 of 3 queries" in report["notes"][0]
    assert (out / "rerank_scores.png").read_bytes()[:8] == PNG_MAGIC


def test_load_queries(tmp_path: Path) -> None:
    text = tmp_path / "q.txt"
    text.write_text("first query\n\nsecond query\n")
    assert load_queries(text) == [("1", "first query"), ("2", "second query")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1: each line must be a JSON object with id and text"):
        load_queries(bad)
