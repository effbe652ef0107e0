"""Metrics against hand-computed values, and the eval runner on a tiny dataset."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from retrieval_fixtures import write_dataset

from onnxrank import Reranker
from onnxrank.engine.embedder import Embedder
from onnxrank.retrieval import HybridRetriever, build_index
from onnxrank.retrieval.eval import (
    NOT_RELEVANCE_NOTE,
    average_precision,
    evaluate,
    evaluate_rankings,
    load_dataset,
    ndcg_at_k,
    recall_at_k,
    reciprocal_rank_at_k,
)

QRELS = {"q1": {"a": 3, "b": 1, "c": 2}, "q2": {"d": 1}, "q3": {"z": 0}}
RANKINGS = {"q1": ["x", "a", "c", "y", "b"], "q2": ["e", "f"], "q3": ["z"]}


def test_single_query_metrics_by_hand() -> None:
    ranking, judged = RANKINGS["q1"], QRELS["q1"]
    # DCG@3 = 0 + (2^3-1)/log2(3) + (2^2-1)/log2(4) = 4.41650 + 1.5; IDCG@3 = 7 + 3/log2(3) + 1/2
    assert ndcg_at_k(ranking, judged, 3) == pytest.approx(5.916508 / 9.392789, abs=1e-6)
    assert reciprocal_rank_at_k(ranking, judged, 3) == 0.5
    assert reciprocal_rank_at_k(ranking, judged, 1) == 0.0
    assert recall_at_k(ranking, judged, 3) == pytest.approx(2 / 3)
    # relevant at ranks 2, 3, 5: (1/2 + 2/3 + 3/5) / 3
    assert average_precision(ranking, judged) == pytest.approx(0.588889, abs=1e-6)
    assert ndcg_at_k(["a", "c", "b"], judged, 3) == pytest.approx(1.0)


def test_means_skip_queries_without_relevant_documents() -> None:
    metrics = evaluate_rankings(RANKINGS, QRELS, k=3)
    assert metrics == pytest.approx(
        {
            "ndcg@3": 0.629900 / 2,
            "mrr@3": 0.25,
            "recall@3": 1 / 3,
            "recall@100": 0.5,
            "map@100": 0.588889 / 2,
            "queries": 2.0,
        },
        abs=1e-6,
    )


def test_evaluate_reports_every_mode(tmp_path: Path, bow_embedder: Embedder, bow_reranker_dir: Path) -> None:
    dataset = load_dataset(write_dataset(tmp_path / "tiny"))
    build_index(dataset.corpus_path, tmp_path / "i", bow_embedder)
    retriever = HybridRetriever.open(tmp_path / "i", embedder=bow_embedder)
    reranker = Reranker.from_dir(bow_reranker_dir, device="cpu", threads=1)
    try:
        report = evaluate(retriever, dataset, reranker=reranker, rerank_top_n=6)
    finally:
        retriever.close()
    assert report.queries == 2
    rows = [(result.mode, result.fusion_label) for result in report.results]
    assert rows == [("vector", ""), ("lexical", ""), ("hybrid", "rrf k=60"), ("hybrid", "convex w=0.5"),
                    ("hybrid+rerank", "rrf k=60"), ("hybrid+rerank", "convex w=0.5")]
    by_mode = {result.mode: result for result in report.results if result.fusion_label != "convex w=0.5"}
    # BM25 puts the judged documents first for both queries: "heat" (grade 2) then "ablation".
    assert by_mode["lexical"].metrics["mrr@10"] == 1.0
    assert by_mode["lexical"].metrics["ndcg@10"] == pytest.approx(1.0)
    assert by_mode["hybrid+rerank"].note == NOT_RELEVANCE_NOTE
    assert by_mode["hybrid+rerank"].latency_ms["rerank"]["p50"] > 0
    assert by_mode["lexical"].latency_ms["dense"] == {"p50": 0.0, "p95": 0.0}
    markdown = report.to_markdown()
    assert f"| {NOT_RELEVANCE_NOTE} |" in markdown
    assert NOT_RELEVANCE_NOTE in report.to_table()
    payload = json.loads(json.dumps(report.to_dict()))
    assert [result["note"] for result in payload["results"]][4:] == [NOT_RELEVANCE_NOTE] * 2
    assert payload["results"][3]["fusion"] == {"fusion": "convex", "rrf_k": 60, "fusion_weight": 0.5}
    # The reranker was passed loaded, so only the embedder side had anything left to load.
    assert set(payload["load_ms"]) == {"embedder_ms", "dense_index_ms", "reranker_ms"}
    assert "| hybrid | convex w=0.5 |" in markdown and "Before the first query: model load" in markdown


def test_eval_errors(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"dataset {tmp_path} has no corpus.jsonl; a dataset directory holds corpus.jsonl, "
            "queries.jsonl and qrels.tsv"
        ),
    ):
        load_dataset(tmp_path)
