"""Order check (an A/A test): three copies of the default engine, measured like any scenario.

Identical contenders must come out equal. A ratio far from 1 means the interleaving order favours
a position (the order this suite used before rotating every contender did: 6-11% for the first
contender) or the machine changed speed under the run, and then no ratio of this run can be
trusted to that precision. Budgets (budgets.toml): scenario "order_check", both directions.
"""

from __future__ import annotations

from typing import Any

from onnxrank import Reranker
from onnxrank.bench.contenders import engine_contender
from onnxrank.bench.suite.bench_run import BenchRun
from onnxrank.bench.workloads import REGIMES

SCENARIO = "order_check"
REGIME = REGIMES["short"]
COPIES = ("copy_a", "copy_b", "copy_c")


def test_order_check(benchmark: Any, bench: BenchRun, device: str) -> None:
    bench.require_device(SCENARIO, REGIME.name, device)
    workload = bench.workload(REGIME, bench.sizes.sweep_queries)
    # Separate sessions (bench.engine would hand back one cached engine three times).
    contenders = [
        engine_contender(name, f"engine ({bench.engine_label()}), an identical copy",
                         Reranker.from_dir(bench.model_dir, bench.engine_config(device)))
        for name in COPIES
    ]
    first, *others = COPIES
    bench.compare(
        benchmark, scenario=SCENARIO, regime=REGIME.name, device=device,
        contenders=contenders, items=[(request,) for request in workload.requests],
        pairs_per_item=[len(request.documents) for request in workload.requests],
        ratios=[pair for other in others for pair in ((first, other), (other, first))],
        workload=workload,
    )
