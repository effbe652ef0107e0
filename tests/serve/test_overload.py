"""Queueing under load: 429 with Retry-After, deadlines, disconnected clients, cross-request
batching, and exactly one answer per request. The engine worker is held at a gate (see
conftest.GatedEngine) so that what waits behind it is known."""

from __future__ import annotations

import socket
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
from serve_helpers import DOCUMENTS, MODEL, QUERY, WAIT_S, GatedEngine, RunningServer, poll, running_server

from onnxrank.engine.reranker import Reranker
from onnxrank.errors import InferenceError
from onnxrank.serve import ServeConfig

REQUESTS = [
    (QUERY, DOCUMENTS),
    ("boundary layer transition", DOCUMENTS[1:5]),
    ("heat transfer in hypersonic flow", DOCUMENTS[2:]),
    ("shell buckling", DOCUMENTS[::-1]),
]


@pytest.fixture
def gated(fp32_reranker: Reranker) -> Iterator[GatedEngine]:
    engine = GatedEngine(fp32_reranker)
    yield engine
    engine.gate.set()  # never leave a worker waiting


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=16) as executor:
        yield executor


def post(server: RunningServer, path: str, body: dict, **kwargs: object) -> httpx.Response:
    with httpx.Client(base_url=server.base_url, timeout=WAIT_S) as client:
        return client.post(path, json=body, **kwargs)


def hold_first_run(server: RunningServer, gated: GatedEngine, pool: ThreadPoolExecutor,
                   body: dict) -> Future[httpx.Response]:
    """Close the gate and send `body`; return once the worker is inside its run, held."""
    entered = gated.runs_entered
    gated.gate.clear()
    future = pool.submit(post, server, "/v1/rerank", body)
    poll(lambda: gated.runs_entered > entered, "the worker to take the first request")
    return future


def queue_depth(server: RunningServer) -> float:
    return server.metric("onnxrank_queue_depth")


def test_full_queue_answers_429_with_retry_after(gated: GatedEngine,
                                                 pool: ThreadPoolExecutor) -> None:
    with running_server(gated, ServeConfig(port=0, max_queue=2)) as server:
        first = hold_first_run(server, gated, pool, {"query": QUERY, "documents": DOCUMENTS})
        waiting = [pool.submit(post, server, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS})
                   for _ in range(2)]
        poll(lambda: queue_depth(server) == 2, "two requests queued")
        cohere_429 = post(server, "/v2/rerank", {"model": MODEL, "query": QUERY,
                                                 "documents": DOCUMENTS})
        tei_429 = post(server, "/rerank", {"query": QUERY, "texts": DOCUMENTS})
        assert cohere_429.status_code == tei_429.status_code == 429
        assert int(cohere_429.headers["retry-after"]) >= 1
        assert int(tei_429.headers["retry-after"]) >= 1
        assert "2 requests are already waiting (--max-queue)" in cohere_429.json()["message"]
        assert tei_429.json()["error_type"] == "Overloaded"
        gated.gate.set()
        assert [future.result(WAIT_S).status_code for future in [first, *waiting]] == [200] * 3
        assert server.metric("onnxrank_requests_total", status="429") == 2
        # Nothing refused ever reached the engine.
        assert server.metric("onnxrank_pairs_scored_total") == 3 * len(DOCUMENTS)


def test_deadline_passed_while_waiting(gated: GatedEngine, pool: ThreadPoolExecutor) -> None:
    with running_server(gated, ServeConfig(port=0)) as server:
        first = hold_first_run(server, gated, pool, {"query": QUERY, "documents": DOCUMENTS})
        late = post(server, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS,
                                           "deadline_ms": 200})
        assert late.status_code == 503
        assert late.json()["message"].startswith("the deadline of 200 ms passed before the "
                                                 "request was scored")
        fallback = post(server, "/v2/rerank", {"model": MODEL, "query": QUERY, "documents": DOCUMENTS,
                                               "top_n": 3},
                        headers={"X-Deadline-Ms": "150", "X-On-Deadline": "fallback"})
        assert fallback.status_code == 200
        assert fallback.headers["x-onnxrank-reranked"] == "false"
        body = fallback.json()
        assert [item["index"] for item in body["results"]] == [0, 1, 2]  # retrieval order
        assert all(item["reranked"] is False for item in body["results"])
        assert any("NOT reranked" in warning for warning in body["meta"]["warnings"])
        tei = post(server, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "deadline_ms": 100,
                                       "on_deadline": "fallback"})
        assert [item["index"] for item in tei.json()] == list(range(len(DOCUMENTS)))
        assert server.metric("onnxrank_requests_dropped_total", reason="deadline") == 3
        gated.gate.set()
        assert first.result(WAIT_S).status_code == 200
        # The three late requests were dropped before the engine: only the first was scored.
        poll(lambda: server.metric("onnxrank_engine_runs_total") == 1, "the held run to finish")
        assert server.metric("onnxrank_pairs_scored_total") == len(DOCUMENTS)


