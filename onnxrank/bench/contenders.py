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
    """What runs and how it batches (provider, variant, threads, batch settings)."""
    config = reranker.config
    return {
        **dataclasses.asdict(reranker.device_info),
        "max_batch_tokens": config.max_batch_tokens,
        "max_batch_size": config.max_batch_size,
        "max_length": config.max_length,
        "sort_by_length": config.sort_by_length,
        "pad_to_multiple": config.pad_to_multiple,
        "long_documents": config.long_documents,
    }


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
