"""/v1/search reranks through the rerank model's queue: concurrent searches share one engine run
with each other and with /v1/rerank requests, the rerank-stage deadline falls back to the fused
order, and a full queue answers 429. The rerank engine is held at a gate (GatedEngine) so that
what waits behind it is known."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from conftest import EMBED_ID, RERANK_ID
from serve_helpers import (
    WAIT_S,
    GatedEngine,
    RunningServer,
    assert_same_searches,
    poll,
    running_server,
)

from onnxrank.engine.embedder import Embedder
from onnxrank.engine.reranker import Reranker
from onnxrank.retrieval import HybridRetriever
from onnxrank.serve import ServeConfig

RERANK_BODY = {"query": "heat transfer", "documents": ["heat conduction in slabs", "wing lift"]}
# Eight different searches, each reranking its fused top 4.
SEARCH_QUERIES = ["heat transfer", "wing in a slipstream", "shear flow over a plate",
                  "operating systems and compilers", "ablation heat", "heat flow past a plate",
                  "boundary conditions", "propeller lift"]
TOP_N = 4


@pytest.fixture
def gated(bow_rerank_engine: Reranker) -> Iterator[GatedEngine]:
    engine = GatedEngine(bow_rerank_engine)
    yield engine
    engine.gate.set()  # never leave a worker waiting


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=10) as executor:
        yield executor


def serving(gated: GatedEngine, embedder: Embedder, retriever: HybridRetriever,
            config: ServeConfig) -> Any:
    return running_server({RERANK_ID: gated, EMBED_ID: embedder}, config, retriever=retriever)


def post(server: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(base_url=server.base_url, timeout=WAIT_S) as client:
        return client.post(path, json=body)


def hold_the_worker(server: RunningServer, gated: GatedEngine,
                    pool: ThreadPoolExecutor) -> Any:
    """Close the gate and send a rerank request; return once the worker is held inside its run."""
    entered = gated.runs_entered
    gated.gate.clear()
    held = pool.submit(post, server, "/v1/rerank", RERANK_BODY)
    poll(lambda: gated.runs_entered > entered, "the worker to take the rerank request")
    return held


def search_body(query: str, **extra: Any) -> dict[str, Any]:
    return {"query": query, "k": 3, "rerank": True, "rerank_top_n": TOP_N, **extra}


def test_concurrent_searches_share_one_engine_run(
    gated: GatedEngine, bow_rerank_engine: Reranker, bow_embed_engine: Embedder,
    retriever: HybridRetriever, pool: ThreadPoolExecutor,
) -> None:
    expected = [retriever.search_detailed(
        query, k=3, rerank=True, rerank_top_n=TOP_N, reranker=bow_rerank_engine).to_dict()
        for query in SEARCH_QUERIES]
    with serving(gated, bow_embed_engine, retriever, ServeConfig(port=0)) as server:
        runs_before = server.metric("onnxrank_engine_runs_total", model=RERANK_ID)
        held = hold_the_worker(server, gated, pool)
        searches = [pool.submit(post, server, "/v1/search", search_body(query))
                    for query in SEARCH_QUERIES]
        # Every search's rerank stage waits in the rerank model's queue, behind the held run.
        poll(lambda: server.metric("onnxrank_queue_depth", model=RERANK_ID) == len(searches),
             "every search's rerank job to queue")
        gated.gate.set()
        assert held.result(WAIT_S).status_code == 200
        answers = [future.result(WAIT_S) for future in searches]
        assert [answer.status_code for answer in answers] == [200] * len(searches)
        assert_same_searches([answer.json() for answer in answers], expected)
        assert all(hit["reranked"] for answer in answers for hit in answer.json()["results"])
        # The held run, then one run for all eight searches.
        assert server.metric("onnxrank_engine_runs_total", model=RERANK_ID) - runs_before == 2
        assert server.metric("onnxrank_engine_run_requests_bucket", model=RERANK_ID,
                             le="8.0") - server.metric("onnxrank_engine_run_requests_bucket",
                                                       model=RERANK_ID, le="6.0") == 1
        assert server.metric("onnxrank_pairs_scored_total", model=RERANK_ID) == (
            len(RERANK_BODY["documents"]) + TOP_N * len(searches))


def test_search_deadline_keeps_the_fused_order(
    gated: GatedEngine, bow_embed_engine: Embedder, retriever: HybridRetriever,
    pool: ThreadPoolExecutor,
) -> None:
    fused = retriever.search_detailed("heat transfer", k=3).to_dict()
    with serving(gated, bow_embed_engine, retriever, ServeConfig(port=0)) as server:
        held = hold_the_worker(server, gated, pool)
        response = post(server, "/v1/search", search_body("heat transfer", deadline_ms=150))
        gated.gate.set()
        assert held.result(WAIT_S).status_code == 200
        assert response.status_code == 200, response.text
        answer = response.json()
        assert [hit["chunk_id"] for hit in answer["results"]] == [
            hit["chunk_id"] for hit in fused["results"]]
        assert [(hit["reranked"], hit["rerank_score"]) for hit in answer["results"]] == [
            (False, None)] * len(fused["results"])
        assert (f"note: 0 of {TOP_N} candidates were reranked within the deadline (150 ms); the "
                "rest keep the fused order (reranked=false)") in answer["notes"]
        assert server.metric("onnxrank_requests_dropped_total", model=RERANK_ID,
                             reason="deadline") == 1
        # The search's pairs never reached the engine.
        assert server.metric("onnxrank_pairs_scored_total", model=RERANK_ID) == len(
            RERANK_BODY["documents"])


def test_search_gets_429_when_the_rerank_queue_is_full(
    gated: GatedEngine, bow_embed_engine: Embedder, retriever: HybridRetriever,
    pool: ThreadPoolExecutor,
) -> None:
    with serving(gated, bow_embed_engine, retriever, ServeConfig(port=0, max_queue=1)) as server:
        held = hold_the_worker(server, gated, pool)
        waiting = pool.submit(post, server, "/v1/rerank", RERANK_BODY)
        poll(lambda: server.metric("onnxrank_queue_depth", model=RERANK_ID) == 1,
             "a rerank request to fill the queue")
        refused = post(server, "/v1/search", search_body("heat transfer"))
        gated.gate.set()
        assert [future.result(WAIT_S).status_code for future in (held, waiting)] == [200, 200]
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json() == {"error": {
            "message": "the server is overloaded: 1 requests are already waiting (--max-queue); "
                       f"retry after {refused.headers['retry-after']} s",
            "type": "rate_limit_error", "param": None, "code": None}}
        # Without rerank the same search does not need the queue.
        assert post(server, "/v1/search", {"query": "heat transfer", "k": 3}).status_code == 200
