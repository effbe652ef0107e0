"""The server's Prometheus metrics, all in the ``onnxrank_`` namespace, in a registry per app.

Engine-side metrics carry the served model's id as label ``model``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxrank._optional import require

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

NAMESPACE = "onnxrank"
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   30.0)
ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKENS_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
REQUESTS_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# Why a request never reached the engine (labels of onnxrank_requests_dropped_total).
DROP_REASONS = ("client_disconnected", "deadline", "deadline_unreachable")


class ServerMetrics:
    """Counters, gauges and histograms of one server (its own registry, so that several apps in
    one process, as in the tests, do not collide).

    Attributes:
        requests: Answers by endpoint and HTTP status (every request counted once).
        request_seconds: Arrival to answer, by endpoint (rerank, embedding and search endpoints).
        queue_seconds: Arrival to the start of the engine run that ran the request, by model.
        tokenize_seconds / inference_seconds: Per engine run (shared by the requests in it).
        batch_rows / batch_padded_tokens: Per model run (session.run) inside an engine run.
        run_requests / run_items: Requests and items (pairs or texts) merged into one engine run.
        engine_runs: Engine runs (one planner pass each), by model.
        pairs_scored: (query, document) pairs that reached a rerank engine.
        texts_embedded: Texts that reached an embedding engine.
        dropped: Requests that never reached the engine, by model and reason:
            "client_disconnected" and "deadline" (taken out of the queue), "deadline_unreachable"
            (answered at arrival: the work ahead would outlast the deadline).
        queue_depth: Requests waiting for each model's engine now.
    """

    def __init__(self, models: tuple[str, ...] = ()) -> None:
        prometheus = require("prometheus_client", extra="serve")
        self.registry: CollectorRegistry = prometheus.CollectorRegistry()
        counter, gauge, histogram = prometheus.Counter, prometheus.Gauge, prometheus.Histogram
        common = {"namespace": NAMESPACE, "registry": self.registry}
        self.requests = counter("requests", "HTTP answers by endpoint and status",
                                ["endpoint", "status"], **common)
        self.request_seconds = histogram(
            "request_duration_seconds", "request arrival to answer", ["endpoint"],
            buckets=SECONDS_BUCKETS, **common)
        model = ["model"]
        self.queue_seconds = histogram(
            "queue_wait_seconds", "arrival to the start of the engine run that ran it", model,
            buckets=SECONDS_BUCKETS, **common)
        self.tokenize_seconds = histogram(
            "tokenization_seconds", "tokenization time per engine run", model,
            buckets=SECONDS_BUCKETS, **common)
        self.inference_seconds = histogram(
            "inference_seconds", "model time per engine run", model, buckets=SECONDS_BUCKETS,
            **common)
        self.batch_rows = histogram("batch_rows", "rows per model run", model,
                                    buckets=ROWS_BUCKETS, **common)
        self.batch_padded_tokens = histogram(
            "batch_padded_tokens", "rows x padded length per model run", model,
            buckets=TOKENS_BUCKETS, **common)
        self.run_requests = histogram(
            "engine_run_requests", "requests merged into one engine run", model,
            buckets=REQUESTS_BUCKETS, **common)
        self.run_items = histogram(
            "engine_run_items", "items (pairs or texts) run by one engine run", model,
            buckets=(1, 10, 50, 100, 200, 400, 800, 1600, 3200, 6400), **common)
        self.engine_runs = counter("engine_runs", "engine runs (one batch plan each)", model,
                                   **common)
        self.pairs_scored = counter("pairs_scored", "pairs that reached a rerank engine", model,
                                    **common)
        self.texts_embedded = counter("texts_embedded", "texts that reached an embedding engine",
                                      model, **common)
        self.dropped = counter("requests_dropped", "requests dropped before the engine",
                               ["model", "reason"], **common)
        self.queue_depth = gauge("queue_depth", "requests waiting for the engine", model,
                                 **common)
        for name in models:
            self.queue_depth.labels(model=name)
            for reason in DROP_REASONS:
                self.dropped.labels(model=name, reason=reason)

    def exposition(self) -> tuple[bytes, str]:
        """The Prometheus text format of every metric, with its content type."""
        prometheus = require("prometheus_client", extra="serve")
        return prometheus.generate_latest(self.registry), prometheus.CONTENT_TYPE_LATEST
