"""Contenders built from the engine and the baselines, for one request or a chunk of requests."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from onnxrank.bench.harness import Contender
from onnxrank.bench.workloads import Request
from onnxrank.engine.reranker import Reranker
from onnxrank.types import Pair


def engine_settings(reranker: Reranker) -> dict[str, Any]:
    """Every engine option (EngineConfig, as configured), then what actually runs (DeviceInfo:
    backend, provider, variant, precision, threads, why), which wins where both name a key."""
    return {**dataclasses.asdict(reranker.config), **dataclasses.asdict(reranker.device_info)}


def engine_contender(name: str, label: str,
                     reranker: Reranker) -> Contender[Sequence[Request]]:
    """Calls ``reranker.rerank`` once per request of a chunk (latency items hold one request)."""
    return Contender(
        name=name, label=label, settings=engine_settings(reranker),
        run=lambda chunk: [reranker.rerank(request.query, request.documents)
                           for request in chunk],
    )


def engine_many_contender(name: str, label: str,
                          reranker: Reranker) -> Contender[Sequence[Request]]:
    """Calls ``reranker.rerank_many`` on a chunk of requests (their pairs share batches)."""
    return Contender(
        name=name, label=label, settings=engine_settings(reranker),
        run=lambda chunk: reranker.rerank_many(
            [(request.query, request.documents) for request in chunk]),
    )


def request_pairs(requests: Sequence[Request]) -> list[Pair]:
    """All (query, document) pairs of the requests, in order."""
    return [(request.query, document) for request in requests for document in request.documents]


def pairs_contender(name: str, label: str, settings: dict[str, Any],
                    score: Callable[[Sequence[Pair]], object]) -> Contender[Sequence[Request]]:
    """Scores every pair of a chunk of requests with `score` (a baseline's score method)."""
    return Contender(name=name, label=label, settings=settings,
                     run=lambda chunk: score(request_pairs(chunk)))