def test_deadline_that_cannot_be_met_is_answered_at_arrival(gated: GatedEngine,
                                                            pool: ThreadPoolExecutor) -> None:
    with running_server(gated, ServeConfig(port=0)) as server:
        # A first run held for at least held_s makes the server's pairs/s at most
        # len(DOCUMENTS) / held_s, so a request of as many pairs is estimated at >= held_s.
        held_s = 0.5
        first = hold_first_run(server, gated, pool, {"query": QUERY, "documents": DOCUMENTS})
        threading.Event().wait(held_s)
        gated.gate.set()
        assert first.result(WAIT_S).status_code == 200
        runs = gated.runs_entered
        hopeless = post(server, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS,
                                               "deadline_ms": 100})
        assert hopeless.status_code == 503
        message = hopeless.json()["message"]
        assert message.startswith("the requests ahead of this one would take about ")
        assert "longer than its deadline allows (100 ms)" in message
        fallback = post(server, "/rerank", {"query": QUERY, "texts": DOCUMENTS,
                                            "deadline_ms": 100, "on_deadline": "fallback"})
        assert fallback.status_code == 200
        assert fallback.headers["x-onnxrank-reranked"] == "false"
        assert [item["index"] for item in fallback.json()] == list(range(len(DOCUMENTS)))
        assert gated.runs_entered == runs  # neither reached the engine
        assert server.metric("onnxrank_requests_dropped_total",
                             reason="deadline_unreachable") == 2
        # A deadline the estimate fits is queued and scored.
        patient = post(server, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS,
                                              "deadline_ms": 20_000})
        assert patient.status_code == 200
        assert server.metric("onnxrank_pairs_scored_total") == 2 * len(DOCUMENTS)


def raw_request(server: RunningServer, body: bytes) -> socket.socket:
    """A connection with one POST /v1/rerank sent on it, asking the server to close it after
    the answer (the caller closes it too)."""
    host, port = server.base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=WAIT_S)
    sock.sendall(b"POST /v1/rerank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: " + str(len(body)).encode()
                 + b"\r\n\r\n" + body)
    return sock


def test_disconnected_client_is_dropped_before_the_engine(gated: GatedEngine,
                                                          pool: ThreadPoolExecutor) -> None:
    with running_server(gated, ServeConfig(port=0)) as server:
        first = hold_first_run(server, gated, pool, {"query": QUERY, "documents": DOCUMENTS})
        sock = raw_request(server, b'{"query": "gone", "documents": ["a", "b", "c"]}')
        poll(lambda: queue_depth(server) == 1, "the request to queue")
        sock.close()  # the client leaves while its request waits
        poll(lambda: server.metric("onnxrank_requests_dropped_total",
                                   reason="client_disconnected") == 1, "the drop to be counted")
        assert queue_depth(server) == 0
        gated.gate.set()
        assert first.result(WAIT_S).status_code == 200
        poll(lambda: server.metric("onnxrank_engine_runs_total") == 1, "the held run to finish")
        # Only the first request's pairs reached the engine.
        assert server.metric("onnxrank_pairs_scored_total") == len(DOCUMENTS)
        assert server.metric("onnxrank_requests_total", status="499") == 1


@pytest.mark.parametrize("batching", [True, False], ids=["batching", "no_batching"])
def test_concurrent_requests_share_one_engine_run(gated: GatedEngine, pool: ThreadPoolExecutor,
                                                  fp32_reranker: Reranker, batching: bool) -> None:
    expected = {query: fp32_reranker.score([(query, document) for document in documents])
                for query, documents in REQUESTS}
    with running_server(gated, ServeConfig(port=0, batching=batching)) as server:
        first = hold_first_run(server, gated, pool, {"query": QUERY, "documents": DOCUMENTS})
        mates = {query: pool.submit(post, server, "/rerank",
                                    {"query": query, "texts": list(documents), "raw_scores": True})
                 for query, documents in REQUESTS[1:]}
        poll(lambda: queue_depth(server) == len(mates), "the batch mates to queue")
        gated.gate.set()
        assert first.result(WAIT_S).status_code == 200
        for query, future in mates.items():
            response = future.result(WAIT_S)
            assert response.status_code == 200
            assert response.headers["x-onnxrank-batch-requests"] == (
                str(len(mates)) if batching else "1")
            scores = np.zeros(len(expected[query]))
            for item in response.json():
                scores[item["index"]] = item["score"]
            # fp32: a request's scores do not depend on its batch mates beyond float rounding
            # of a different padded length (the engine's own batch-invariance tolerance).
            np.testing.assert_allclose(scores, expected[query], atol=1e-5, rtol=0)
        runs = server.metric("onnxrank_engine_runs_total")
        assert runs == (2 if batching else 1 + len(mates))
        assert server.metric("onnxrank_engine_run_requests_sum") == 1 + len(mates)
        assert server.metric("onnxrank_engine_run_requests_bucket", le="1.0") == (
            1 if batching else 1 + len(mates))


