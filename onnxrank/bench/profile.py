"""Where a query's time goes: a per-operator profile of the runtime and variant the engine chose,
at the batches the engine runs for a bench workload (docs/ceiling.md, "Explaining a
share")::

    python -m onnxrank.bench.profile --model-dir models/minilm-standin --regime short --queries 8

The model loads as the engine loads it (the probe's choice unless --backend/--precision say
otherwise); each query's pairs are planned into padded batches as `Reranker.score` plans them; every
batch runs once to warm up, then `--repeats` times under the runtime's own profiler (onnxruntime's
``enable_profiling`` trace, OpenVINO's ``PERF_COUNT`` per-layer counters). Printed per query: the
time of each operator type, the share of the GEMM operators (the ones the ceiling measures), and
their rate counted in model FLOPs of the padded batches. A profile is a measurement: run it alone.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from onnxrank._optional import require
from onnxrank.bench.flops import model_flops
from onnxrank.bench.paths import DEFAULT_DATASET
from onnxrank.bench.workloads import (
    DEFAULT_CANDIDATES,
    DEFAULT_SEED,
    PassageSource,
    build_workload,
    load_dataset,
    parse_regimes,
)
from onnxrank.engine.backends.onnxruntime import session_options
from onnxrank.engine.backends.openvino import compile_config
from onnxrank.engine.reranker import Reranker, planned_feeds

# Operators that are matrix products of activations by weights or by each other: what the GEMM
# ceiling measures. Fused attention (onnxruntime's Attention, OpenVINO's Subgraph) holds GEMMs and
# element-wise work together and is counted apart, by name.
GEMM_OPERATORS = frozenset({
    "MatMul", "Gemm", "FusedGemm", "FusedMatMul", "MatMulInteger", "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat", "QGemm", "QLinearMatMul", "FullyConnected",
    "FullyConnectedQuantizedLegacy",
})


@dataclass(frozen=True, slots=True)
class Profile:
    """Per-query times of one workload on one runtime.

    Attributes:
        runtime: backend/precision and the model file profiled.
        regime: The workload's length regime.
        queries: Queries profiled (each `repeats` times after a warm-up).
        batches_per_query: Mean padded batches the engine runs for a query.
        query_ms: Wall time per query of the profiled runs (profiler on; the model's load and
            the warm-up pass left out).
        operators_ms: Per query, the runtime's own time of each operator type, largest first.
        gemm_share: Share of the operators' time in GEMM_OPERATORS.
        gemm_gops: Model FLOPs of the padded batches / the GEMM operators' time (G/s).
        model_gops: Model FLOPs of the real tokens / query_ms (the report's effective rate).
    """

    runtime: str
    regime: str
    queries: int
    batches_per_query: float
    query_ms: float
    operators_ms: dict[str, float] = field(default_factory=dict)
    gemm_share: float = 0.0
    gemm_gops: float = 0.0
    model_gops: float = 0.0


def _timed_passes(run: Callable[[dict[str, np.ndarray]], object],
                  feeds: Sequence[dict[str, np.ndarray]], repeats: int,
                  after: Callable[[], None] = lambda: None) -> float:
    """One warm-up pass over `feeds`, then `repeats` passes; returns the wall seconds of those
    runs. `after` follows each timed run, outside its time."""
    for feed in feeds:
        run(feed)
    wall = 0.0
    for _ in range(repeats):
        for feed in feeds:
            started = time.perf_counter()
            run(feed)
            wall += time.perf_counter() - started
            after()
    return wall


def _onnxruntime_times(path: str, threads: int, feeds: Sequence[dict[str, np.ndarray]],
                       repeats: int) -> tuple[Counter[str], float]:
    """Operator type -> seconds over `repeats` runs of every feed, and their wall seconds (the
    session's load and the warm-up pass left out)."""
    with tempfile.TemporaryDirectory(prefix="onnxrank-profile-") as scratch:
        options = session_options(threads)
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(scratch) / "trace")
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        names = [node.name for node in session.get_inputs()]
        wall = _timed_passes(lambda feed: session.run(None, {name: feed[name] for name in names}),
                             feeds, repeats)
        events = json.loads(Path(session.end_profiling()).read_text("utf-8"))
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    measured = runs[len(feeds):]  # the first pass over the feeds is the warm-up
    start = measured[0]["ts"] if measured else float("inf")
    times: Counter[str] = Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") \
                and event["ts"] >= start:
            times[event["args"]["op_name"]] += event["dur"] / 1e6
    return times, wall


def _openvino_times(path: str, threads: int, precision: str,
                    feeds: Sequence[dict[str, np.ndarray]], repeats: int) -> tuple[Counter[str], float]:
    """Layer type -> seconds over `repeats` runs of every feed, and their wall seconds (the
    compilation and the warm-up pass left out)."""
    from onnxrank.engine.backends.openvino import openvino_core

    openvino = require("openvino", extra="openvino")
    compiled = openvino_core().compile_model(
        path, "CPU", {**compile_config(threads, precision), "PERF_COUNT": True})
    request = compiled.create_infer_request()
    names = [node.get_any_name() for node in compiled.inputs]
    times: Counter[str] = Counter()
    executed = openvino.ProfilingInfo.Status.EXECUTED

    def count() -> None:  # the request's counters describe its last infer
        for layer in request.profiling_info:
            if layer.status == executed:
                times[layer.node_type] += layer.real_time.total_seconds()

    wall = _timed_passes(lambda feed: request.infer({name: feed[name] for name in names}),
                         feeds, repeats, after=count)
    return times, wall


def profile(model_dir: Path, *, regime: str = "short", queries: int = 8, repeats: int = 3,
            candidates: int = DEFAULT_CANDIDATES, backend: str | None = None,
            precision: str | None = None, dataset: Path = DEFAULT_DATASET) -> Profile:
    """Profile the engine's runtime on `queries` requests of `regime` (see the module docstring).

    `backend` and `precision`: EngineConfig's; None keeps its default (the probe's choice).

    Raises:
        ValueError: An unknown regime, or a backend the profiler cannot read (only onnxruntime's
            CPU provider and OpenVINO have per-operator profiles here).
    """
    chosen: dict[str, Any] = {key: value for key, value in
                              (("backend", backend), ("precision", precision)) if value is not None}
    # the whole-row graph (info.model_file) is what is profiled: a decoder's prefix batches
    # would feed it only the rows' own tokens
    reranker = Reranker.from_dir(model_dir, None, device="cpu", prefix_reuse=False, **chosen)
    info = reranker.device_info
    workload = build_workload(PassageSource(load_dataset(dataset), reranker.tokenizer,
                                            seed=DEFAULT_SEED), parse_regimes(regime)[0],
                              queries=queries, candidates=candidates)
    per_query = [planned_feeds(reranker, [(r.query, d) for d in r.documents])
                 for r in workload.requests]
    feeds = [feed for batches in per_query for feed in batches]
    if info.backend == "onnxruntime":
        times, wall = _onnxruntime_times(info.model_file, info.threads, feeds, repeats)
    elif info.backend == "openvino":
        times, wall = _openvino_times(info.model_file, info.threads, info.precision, feeds,
                                      repeats)
    else:
        raise ValueError(f"no per-operator profile for backend {info.backend!r}")
    query_s = wall / repeats / queries
    flops = model_flops(Path(model_dir) / reranker.spec.variants["fp32"].file)
    padded = sum(len(feed["input_ids"]) * flops.pair(feed["input_ids"].shape[1]) for feed in feeds)
    real = sum(flops.pair(int(count)) for feed in feeds for count in feed["attention_mask"].sum(1))
    total = sum(times.values())
    gemm = sum(seconds for name, seconds in times.items() if name in GEMM_OPERATORS)
    per_query_ms = {name: seconds * 1e3 / repeats / queries for name, seconds in times.most_common()}
    return Profile(
        runtime=f"{info.backend}/{info.precision} ({Path(info.model_file).name}, {info.threads} threads)",
        regime=regime, queries=queries, batches_per_query=len(feeds) / queries,
        query_ms=query_s * 1e3, operators_ms=per_query_ms,
        gemm_share=gemm / total if total else 0.0,
        gemm_gops=padded * repeats / gemm / 1e9 if gemm else 0.0,
        model_gops=real / queries / query_s / 1e9)


def _print(result: Profile) -> None:
    total = sum(result.operators_ms.values())
    print(f"{result.runtime}, regime {result.regime}: {result.queries} queries, "
          f"{result.batches_per_query:.1f} batches each, {result.query_ms:.1f} ms per query "
          f"(wall, profiler on); operators {total:.1f} ms")
    for name, ms in result.operators_ms.items():
        kind = "GEMM" if name in GEMM_OPERATORS else ""
        print(f"  {name:<28} {ms:8.2f} ms {ms / total:6.1%} {kind}")
    print(f"GEMM operators: {result.gemm_share:.1%} of the operators' time, "
          f"{result.gemm_gops:.0f} GOP/s in padded model FLOPs; "
          f"whole query {result.model_gops:.0f} GOP/s in real-token model FLOPs")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--regime", default="short", help="a bench regime (short, mixed, ...)")
    parser.add_argument("--queries", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--candidates", type=int, default=DEFAULT_CANDIDATES)
    parser.add_argument("--backend", default=None, help="default: the engine's (EngineConfig)")
    parser.add_argument("--precision", default=None, help="default: the engine's (EngineConfig)")
    parser.add_argument("--json", action="store_true", help="print the profile as JSON")
    args = parser.parse_args(argv)
    result = profile(args.model_dir, regime=args.regime, queries=args.queries, repeats=args.repeats,
                     candidates=args.candidates, backend=args.backend, precision=args.precision)
    if args.json:
        print(json.dumps(asdict(result), indent=2))
    else:
        _print(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
