"""The embedding endpoints through the same queue and worker as rerank: merged runs, 429 with
Retry-After, deadlines and disconnected clients, each answered in its dialect's shape and counted
in the model's metrics. The engine is held with a gate (serve_helpers.GatedEmbedder), so what
queues behind a run is deterministic; nothing about embedding is replaced."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from conftest import EMBED_ID
from serve_helpers import WAIT_S, GatedEmbedder, RunningServer, poll, running_server

from onnxrank.engine.embedder import Embedder
from onnxrank.serve import ServeConfig

TEXTS = ["heat conduction in composite slabs", "a wing in a propeller slipstream", "paging"]


@pytest.fixture
def gated(bow_embed_engine: Embedder) -> GatedEmbedder:
    return GatedEmbedder(bow_embed_engine)


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=8) as executor:
        yield executor


def post(server: RunningServer, path: str, body: dict, **kwargs: object) -> httpx.Response:
    with httpx.Client(base_url=server.base_url, timeout=WAIT_S) as client:
        return client.post(path, json=body, **kwargs)


def hold_first_run(server: RunningServer, gated: GatedEmbedder,
                   pool: ThreadPoolExecutor) -> Future[httpx.Response]:
    """Close the gate and send one request; return once the worker is inside its run, held."""
    entered = gated.runs_entered
    gated.gate.clear()
    future = pool.submit(post, server, "/embed", {"inputs": TEXTS})
    poll(lambda: gated.runs_entered > entered, "the worker to take the first request")
    return future


def depth(server: RunningServer) -> float:
    return server.metric("onnxrank_queue_depth", model=EMBED_ID)


def test_waiting_requests_merge_into_one_run(gated: GatedEmbedder, pool: ThreadPoolExecutor,
                                             bow_embed_engine: Embedder) -> None:
    with running_server({EMBED_ID: gated}, ServeConfig(port=0)) as server:
        first = hold_first_run(server, gated, pool)
        openai_style = pool.submit(post, server, "/v1/embeddings", {"input": TEXTS[:2]})
        tei_style = pool.submit(post, server, "/embed", {"inputs": TEXTS[2]})
        poll(lambda: depth(server) == 2, "two requests queued")
        gated.gate.set()
        assert first.result(WAIT_S).status_code == 200
        merged = [openai_style.result(WAIT_S), tei_style.result(WAIT_S)]
        assert [response.headers["x-onnxrank-batch-requests"] for response in merged] == ["2", "2"]
        assert [response.headers["x-onnxrank-batch-texts"] for response in merged] == ["3", "3"]
        vectors = [item["embedding"] for item in merged[0].json()["data"]] + merged[1].json()
        # A merged fp32 run gives each text the embedder's own vector (rows are independent).
        np.testing.assert_allclose(np.asarray(vectors, dtype=np.float32),
                                   bow_embed_engine.embed(TEXTS), atol=1e-6, rtol=0)
        assert server.metric("onnxrank_engine_runs_total", model=EMBED_ID) == 2
        assert server.metric("onnxrank_texts_embedded_total", model=EMBED_ID) == 2 * len(TEXTS)


def test_full_queue_answers_429_in_each_shape(gated: GatedEmbedder,
                                              pool: ThreadPoolExecutor) -> None:
    with running_server({EMBED_ID: gated}, ServeConfig(port=0, max_queue=2)) as server:
        first = hold_first_run(server, gated, pool)
        waiting = [pool.submit(post, server, "/embed", {"inputs": TEXTS}) for _ in range(2)]
        poll(lambda: depth(server) == 2, "two requests queued")
        openai_429 = post(server, "/v1/embeddings", {"input": TEXTS})
        tei_429 = post(server, "/embed", {"inputs": TEXTS})
        assert openai_429.status_code == tei_429.status_code == 429
        assert int(openai_429.headers["retry-after"]) >= 1
        error = openai_429.json()["error"]
        assert error["type"] == "rate_limit_error"
        assert error["message"].startswith("the server is overloaded: 2 requests are already "
                                           "waiting (--max-queue); retry after ")
        assert tei_429.json()["error_type"] == "Overloaded"
        gated.gate.set()
        assert [future.result(WAIT_S).status_code for future in [first, *waiting]] == [200] * 3
        assert server.metric("onnxrank_texts_embedded_total", model=EMBED_ID) == 3 * len(TEXTS)


def test_deadline_and_disconnect_drop_before_the_engine(gated: GatedEmbedder,
                                                        pool: ThreadPoolExecutor) -> None:
    with running_server({EMBED_ID: gated}, ServeConfig(port=0)) as server:
        first = hold_first_run(server, gated, pool)
        late = post(server, "/v1/embeddings", {"input": TEXTS, "deadline_ms": 150})
        assert (late.status_code, late.json()["error"]["message"]) == (
            503, "the deadline of 150 ms passed before the texts were embedded")
        late_tei = post(server, "/embed", {"inputs": TEXTS}, headers={"X-Deadline-Ms": "100"})
        assert (late_tei.status_code, late_tei.json()["error_type"]) == (503, "Unhealthy")
        with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=server.base_url,
                                                            timeout=0.3) as impatient:
            impatient.post("/embed", json={"inputs": TEXTS})
        poll(lambda: server.metric("onnxrank_requests_dropped_total", model=EMBED_ID,
                                   reason="client_disconnected") == 1, "the disconnect")
        fallback = post(server, "/embed", {"inputs": TEXTS, "on_deadline": "fallback"})
        assert (fallback.status_code, fallback.json()["error"]) == (422, (
            "field `on_deadline` \"fallback\" applies to the rerank endpoints only (an embedding "
            "has no order to fall back to); omit it"))
        gated.gate.set()
        assert first.result(WAIT_S).status_code == 200
        assert server.metric("onnxrank_requests_dropped_total", model=EMBED_ID,
                             reason="deadline") == 2
        poll(lambda: server.metric("onnxrank_engine_runs_total", model=EMBED_ID) == 1,
             "the held run to finish")
        # Only the held request reached the engine.
        assert server.metric("onnxrank_texts_embedded_total", model=EMBED_ID) == len(TEXTS)
        assert server.metric("onnxrank_requests_total", endpoint="/embed", status="499") == 1
