"""Retrieval stages: lexical, dense, fusion and rerank latency for k=10 on an index of the dataset.

The index (SQLite FTS5 + HNSW) of the dataset's documents is built, incrementally, under
--bench-out/retrieval-index; each query runs one hybrid search reranking the fused top 50
(HybridRetriever's default rerank_top_n for k=10) and reports the time of every stage.
Skipped, with the reason, when the retriever or the embedding model is not available.
Budgets (budgets.toml): scenario "retrieval_stages", contenders lexical, dense, fusion,
rerank, total.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

from onnxrank.bench.harness import (
    Contender,
    ScenarioResult,
    StoppingRule,
    measure_interleaved,
    measurement_summary,
    time_stats,
)
from onnxrank.bench.suite.bench_run import BenchRun
from onnxrank.bench.workloads import REGIMES
from onnxrank.engine.embedder import Embedder
from onnxrank.engine.runtime import resolve_model_dir
from onnxrank.errors import MissingDependencyError, RerankError

SCENARIO = "retrieval_stages"
REGIME = "dataset"
K = 10
STAGES = ("lexical", "dense", "fusion", "rerank")


def _open_retriever(bench: BenchRun, device: str) -> tuple[Any, dict[str, str]]:
    """Build (incrementally) and open the dataset's index, or skip with the reason."""
    try:
        hybrid = importlib.import_module("onnxrank.retrieval.hybrid")
        retriever_class = hybrid.HybridRetriever
        retrieval = importlib.import_module("onnxrank.retrieval")
    except (ImportError, AttributeError) as err:
        bench.skip_scenario(SCENARIO, REGIME, device,
                            f"onnxrank.retrieval.hybrid.HybridRetriever is not importable: {err}")
    try:
        embedder_dir = resolve_model_dir(bench.embedder_name, bench.models_dir)
        embedder = Embedder.from_dir(embedder_dir, device=device, threads=bench.threads)
        index_dir = bench.out / "retrieval-index" / f"{embedder.spec.name}-{device}"
        retrieval.build_index(bench.dataset_path / "corpus.jsonl", index_dir, embedder)
        retriever = retriever_class.open(index_dir, embedder=embedder)
    except (RerankError, MissingDependencyError) as err:
        bench.skip_scenario(SCENARIO, REGIME, device, str(err))
    return retriever, {"index": str(index_dir), "embedder": str(embedder_dir)}


def test_retrieval_stages(benchmark: Any, bench: BenchRun, device: str) -> None:
    bench.require_device(SCENARIO, REGIME, device)
    retriever, settings = _open_retriever(bench, device)
    with contextlib.closing(retriever):
        _measure_stages(benchmark, bench, device, retriever, settings)


def _measure_stages(benchmark: Any, bench: BenchRun, device: str, retriever: Any,
                    settings: dict[str, Any]) -> None:
    reranker = bench.engine(device)
    # The queries of the latency workload (seeded draw from the dataset's queries), as many as
    # it takes to know the median total time to ±5%, within the time cap.
    queries = [request.query for request in
               bench.workload(REGIMES["short"], bench.sizes.latency_queries).requests]
    stage_ms: dict[str, list[float]] = {stage: [] for stage in STAGES}

    def search(chunk: tuple[str]) -> None:
        result = retriever.search_detailed(chunk[0], K, mode="hybrid", rerank=True,
                                           reranker=reranker)
        for stage in STAGES:
            stage_ms[stage].append(getattr(result.timings, f"{stage}_ms") / 1000.0)

    pipeline = Contender(name="total", label=f"hybrid search, k={K}, rerank top 50", run=search)
    per_query = [1] * len(queries)
    stopping = StoppingRule(min_items=min(bench.sizes.min_items, len(queries)),
                            max_items=len(queries),
                            time_cap_s=bench.sizes.time_cap_s(SCENARIO, REGIME))
    timings = measure_interleaved(benchmark, [pipeline], [(query,) for query in queries],
                                  per_query, stopping=stopping)
    settings = {**settings, "reranker": reranker.device_info.model_file, "k": K}
    # stage_ms[...][0] is the untimed warm-up call of measure_interleaved.
    stages = {stage: {"label": f"{stage} stage", "settings": settings,
                      "stats": time_stats(values[1:], per_query)}
              for stage, values in stage_ms.items()}
    total = timings.seconds["total"]
    stages["total"] = {"label": pipeline.label, "settings": settings,
                       "stats": time_stats(total, per_query)}
    bench.record(benchmark, ScenarioResult(
        scenario=SCENARIO, regime=REGIME, device=device, contenders=stages,
        workload={"dataset": bench.dataset_path.name, "queries": len(total), "k": K},
        measurement=measurement_summary(timings, "total", compared=False),
    ))
