"""Sweeps of the engine's settings, each measured interleaved within one test.

- max_batch_tokens and max_batch_size: throughput (rerank_many) on the mixed regime;
- padding strategy on the mixed regime (log-uniform lengths) and on its range with uniform lengths
  (mixed_uniform): length-sorted token budget (default) vs padding to the longest row in input
  order vs padding every row to max_length, next to every row run alone (no padding at all: the
  bound no batching strategy can beat). The naive onnxruntime loop, which also pads to
  max_length, is compared on mixed lengths in the latency scenario: here it would take a third of
  the scenario's time for a ratio no budget holds;
- threads: 1 vs all usable cores;
- precision: every precision each backend can run on the device, side by side: onnxruntime int8,
  opt (fused fp32) and fp32, and on CPU OpenVINO int8 (the NNCF IR), bf16 and fp32 (each skipped,
  with the reason, where it cannot run here: openvino not installed, no BF16, not exported).

Budgets (budgets.toml): scenario "padding", regime "mixed", ratio
"length_sorted/pad_to_max" >= 3 is a promise of the product; the others are guards or reported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from onnxrank.bench.contenders import engine_contender, engine_many_contender
from onnxrank.bench.suite.bench_run import BenchRun
from onnxrank.bench.workloads import MIXED_UNIFORM, REGIMES, Regime
from onnxrank.engine.runtime import BACKENDS
from onnxrank.errors import MissingDependencyError, RerankError
from onnxrank.types import Device

SWEEP_REGIME = REGIMES["mixed"]
PADDING_REGIMES = (REGIMES["mixed"], MIXED_UNIFORM)
THREADS_REGIME = REGIMES["medium"]
PRECISION_REGIME = REGIMES["medium"]
# Large enough that the other setting is the one that binds.
UNBOUNDED_BATCH_SIZE = 1024
UNBOUNDED_BATCH_TOKENS = 1 << 17
BACKEND_SHORT_NAMES = {"onnxruntime": "ort", "openvino": "ov"}
REQUESTS_PER_ROUND = 2


def _sweep(benchmark: Any, bench: BenchRun, device: str, scenario: str, setting: str,
           values: tuple[int, ...], fixed: dict[str, int]) -> None:
    bench.require_device(scenario, SWEEP_REGIME.name, device)
    workload = bench.workload(SWEEP_REGIME, bench.sizes.sweep_queries)
    chunks = [workload.requests[start:start + REQUESTS_PER_ROUND]
              for start in range(0, len(workload.requests), REQUESTS_PER_ROUND)]
    contenders = [
        engine_many_contender(f"{setting}={value}", f"engine, {setting}={value}",
                              bench.engine(device, **{setting: value}, **fixed))
        for value in sorted(values, reverse=True)
    ]
    bench.compare(
        benchmark, scenario=scenario, regime=SWEEP_REGIME.name, device=device,
        contenders=contenders, items=chunks,
        pairs_per_item=[sum(len(request.documents) for request in chunk) for chunk in chunks],
        ratios=[(contenders[0].name, other.name) for other in contenders[1:]],
        workload=workload,
    )


def test_max_batch_tokens(benchmark: Any, bench: BenchRun, device: str) -> None:
    _sweep(benchmark, bench, device, "max_batch_tokens", "max_batch_tokens",
           bench.sizes.max_batch_tokens, {"max_batch_size": UNBOUNDED_BATCH_SIZE})


def test_max_batch_size(benchmark: Any, bench: BenchRun, device: str) -> None:
    _sweep(benchmark, bench, device, "max_batch_size", "max_batch_size",
           bench.sizes.max_batch_size, {"max_batch_tokens": UNBOUNDED_BATCH_TOKENS})


@pytest.mark.parametrize("padding_regime", PADDING_REGIMES, ids=lambda regime: regime.name)
def test_padding(benchmark: Any, bench: BenchRun, device: str, padding_regime: Regime) -> None:
    scenario = "padding"
    bench.require_device(scenario, padding_regime.name, device)
    workload = bench.workload(padding_regime, bench.sizes.sweep_queries)
    # Length-sorted even when the user turned sorting off: each contender is one strategy.
    length_sorted = bench.engine(device, sort_by_length=True)
    max_length = length_sorted.config.max_length
    contenders = [
        engine_contender("length_sorted", "length-sorted token budget (engine "
                         f"{bench.engine_label(sort_by_length=True)})", length_sorted),
        engine_contender("input_order", "pad to longest, input order (sort_by_length=False)",
                         bench.engine(device, sort_by_length=False)),
        engine_contender("pad_to_max", f"pad every row to {max_length}, input order (engine, "
                         f"pad_to_multiple={max_length}, sort_by_length=False)",
                         bench.engine(device, sort_by_length=False, pad_to_multiple=max_length)),
        engine_contender("no_padding", "every row alone (max_batch_size=1): no padding at all",
                         bench.engine(device, max_batch_size=1)),
    ]
    bench.compare(
        benchmark, scenario=scenario, regime=padding_regime.name, device=device,
        contenders=contenders, items=[(request,) for request in workload.requests],
        pairs_per_item=[len(request.documents) for request in workload.requests],
        ratios=[("length_sorted", other.name) for other in contenders[1:]],
        workload=workload,
    )


def test_threads(benchmark: Any, bench: BenchRun, device: str) -> None:
    scenario = "threads"
    bench.require_device(scenario, THREADS_REGIME.name, device)
    if bench.threads == 1:
        pytest.skip("threads sweep needs more than one thread (--bench-threads or usable cores)")
    workload = bench.workload(THREADS_REGIME, bench.sizes.sweep_queries)
    contenders = [
        engine_contender(f"threads={threads}", f"engine, {threads} intra-op threads",
                         bench.engine(device, threads=threads))
        for threads in (bench.threads, 1)
    ]
    bench.compare(
        benchmark, scenario=scenario, regime=THREADS_REGIME.name, device=device,
        contenders=contenders, items=[(request,) for request in workload.requests],
        pairs_per_item=[len(request.documents) for request in workload.requests],
        ratios=[(contenders[0].name, contenders[1].name)], workload=workload,
    )


def test_precision(benchmark: Any, bench: BenchRun, device: str) -> None:
    scenario = "precision"
    bench.require_device(scenario, PRECISION_REGIME.name, device)
    workload = bench.workload(PRECISION_REGIME, bench.sizes.sweep_queries)
    contenders, skipped = [], {}
    for backend, precision in precision_candidates(device):
        name = f"{BACKEND_SHORT_NAMES[backend]}_{precision}"
        try:
            reranker = bench.engine(device, backend=backend, precision=precision)
        except (ValueError, RerankError, MissingDependencyError) as err:
            # The backend or precision cannot run here (not installed, no BF16, not exported):
            # the report and the terminal summary say why.
            skipped[name] = f"skipped: {err}"
            continue
        contenders.append(engine_contender(
            name, f"engine, backend={backend!r}, precision={precision!r} "
                  f"({Path(reranker.device_info.model_file).name})", reranker))
    if not contenders:
        bench.skip_scenario(scenario, PRECISION_REGIME.name, device,
                            "no backend can run any precision: " + "; ".join(skipped.values()))
    # Every variant's speed-up over plain fp32 on onnxruntime, the reference everyone has.
    names = [contender.name for contender in contenders]
    reference = "ort_fp32" if "ort_fp32" in names else names[-1]
    bench.compare(
        benchmark, scenario=scenario, regime=PRECISION_REGIME.name, device=device,
        contenders=contenders, items=[(request,) for request in workload.requests],
        pairs_per_item=[len(request.documents) for request in workload.requests],
        ratios=[(name, reference) for name in names if name != reference],
        skipped=skipped, workload=workload,
    )


def precision_candidates(device: str) -> list[tuple[str, str]]:
    """(backend, precision) pairs of the precision scenario on `device`: every precision each
    backend prefers there, fastest expected first; OpenVINO on CPU only."""
    backends = [("onnxruntime", BACKENDS["onnxruntime"])]
    if device == Device.CPU.value:
        backends.append(("openvino", BACKENDS["openvino"]))
    return [(name, precision) for name, backend in backends
            for precision in backend.preference.get(Device(device), ())]
