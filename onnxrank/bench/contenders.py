"""Contenders built from the engine and the baselines, for one request or a chunk of requests."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from onnxrank.bench.harness import Contender
from onnxrank.bench.workloads import Request
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.reranker import Reranker
from onnxrank.types import Pair

# EngineConfig fields the bench sets itself: each scenario runs on every device of its --device
# list, and its --threads is every contender's, the baselines' too.
BENCH_OWN_OPTIONS = ("device", "threads")


def bench_engine_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The engine options of a bench run that differ from EngineConfig's defaults, in field order.

    Raises:
        ValueError: `options` sets device or threads, or a value is out of range.
        TypeError: A name is not an EngineConfig field.
    """
    own = sorted(set(options) & set(BENCH_OWN_OPTIONS))
    if own:
        raise ValueError(f"engine options {own} are set by the bench itself (its --device list "
                         "and --threads), not per engine")
    defaults = EngineConfig()
    config = defaults.with_overrides(**options)
    return {spec.name: getattr(config, spec.name) for spec in dataclasses.fields(config)
            if getattr(config, spec.name) != getattr(defaults, spec.name)}


def describe_engine_options(options: Mapping[str, Any]) -> str:
    """"defaults", or "defaults except" the changed options: for labels and the report."""
    if not options:
        return "defaults"
    return "defaults except " + ", ".join(f"{name}={value!r}" for name, value in options.items())


def engine_settings(reranker: Reranker) -> dict[str, Any]:
    """Every engine option (EngineConfig, as configured), then what actually runs (DeviceInfo:
    backend, provider, variant, precision, threads, why), which wins where both name a key; the
    padding multiple the batches use; and whether a decoder's prefix graph runs."""
    return {**dataclasses.asdict(reranker.config), **dataclasses.asdict(reranker.device_info),
            "pad_to_multiple": reranker.padding_multiple,
            "prefix_graph": reranker.uses_prefix_graph}


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
                    score: Callable[[Sequence[Pair]], object],
                    timer: Callable[[], float] | None = None) -> Contender[Sequence[Request]]:
    """Scores every pair of a chunk of requests with `score` (a baseline's score method) in one
    call; `timer` (Contender.timer) reads that call's own time where the wall time is not it
    (a child process's, without the pipe)."""
    return Contender(name=name, label=label, settings=settings,
                     run=lambda chunk: score(request_pairs(chunk)), timer=timer)
