"""Sweeps of the engine's settings, each measured interleaved within one test.

- max_batch_tokens and max_batch_size: throughput (rerank_many) on the mixed regime;
- padding strategy on the mixed regime (log-uniform lengths) and on its range with uniform lengths
  (mixed_uniform): length-sorted token budget (default) vs padding to the longest row in input
  order vs padding every row to max_length (engine and naive loop), next to every row run alone
  (no padding at all: the bound no batching strategy can beat);
- threads: 1 vs all usable cores; precision: every exported variant usable on the device, and
  on CPU the OpenVINO EP on the fp32 graph (skipped with the reason when it cannot run here).

Budgets (bench/budgets.toml): scenario "padding", regime "mixed", ratio
"length_sorted/pad_to_max" >= 3 is a promise of the product; the others are guards or reported.
"""

from __future__ import annotations

import pytest
from conftest import BenchRun

from onnxrank.bench.contenders import engine_contender, engine_many_contender
from onnxrank.bench.workloads import MIXED_UNIFORM, REGIMES, Regime
from onnxrank.engine.session import VARIANT_PREFERENCE
from onnxrank.errors import DeviceUnavailableError
from onnxrank.types import Device

SWEEP_REGIME = REGIMES["mixed"]
PADDING_REGIMES = (REGIMES["mixed"], MIXED_UNIFORM)
THREADS_REGIME = REGIMES["medium"]
PRECISION_REGIME = REGIMES["medium"]
# Large enough that the other setting is the one that binds.
UNBOUNDED_BATCH_SIZE = 1024
UNBOUNDED_BATCH_TOKENS = 1 << 17
REQUESTS_PER_ROUND = 2


def _sweep(benchmark, bench: BenchRun, device: str, scenario: str, setting: str,
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


def test_max_batch_tokens(benchmark, bench: BenchRun, device: str) -> None:
    _sweep(benchmark, bench, device, "max_batch_tokens", "max_batch_tokens",
           bench.sizes.max_batch_tokens, {"max_batch_size": UNBOUNDED_BATCH_SIZE})


def test_max_batch_size(benchmark, bench: BenchRun, device: str) -> None:
    _sweep(benchmark, bench, device, "max_batch_size", "max_batch_size",
           bench.sizes.max_batch_size, {"max_batch_tokens": UNBOUNDED_BATCH_TOKENS})


@pytest.mark.parametrize("padding_regime", PADDING_REGIMES, ids=lambda regime: regime.name)
def test_padding(benchmark, bench: BenchRun, device: str, padding_regime: Regime) -> None:
    scenario = "padding"
    bench.require_device(scenario, padding_regime.name, device)
    workload = bench.workload(padding_regime, bench.sizes.sweep_queries)
    max_length = bench.reference_engine.config.max_length
    contenders = [
        engine_contender("length_sorted", "length-sorted token budget (engine default)",
                         bench.engine(device)),
        engine_contender("input_order", "pad to longest, input order (sort_by_length=False)",
                         bench.engine(device, sort_by_length=False)),
        engine_contender("pad_to_max", f"pad every row to {max_length}, input order (engine, "
                         f"pad_to_multiple={max_length}, sort_by_length=False)",
                         bench.engine(device, sort_by_length=False, pad_to_multiple=max_length)),
        engine_contender("no_padding", "every row alone (max_batch_size=1): no padding at all",
                         bench.engine(device, max_batch_size=1)),
    ]
    baselines, skipped = bench.baseline_contenders(device, ("naive_ort",))
    contenders += baselines
    bench.compare(
        benchmark, scenario=scenario, regime=padding_regime.name, device=device,
        contenders=contenders, items=[(request,) for request in workload.requests],
        pairs_per_item=[len(request.documents) for request in workload.requests],
        ratios=[("length_sorted", other.name) for other in contenders[1:]],
        skipped=skipped, workload=workload,
    )


def test_threads(benchmark, bench: BenchRun, device: str) -> None:
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


def test_precision(benchmark, bench: BenchRun, device: str) -> None:
    scenario = "precision"
    bench.require_device(scenario, PRECISION_REGIME.name, device)
    exported = bench.reference_engine.spec.variants
    variants = [name for name in VARIANT_PREFERENCE[Device(device)] if name in exported]
    workload = bench.workload(PRECISION_REGIME, bench.sizes.sweep_queries)
    # On CPU the variants run on onnxruntime's own CPU EP; OpenVINO gets its own row.
    provider = {"cpu_provider": "default"} if device == Device.CPU.value else {}
    contenders = [
        engine_contender(variant, f"engine, precision={variant!r} ({exported[variant].file})",
                         bench.engine(device, precision=variant, **provider))
        for variant in variants
    ]
    skipped = {}
    if device == Device.CPU.value:
        try:
            contenders.append(engine_contender(
                "openvino", "engine, OpenVINO EP on the fp32 graph (cpu_provider='openvino')",
                bench.engine(device, precision="fp32", cpu_provider="openvino")))
        except DeviceUnavailableError as err:
            skipped["openvino"] = f"skipped: {err}"
    bench.compare(
        benchmark, scenario=scenario, regime=PRECISION_REGIME.name, device=device,
        contenders=contenders, items=[(request,) for request in workload.requests],
        pairs_per_item=[len(request.documents) for request in workload.requests],
        ratios=[(contenders[0].name, other.name) for other in contenders[1:]],
        skipped=skipped, workload=workload,
    )
