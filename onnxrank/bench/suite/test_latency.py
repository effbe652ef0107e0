"""Latency: rerank 50 candidates for one query; p50/p95/p99 over many queries, per regime.

Budgets (budgets.toml, scenario "latency"): engine p50_ms/p95_ms per regime, and the
product's promise floors: engine >= 2.5x faster than sentence-transformers on short passages and
>= 3.5x on mixed ones (median of per-query ratios).
"""

from __future__ import annotations

from typing import Any

from onnxrank.bench.contenders import engine_contender
from onnxrank.bench.suite.bench_run import BenchRun
from onnxrank.bench.workloads import Regime

SCENARIO = "latency"
# fastembed twice: on our int8 file (batching and tokenization alone differ) and on the plain
# fp32 model.onnx, the file fastembed itself uses for this model.
BASELINES = ("st", "naive_ort", "fastembed", "fastembed_fp32")


def test_latency(benchmark: Any, bench: BenchRun, device: str, regime: Regime) -> None:
    bench.require_device(SCENARIO, regime.name, device)
    workload = bench.workload(regime, bench.sizes.latency_queries)
    engine = engine_contender("engine", f"onnxrank engine ({bench.engine_label()})",
                              bench.engine(device))
    baselines, skipped = bench.baseline_contenders(device, BASELINES)
    bench.compare(
        benchmark, scenario=SCENARIO, regime=regime.name, device=device,
        contenders=[engine, *baselines], items=[(request,) for request in workload.requests],
        pairs_per_item=[len(request.documents) for request in workload.requests],
        ratios=[("engine", baseline.name) for baseline in baselines],
        skipped=skipped, workload=workload,
    )
