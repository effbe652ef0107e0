"""HybridRetriever.search with every backend, and the two degradations issue 14 names."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from fake_servers import FakeServer, overlap_score

from onnxrank.rerankers import CohereReranker, LLMReranker, make_reranker
from onnxrank.retrieval import HybridRetriever


@pytest.fixture()
def retriever(index_dir: Path) -> HybridRetriever:
    opened = HybridRetriever.open(index_dir)
    yield opened
    opened.close()


QUERY = "heat transfer flow"


def test_cohere_backend_orders_the_candidates(retriever: HybridRetriever, cohere_server: FakeServer) -> None:
    fused = retriever.search(QUERY, k=6)
    backend = CohereReranker(model="m", base_url=cohere_server.url, api_key="k")
    hits = retriever.search(QUERY, k=3, rerank=True, reranker=backend, rerank_top_n=6)
    scores = [overlap_score(QUERY, f"{hit.title} {hit.text}") for hit in fused]
    expected = sorted(range(6), key=lambda index: (-scores[index], index))[:3]
    assert [hit.chunk_id for hit in hits] == [fused[index].chunk_id for index in expected]
    assert all(hit.reranked and hit.reranker == "cohere" for hit in hits)
    assert cohere_server.requests[0]["documents"] == [f"{hit.title} {hit.text}" for hit in fused]


def test_llm_backend_orders_the_candidates(retriever: HybridRetriever, chat_server: FakeServer) -> None:
    fused = retriever.search(QUERY, k=6)
    backend = LLMReranker(model="m", base_url=chat_server.url + "/v1")
    hits = retriever.search(QUERY, k=6, rerank=True, reranker=backend, rerank_top_n=6)
    ratings = [round(10 * overlap_score(QUERY, f"{hit.title} {hit.text}")) for hit in fused]
    expected = sorted(range(6), key=lambda index: (-ratings[index], index))
    assert [hit.chunk_id for hit in hits] == [fused[index].chunk_id for index in expected]
    assert [hit.rerank_score for hit in hits] == [ratings[index] for index in expected]


@pytest.mark.parametrize("case", ["cohere without a key", "llm at a closed port"])
def test_unavailable_backends_return_the_fused_order_flagged(
    retriever: HybridRetriever, closed_port: int, caplog: pytest.LogCaptureFixture, case: str
) -> None:
    timeout_s = 2.0
    if case == "cohere without a key":
        backend = make_reranker("cohere", base_url=f"http://127.0.0.1:{closed_port}", timeout_s=timeout_s)
    else:
        backend = make_reranker("llm", model="m", base_url=f"http://127.0.0.1:{closed_port}/v1",
                                timeout_s=timeout_s)
    fused = retriever.search(QUERY, k=5)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING):
        results = [retriever.search_detailed(QUERY, k=5, rerank=True, reranker=backend) for _ in range(2)]
    assert time.monotonic() - started < 2 * timeout_s
    for result in results:
        assert [hit.chunk_id for hit in result.hits] == [hit.chunk_id for hit in fused]
        assert not any(hit.reranked for hit in result.hits)
        assert "did not score any candidate" in result.notes[-1]
    assert len([record for record in caplog.records if record.levelno == logging.WARNING]) == 1


def test_backend_by_name(retriever: HybridRetriever) -> None:
    fused = retriever.search(QUERY, k=4)
    result = retriever.search_detailed(QUERY, k=4, rerank=True, reranker="none")
    assert [hit.chunk_id for hit in result.hits] == [hit.chunk_id for hit in fused]
    assert result.reranker == "none" and result.notes == ()
