"""Throughput: pairs/s over 2,000 pairs (40 queries x 50) scored through rerank_many, per regime.

Requests go to the engine in chunks of 8 (one rerank_many call per chunk, so pairs of different
queries share batches); pytest-benchmark's rounds are the chunks. The baselines' speed is compared
in the latency scenario: running them over 2,000 pairs per regime too would double a full run.
Budgets (budgets.toml): scenario "throughput".
"""

from __future__ import annotations

from typing import Any

from onnxrank.bench.contenders import engine_many_contender
from onnxrank.bench.suite.bench_run import BenchRun
from onnxrank.bench.workloads import Regime

SCENARIO = "throughput"


def test_throughput(benchmark: Any, bench: BenchRun, device: str, regime: Regime) -> None:
    bench.require_device(SCENARIO, regime.name, device)
    workload = bench.workload(regime, bench.sizes.throughput_requests)
    step = bench.sizes.throughput_requests_per_round
    chunks = [workload.requests[start:start + step]
              for start in range(0, len(workload.requests), step)]
    engine = engine_many_contender("engine", f"onnxrank engine rerank_many ({bench.engine_label()})",
                                   bench.engine(device))
    bench.compare(
        benchmark, scenario=SCENARIO, regime=regime.name, device=device, contenders=[engine],
        items=chunks,
        pairs_per_item=[sum(len(request.documents) for request in chunk) for chunk in chunks],
        ratios=[], workload=workload,
    )
