"""Helpers of the server tests: a real server on 127.0.0.1 (uvicorn in a thread, an ephemeral
port), polling with a timeout, and an engine a test can hold.

`GatedEngine` is the real Reranker with a gate in front of ``score_detailed`` (`GatedEmbedder`:
the real Embedder, a gate in front of ``embed_detailed``): a test closes
the gate to hold the engine worker inside a run, so that what queues behind it (429s, deadlines,
disconnects, merging) is deterministic. Nothing about scoring is replaced.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from onnxrank.engine.embedder import Embedder
from onnxrank.engine.reranker import Reranker
from onnxrank.serve import ServeConfig, create_app

WAIT_S = 30.0  # upper bound of every poll in these tests
POLL_S = 0.01


def without_timings(payload: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in payload.items() if key != "timings_ms"}


def split_rerank_scores(payload: dict[str, Any]) -> tuple[dict[str, Any], list[float]]:
    """A search answer without its timings and rerank scores, and those scores (a hit without
    one keeps its None in the answer).

    A search merged with others into one engine run may have its rows padded to a longer length
    (OpenVINO's planner pads rows into fewer runs), which moves a float score in its last digits:
    compare the rest exactly and the scores with a tolerance.
    """
    hits = payload["results"]
    scored = [hit.get("rerank_score") is not None for hit in hits]
    rest = {**without_timings(payload), "results": [
        {key: value for key, value in hit.items() if not (key == "rerank_score" and has_score)}
        for hit, has_score in zip(hits, scored)]}
    return rest, [hit["rerank_score"] for hit, has_score in zip(hits, scored) if has_score]


def assert_same_searches(got: Sequence[dict[str, Any]],
                         expected: Sequence[dict[str, Any]]) -> None:
    """Equal search answers, up to timings and float rounding of the rerank scores."""
    got_split = [split_rerank_scores(answer) for answer in got]
    expected_split = [split_rerank_scores(answer) for answer in expected]
    assert [rest for rest, _ in got_split] == [rest for rest, _ in expected_split]
    for (_, got_scores), (_, expected_scores) in zip(got_split, expected_split):
        assert got_scores == pytest.approx(expected_scores, rel=1e-6, abs=1e-9)


def poll(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """Wait until `condition()` holds; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(POLL_S)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


class GatedEngine(Reranker):
    """The real engine (its loaded state shared, not reloaded); each score_detailed call first
    waits for `gate` (open by default). An instance of the wrapped engine's own class too (a
    DecoderReranker stays one), so the server serves it as the kind it wraps."""

    def __new__(cls, reranker: Reranker) -> GatedEngine:
        kind = type(reranker)
        if not issubclass(cls, kind):
            cls = type(f"Gated{kind.__name__}", (cls, kind), {})
        return super().__new__(cls)

    def __init__(self, reranker: Reranker) -> None:
        self.__dict__.update(vars(reranker))
        self.gate = threading.Event()
        self.gate.set()
        self.runs_entered = 0
        self._lock = threading.Lock()

    def score_detailed(self, pairs: Sequence[tuple[str, str]], *,
                       instruction: str | None = None) -> Any:
        with self._lock:
            self.runs_entered += 1
        if not self.gate.wait(WAIT_S):
            raise TimeoutError("the test never opened the gate")
        return super().score_detailed(pairs, instruction=instruction)


class GatedEmbedder(Embedder):
    """The real Embedder (its loaded state shared); each embed_detailed call first waits for
    `gate` (open by default)."""

    def __init__(self, embedder: Embedder) -> None:
        self.__dict__.update(vars(embedder))
        self.gate = threading.Event()
        self.gate.set()
        self.runs_entered = 0
        self._lock = threading.Lock()

    def embed_detailed(self, texts: Sequence[str], *, show_progress: bool = False) -> Any:
        with self._lock:
            self.runs_entered += 1
        if not self.gate.wait(WAIT_S):
            raise TimeoutError("the test never opened the gate")
        return super().embed_detailed(texts, show_progress=show_progress)


class RunningServer:
    """A started server: its base URL, app state and helpers to read /metrics."""

    def __init__(self, base_url: str, app: Any, api_key: str | None) -> None:
        self.base_url = base_url
        self.app = app
        headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        self.client = httpx.Client(base_url=base_url, headers=headers, timeout=WAIT_S)

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample of /metrics (0 when absent)."""
        text = self.client.get("/metrics").text
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(key) == value
                                               for key, value in labels.items()):
                    total += sample.value
        return total


@contextmanager
def running_server(models: Any, config: ServeConfig, *,
                   retriever: Any = None) -> Iterator[RunningServer]:
    """Serve `models` (an engine, or engines by id) and `retriever` with `config` on
    127.0.0.1:<free port> until the block ends."""
    app = create_app(models, config, retriever=retriever)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="on",
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    running = None
    try:
        poll(lambda: server.started or not thread.is_alive(), "uvicorn to start")
        assert server.started, "uvicorn failed to start"
        port = server.servers[0].sockets[0].getsockname()[1]
        running = RunningServer(f"http://127.0.0.1:{port}", app, config.api_key)
        poll(lambda: running.client.get("/ready").status_code == 200, "/ready")
        yield running
    finally:
        if running is not None:
            running.client.close()
        server.should_exit = True
        thread.join(WAIT_S)
        assert not thread.is_alive(), "the server did not stop"


# Documents of different lengths (so batch mates pad differently), real prose.
DOCUMENTS = [
    "The flutter of aircraft wings at transonic speeds was studied in a wind tunnel.",
    "Boundary layer transition on a flat plate.",
    "Heat transfer to a blunt body in hypersonic flow, with measurements of the stagnation "
    "point heating rate and comparisons with laminar theory over a range of Reynolds numbers.",
    "Buckling of thin cylindrical shells under axial compression.",
    "wings",
    "An experimental investigation of the aerodynamic characteristics of slender wings, with "
    "and without camber, at supersonic speeds; the lift, drag and pitching moment were measured.",
]
QUERY = "what is known about wing flutter at high speeds"
# The id the tiny model is served under (its manifest's name); requests naming another model get 404.
MODEL = "tiny-reranker"
