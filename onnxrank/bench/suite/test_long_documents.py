"""Long documents (1,000-2,000 tokens): long_documents="max_chunk" (every window scored, best
kept) vs "truncate" (first window only). The ratio truncate/max_chunk is the price of reading
whole documents. Budgets (budgets.toml): scenario "long_documents".
"""

from __future__ import annotations

from typing import Any

from onnxrank.bench.contenders import engine_contender
from onnxrank.bench.suite.bench_run import BenchRun
from onnxrank.bench.workloads import LONG_DOCUMENTS

SCENARIO = "long_documents"


def test_long_documents(benchmark: Any, bench: BenchRun, device: str) -> None:
    bench.require_device(SCENARIO, LONG_DOCUMENTS.name, device)
    workload = bench.workload(LONG_DOCUMENTS, bench.sizes.long_document_queries)
    contenders = [
        engine_contender("max_chunk", "engine, long_documents='max_chunk'",
                         bench.engine(device, long_documents="max_chunk")),
        engine_contender("truncate", "engine, long_documents='truncate'",
                         bench.engine(device, long_documents="truncate")),
    ]
    bench.compare(
        benchmark, scenario=SCENARIO, regime=LONG_DOCUMENTS.name, device=device,
        contenders=contenders, items=[(request,) for request in workload.requests],
        pairs_per_item=[len(request.documents) for request in workload.requests],
        ratios=[("truncate", "max_chunk")], workload=workload,
        # max_chunk runs several windows per pair: one pass of model FLOPs would undercount it
        count_flops=False,
    )
