"""HybridRetriever: modes, hit explanations, filters before truncation, reranking and fallback."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from onnxrank import Reranker
from onnxrank.retrieval import Embedder, Hit, HybridRetriever, Retriever
from onnxrank.retrieval.dense import exact_search


@pytest.fixture()
def retriever(index_dir: Path, bow_embedder: Embedder) -> HybridRetriever:
    opened = HybridRetriever.open(index_dir, embedder=bow_embedder)
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def bow_reranker(bow_reranker_dir: Path) -> Reranker:
    return Reranker.from_dir(bow_reranker_dir, device="cpu", threads=1)


def test_is_a_retriever_and_hits_are_frozen(retriever: HybridRetriever) -> None:
    assert isinstance(retriever, Retriever)
    hit = retriever.search("heat", k=1)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        hit.final_rank = 2  # type: ignore[misc]


def test_vector_mode_equals_exact_cosine_search(retriever: HybridRetriever, bow_embedder: Embedder) -> None:
    query = "heat transfer in hypersonic flow"
    hits = retriever.search(query, k=6, mode="vector")
    exact = exact_search(retriever.store, bow_embedder.embed([query])[0], depth=6)
    assert [hit.dense_rank for hit in hits] == [1, 2, 3, 4, 5, 6]
    assert [hit.dense_score for hit in hits] == pytest.approx([score for _, score in exact], abs=1e-5)
    assert all(hit.lexical_rank is None and hit.rerank_score is None for hit in hits)


def test_hybrid_is_rrf_of_both_lists(retriever: HybridRetriever) -> None:
    query = "heat flow"
    lexical = {hit.chunk_id: hit.lexical_rank for hit in retriever.search(query, k=10, mode="lexical")}
    dense = {hit.chunk_id: hit.dense_rank for hit in retriever.search(query, k=10, mode="vector")}
    hybrid = retriever.search(query, k=10, mode="hybrid")
    oracle = {
        chunk_id: sum(1 / (60 + ranks[chunk_id]) for ranks in (lexical, dense) if chunk_id in ranks)
        for chunk_id in set(lexical) | set(dense)
    }
    assert {hit.chunk_id for hit in hybrid} == set(oracle)
    for hit in hybrid:
        assert (hit.lexical_rank, hit.dense_rank) == (
            lexical.get(hit.chunk_id),
            dense.get(hit.chunk_id),
        )
        assert hit.rrf_score == pytest.approx(oracle[hit.chunk_id], abs=1e-12)
    assert [hit.rrf_score for hit in hybrid] == sorted(oracle.values(), reverse=True)
    assert [hit.final_rank for hit in hybrid] == list(range(1, len(hybrid) + 1))


def test_filters_apply_on_both_sides_before_truncation(retriever: HybridRetriever) -> None:
    # "compiler" is the best match for this query; with k=1 a post-filter would return nothing.
    for mode in ("lexical", "vector", "hybrid"):
        hits = retriever.search(
            "compilers languages construction heat", k=1, mode=mode, filters={"topic": "thermal"}
        )
        assert len(hits) == 1 and hits[0].metadata["topic"] == "thermal", mode
    hits = retriever.search("flow", k=10, mode="vector", filters={"year": {"gte": 1965}})
    assert {hit.source for hit in hits} == {"ablation", "compiler", "sharing"}
    assert retriever.search("flow", k=10, filters={"topic": "none"}) == []


def test_rerank_orders_by_the_reranker(retriever: HybridRetriever, bow_reranker: Reranker) -> None:
    query = "heat flow"
    fused = retriever.search(query, k=6, mode="hybrid")
    reranked = retriever.search(query, k=3, mode="hybrid", rerank=True, reranker=bow_reranker, rerank_top_n=6)
    expected = bow_reranker.rerank(query, [f"{hit.title} {hit.text}" for hit in fused])
    assert [hit.chunk_id for hit in reranked] == [fused[doc.index].chunk_id for doc in expected[:3]]
    assert [hit.rerank_score for hit in reranked] == pytest.approx(
        [doc.score for doc in expected[:3]], abs=1e-6
    )
    assert all(hit.reranked for hit in reranked)
    # Candidates beyond rerank_top_n follow in fused order, unreranked.
    tail = retriever.search(query, k=6, rerank=True, reranker=bow_reranker, rerank_top_n=2)
    assert [hit.reranked for hit in tail] == [True, True, False, False, False, False]
    assert [hit.chunk_id for hit in tail[2:]] == [hit.chunk_id for hit in fused[2:6]]


def test_missing_reranker_falls_back_or_raises(retriever: HybridRetriever) -> None:
    fused = retriever.search("heat flow", k=4)
    fallback = retriever.search("heat flow", k=4, rerank=True, reranker=None, rerank_on_error="fallback")
    assert [hit.chunk_id for hit in fallback] == [hit.chunk_id for hit in fused]
    assert not any(hit.reranked for hit in fallback)
    assert all(hit.rerank_score is None for hit in fallback)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "rerank=True needs a reranker (Reranker.from_dir(...)); pass reranker=..., or "
            "rerank_on_error='fallback' to keep the fused order when none could be loaded"
        ),
    ):
        retriever.search("heat flow", rerank=True)


def test_bad_arguments(retriever: HybridRetriever) -> None:
    with pytest.raises(ValueError, match=re.escape("query must be a non-empty string, got an empty one")):
        retriever.search("  ")
    with pytest.raises(ValueError, match=re.escape("k must be >= 1, got 0")):
        retriever.search("heat", k=0)
    with pytest.raises(
        ValueError, match=re.escape("mode must be one of vector, lexical, hybrid, got 'fuzzy'")
    ):
        retriever.search("heat", mode="fuzzy")  # type: ignore[arg-type]


def test_lexical_mode_needs_no_embedder(index_dir: Path) -> None:
    retriever = HybridRetriever.open(index_dir)
    try:
        hits = retriever.search("heat conduction slabs", k=2, mode="lexical")
        assert hits[0].source == "heat" and hits[0].lexical_rank == 1
        assert retriever._embedder is None
    finally:
        retriever.close()


def test_timings_cover_the_stages_that_ran(retriever: HybridRetriever, bow_reranker: Reranker) -> None:
    result = retriever.search_detailed("heat", k=2, mode="lexical")
    assert result.timings.lexical_ms > 0 and result.timings.dense_ms == 0
    result = retriever.search_detailed("heat", k=2, rerank=True, reranker=bow_reranker)
    assert min(result.timings.lexical_ms, result.timings.dense_ms, result.timings.rerank_ms) > 0
    assert isinstance(result.hits[0], Hit)


def test_large_filtered_sets_use_the_hnsw_filter(
    tmp_path: Path, bow_embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from retrieval_fixtures import write_jsonl

    import onnxrank.retrieval.dense as dense_module
    from onnxrank.retrieval import build_index

    records = [
        {"id": str(i), "title": "", "text": f"word{i} common", "metadata": {"parity": i % 2}}
        for i in range(40)
    ]
    build_index(write_jsonl(tmp_path / "c.jsonl", records), tmp_path / "i", bow_embedder)
    retriever = HybridRetriever.open(tmp_path / "i", embedder=bow_embedder)
    try:
        exact = retriever.search("word3 common", k=5, mode="vector", filters={"parity": 1})
        monkeypatch.setattr(dense_module, "BRUTE_FORCE_MAX_ALLOWED", 0)
        filtered = retriever.search("word3 common", k=5, mode="vector", filters={"parity": 1})
    finally:
        retriever.close()
    assert all(int(hit.source) % 2 == 1 for hit in filtered)
    assert [hit.source for hit in filtered] == [hit.source for hit in exact]
    assert np.allclose([h.dense_score for h in filtered], [h.dense_score for h in exact], atol=1e-5)


def test_moved_embedder_is_found_by_name(tmp_path: Path, bow_embedder_dir: Path) -> None:
    import shutil

    from retrieval_fixtures import CORPUS, write_jsonl

    from onnxrank.retrieval import build_index

    copy = Path(shutil.copytree(bow_embedder_dir, tmp_path / "elsewhere" / "bow-embedder"))
    source = write_jsonl(tmp_path / "c.jsonl", CORPUS)
    build_index(source, tmp_path / "i", Embedder.from_dir(copy, device="cpu", threads=1))
    shutil.rmtree(copy)
    retriever = HybridRetriever.open(tmp_path / "i", models_dir=bow_embedder_dir.parent)
    try:
        assert retriever.search("heat conduction slabs", k=1, mode="vector")[0].source == "heat"
    finally:
        retriever.close()


def test_rerank_deadline_marks_unscored_hits(retriever: HybridRetriever, bow_reranker: Reranker) -> None:
    hits = retriever.search("heat flow", k=6, rerank=True, reranker=bow_reranker, rerank_deadline_ms=0.001)
    assert len(hits) == 6
    assert all((hit.rerank_score is None) == (not hit.reranked) for hit in hits)
    reranked = [hit.rerank_score for hit in hits if hit.reranked]
    assert reranked == sorted(reranked, reverse=True)
    assert [hit.reranked for hit in hits] == sorted((hit.reranked for hit in hits), reverse=True)
