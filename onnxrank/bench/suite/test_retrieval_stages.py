"""Retrieval stages: lexical, dense, fusion and rerank latency for k=10 on an index of the dataset.

The index (SQLite FTS5 + HNSW) of the dataset's documents is built, incrementally, under
--bench-out/retrieval-index; each query runs one hybrid search reranking the fused top 50
(HybridRetriever's default rerank_top_n for k=10) and reports the time of every stage.
Skipped, with the reason, when the retriever or the embedding model is not available.
Budgets (budgets.toml): scenario "retrieval_stages", contenders lexical, dense, fusion,
rerank, total.

The cascade (scenario "retrieval_cascade", with --bench-late-model): the index also stores the
late-interaction model's document vectors; per query the fused top CASCADE_CANDIDATES passages
(QUICK_CASCADE_CANDIDATES in a quick run) are reranked, interleaved, by four contenders: the
cascade (stored vectors over all, then the run's cross-encoder over the top CASCADE_KEEP), the
cross-encoder alone, and the late-interaction model alone, from its stored vectors and encoding
the documents fresh. Reported: each contender's time and each cascade stage's, the ratios of
CASCADE_COMPARISONS with their 95% intervals, and for the same pairs the top-10 agreement (in the
first one's row). A late model whose manifest says relevance_trained false is named in the
labels: its agreement is with an untrained model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

from onnxrank.bench.harness import (
    Contender,
    ScenarioResult,
    StoppingRule,
    measure_interleaved,
    measurement_summary,
    summarize,
    time_stats,
)
from onnxrank.bench.suite.bench_run import WARM_UP_CANDIDATES, BenchRun
from onnxrank.bench.workloads import REGIMES
from onnxrank.engine.embedder import Embedder
from onnxrank.engine.runtime import resolve_model_dir
from onnxrank.errors import MissingDependencyError, RerankError

SCENARIO = "retrieval_stages"
REGIME = "dataset"
K = 10
STAGES = ("lexical", "dense", "fusion", "rerank")
CASCADE_SCENARIO = "retrieval_cascade"
# late interaction over up to 1,000 fused candidates, the cross-encoder over its top 50
CASCADE_CANDIDATES = 1000
CASCADE_KEEP = 50
# a quick run checks the scenario: enough candidates for both stages, not a thousand
QUICK_CASCADE_CANDIDATES = 2 * CASCADE_KEEP
# (faster, slower): the ratios measured, and the top-10 agreement of the first with the second
CASCADE_COMPARISONS = (("cascade", "cross_alone"), ("late_stored", "cross_alone"),
                       ("late_stored", "late_fresh"))
# a query and its fused candidates
Item = tuple[str, list[str]]


def _open_retriever(bench: BenchRun, device: str, scenario: str = SCENARIO,
                    late_model: Any = None) -> tuple[Any, dict[str, str]]:
    """Build (incrementally) and open the dataset's index, or skip with the reason; with
    `late_model`, an index that also stores its document vectors."""
    try:
        hybrid = importlib.import_module("onnxrank.retrieval.hybrid")
        retriever_class = hybrid.HybridRetriever
        retrieval = importlib.import_module("onnxrank.retrieval")
    except (ImportError, AttributeError) as err:
        bench.skip_scenario(scenario, REGIME, device,
                            f"onnxrank.retrieval.hybrid.HybridRetriever is not importable: {err}")
    try:
        embedder_dir = resolve_model_dir(bench.embedder_name, bench.models_dir)
        embedder = Embedder.from_dir(embedder_dir, device=device, threads=bench.threads)
        name = f"{embedder.spec.name}-{device}"
        if late_model is not None:
            name += f"-{late_model.spec.name}"
        index_dir = bench.out / "retrieval-index" / name
        retrieval.build_index(bench.dataset_path / "corpus.jsonl", index_dir, embedder,
                              document_vectors=late_model)
        retriever = retriever_class.open(index_dir, embedder=embedder)
    except (RerankError, MissingDependencyError) as err:
        bench.skip_scenario(scenario, REGIME, device, str(err))
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


def test_retrieval_cascade(benchmark: Any, bench: BenchRun, device: str) -> None:
    bench.require_device(CASCADE_SCENARIO, REGIME, device)
    if bench.late_model_name is None:
        bench.skip_scenario(CASCADE_SCENARIO, REGIME, device,
                            "no late-interaction model (onnxrank bench --late-model)")
    from onnxrank.engine.late_interaction import LateInteractionReranker
    from onnxrank.engine.reranker import Reranker

    try:
        late_model = Reranker.from_dir(resolve_model_dir(bench.late_model_name, bench.models_dir),
                                       config=bench.engine_config(device))
    except (RerankError, MissingDependencyError) as err:
        bench.skip_scenario(CASCADE_SCENARIO, REGIME, device, str(err))
    if not isinstance(late_model, LateInteractionReranker):
        bench.skip_scenario(CASCADE_SCENARIO, REGIME, device,
                            f"--late-model {bench.late_model_name} is not a late-interaction model")
    retriever, settings = _open_retriever(bench, device, CASCADE_SCENARIO, late_model)
    with contextlib.closing(retriever):
        _measure_cascade(benchmark, bench, device, retriever, late_model, settings)


def _measure_cascade(benchmark: Any, bench: BenchRun, device: str, retriever: Any,
                     late_model: Any, settings: dict[str, Any]) -> None:
    from onnxrank.rerankers import LocalReranker
    from onnxrank.rerankers.cascade import CascadeReranker, CascadeStage
    from onnxrank.rerankers.stored import StoredVectorReranker
    from onnxrank.retrieval.document_vectors import open_document_vectors

    cross = LocalReranker(bench.engine(device), on_error="raise")
    late = StoredVectorReranker(late_model, open_document_vectors(retriever.store), on_error="raise")
    cascade = CascadeReranker([CascadeStage(late, keep=CASCADE_KEEP), CascadeStage(cross)])
    queries = [request.query for request in
               bench.workload(REGIMES["short"], bench.sizes.latency_queries).requests]
    candidates = QUICK_CASCADE_CANDIDATES if bench.quick else CASCADE_CANDIDATES
    # the fused candidates of each query, retrieved once, outside the timed calls
    items = [(query, [hit.text if not hit.title else f"{hit.title} {hit.text}" for hit in
                      retriever.search(query, candidates, mode="hybrid")]) for query in queries]
    stage_ms: dict[str, list[float]] = {"late_interaction": [], "cross_encoder": []}
    top10: dict[str, dict[str, list[int]]] = {}

    def run_cascade(item: Item) -> None:
        result = cascade.rerank_detailed(item[0], item[1])
        for stage, run in zip(stage_ms, result.stages):
            stage_ms[stage].append(run.ms / 1000.0)
        top10.setdefault("cascade", {})[item[0]] = [document.index
                                                    for document in result.documents[:K]]

    def ranked_by(name: str, rerank: Callable[..., list[Any]]) -> Callable[[Item], None]:
        def run(item: Item) -> None:
            top10.setdefault(name, {})[item[0]] = [document.index for document in
                                                   rerank(item[0], item[1], top_k=K)]
        return run

    # each model runs where the engine's probe put it: the two may differ in precision
    late_info, cross_info = late_model.device_info, cross.load().device_info
    settings = {**settings, "late_model": late_model.spec.name,
                "late_model_file": late_info.model_file,
                "late_runtime": f"{late_info.backend} {late_info.precision}",
                "late_relevance_trained": late_model.spec.relevance_trained,
                "reranker": cross_info.model_file,
                "reranker_runtime": f"{cross_info.backend} {cross_info.precision}",
                "keep": CASCADE_KEEP, "candidates": candidates}
    untrained = ("" if late_model.spec.relevance_trained else
                 f" [{late_model.spec.name} is NOT relevance-trained: agreement with it is "
                 "agreement with an untrained model]")
    contenders = [
        Contender(name="cascade", label=f"late interaction (stored vectors) over the candidates, "
                  f"cross-encoder over its top {CASCADE_KEEP}{untrained}", run=run_cascade,
                  settings=settings),
        Contender(name="cross_alone", label="cross-encoder alone over the candidates",
                  run=ranked_by("cross_alone", cross.rerank), settings=settings),
        Contender(name="late_stored", label="late interaction alone over the candidates, stored "
                  f"document vectors{untrained}", run=ranked_by("late_stored", late.rerank),
                  settings=settings),
        Contender(name="late_fresh", label="late interaction alone over the candidates, documents "
                  f"encoded fresh{untrained}", run=ranked_by("late_fresh", late_model.rerank),
                  settings=settings),
    ]
    per_item = [len(documents) for _, documents in items]
    stopping = StoppingRule(min_items=min(bench.sizes.min_items, len(items)), max_items=len(items),
                            time_cap_s=bench.sizes.time_cap_s(CASCADE_SCENARIO, REGIME))
    timings = measure_interleaved(benchmark, contenders, items, per_item,
                                  ratios=CASCADE_COMPARISONS, stopping=stopping,
                                  warm_up=(items[0][0], items[0][1][:WARM_UP_CANDIDATES]))
    measured = per_item[:len(timings.seconds["cascade"])]
    result = summarize(CASCADE_SCENARIO, REGIME, device, contenders, timings,
                       ratios=CASCADE_COMPARISONS, skipped={},
                       workload={"dataset": bench.dataset_path.name, "queries": len(measured),
                                 "candidates_mean": sum(measured) / len(measured), "k": K})
    rows = dict(result.contenders)
    for name, other in CASCADE_COMPARISONS:
        rows[name].setdefault("top10_agreement", {})[other] = top10_agreement(top10[name],
                                                                              top10[other])
    stage_pairs = {"late_interaction": per_item,
                   "cross_encoder": [min(CASCADE_KEEP, pairs) for pairs in per_item]}
    for stage, values in stage_ms.items():  # values[0]: the untimed warm-up call
        rows[f"cascade_{stage}"] = {"label": f"cascade stage: {stage}", "settings": settings,
                                    "stats": time_stats(values[1:], stage_pairs[stage])}
    bench.record(benchmark, dataclasses.replace(result, contenders=rows))


def top10_agreement(ours: dict[str, list[int]], theirs: dict[str, list[int]]) -> dict[str, Any]:
    """Mean and min over the queries both ran of the share of one top 10 the other holds."""
    overlaps = [len(set(ours[query]) & set(theirs[query])) / max(len(ours[query]), 1)
                for query in ours if query in theirs]
    return {"mean": sum(overlaps) / max(len(overlaps), 1), "min": min(overlaps, default=0.0),
            "queries": len(overlaps)}