def test_every_request_gets_exactly_one_answer(fp32_reranker: Reranker,
                                               pool: ThreadPoolExecutor) -> None:
    total = 64
    bodies = [("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS}),
              ("/v2/rerank", {"model": MODEL, "query": QUERY, "documents": DOCUMENTS[:3]}),
              ("/rerank", {"query": QUERY, "texts": DOCUMENTS[2:]})]
    with running_server(fp32_reranker, ServeConfig(port=0, max_queue=4)) as server:
        futures = [pool.submit(post, server, *bodies[index % len(bodies)]) for index in range(total)]
        statuses = Counter(future.result(WAIT_S).status_code for future in futures)
        assert sum(statuses.values()) == total
        assert set(statuses) <= {200, 429}, statuses
        counted = {status: sum(server.metric("onnxrank_requests_total", endpoint=path,
                                             status=str(status)) for path, _ in bodies)
                   for status in (200, 429)}
        assert counted == {status: statuses.get(status, 0) for status in (200, 429)}


def test_requests_while_the_server_is_held_are_not_lost(gated: GatedEngine,
                                                        pool: ThreadPoolExecutor) -> None:
    # A connection that is accepted is answered: a raw socket sees exactly one HTTP response.
    with running_server(gated, ServeConfig(port=0)) as server:
        first = hold_first_run(server, gated, pool, {"query": QUERY, "documents": DOCUMENTS})
        received = bytearray()
        done = threading.Event()

        def talk() -> None:
            with raw_request(server, b'{"query": "q", "documents": ["a", "b"]}') as sock:
                while chunk := sock.recv(65536):  # until the server closes the connection
                    received.extend(chunk)
            done.set()

        thread = threading.Thread(target=talk, daemon=True)
        thread.start()
        poll(lambda: queue_depth(server) == 1, "the raw request to queue")
        gated.gate.set()
        assert done.wait(WAIT_S)
        thread.join(WAIT_S)
        assert first.result(WAIT_S).status_code == 200
        assert received.count(b"HTTP/1.1 ") == 1 and received.startswith(b"HTTP/1.1 200")


class PoisonEngine(GatedEngine):
    """The real engine, failing as onnxruntime would on any run that holds the query "poison"."""

    def score_detailed(self, pairs: Sequence[tuple[str, str]], *,
                       instruction: str | None = None) -> Any:
        if any(query == "poison" for query, _ in pairs):
            self.gate.wait(WAIT_S)
            raise InferenceError("the model produced a non-finite score for input pair 0")
        return super().score_detailed(pairs, instruction=instruction)


def test_an_engine_error_is_answered_in_each_shape_and_spares_batch_mates(
    fp32_reranker: Reranker, pool: ThreadPoolExecutor,
) -> None:
    engine = PoisonEngine(fp32_reranker)
    try:
        with running_server(engine, ServeConfig(port=0)) as server:
            first = hold_first_run(server, engine, pool, {"query": QUERY, "documents": DOCUMENTS})
            poisoned = pool.submit(post, server, "/rerank", {"query": "poison", "texts": ["a"]})
            healthy = pool.submit(post, server, "/v2/rerank",
                                  {"model": MODEL, "query": QUERY, "documents": DOCUMENTS[:2]})
            poll(lambda: queue_depth(server) == 2, "both requests to queue")
            engine.gate.set()
            assert first.result(WAIT_S).status_code == 200
            assert healthy.result(WAIT_S).status_code == 200  # its batch mate failed, it did not
            failed = poisoned.result(WAIT_S)
            assert failed.status_code == 424  # TEI's status for a backend error
            assert failed.json() == {
                "error": "inference failed: the model produced a non-finite score for input pair 0",
                "error_type": "Backend"}
            alone = post(server, "/v1/rerank", {"query": "poison", "documents": ["a"]})
            assert alone.status_code == 500
            assert set(alone.json()) == {"message"}
            # The worker is still there.
            assert post(server, "/v1/rerank", {"query": QUERY, "documents": ["a"]}).status_code == 200
    finally:
        engine.gate.set()
