"""Model families (opt-in scenario ``families``): per family, the engine vs sentence-transformers'
CrossEncoder on the same checkpoint, plus fastembed on our fp32 file, interleaved, 50 candidates
per request at short and mixed lengths: pairs/s, p50 and the ratios.

The checkpoints are RANDOM-INITIALISED at each family's published base configuration
(onnxrank.bench.family_checkpoints: ms-marco-MiniLM-L-6-v2, ms-marco-electra-base,
bge-reranker-base, gte-reranker-modernbert-base, mxbai-rerank-base-v1) with a tokenizer of the
family's kind trained on English text: random weights, speed only. Build and export them first
(tens of minutes on 2 cores)::

    python -m onnxrank.bench.family_checkpoints --size full --out checkpoints/families --export
    onnxrank bench --scenarios families --regimes short,mixed

Each family's model directory is ``--models-dir/<family>-random-reranker`` (what the builder
writes). No
budgets: the issue's promise (engine faster than sentence-transformers on every family) is read
from the ratios in the report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from onnxrank.bench.contenders import engine_contender, pairs_contender
from onnxrank.bench.family_checkpoints import FAMILY_NAMES, MODEL_SUFFIX, SPEED_ONLY
from onnxrank.bench.harness import Contender, StoppingRule, measure_interleaved, summarize
from onnxrank.bench.suite.bench_run import BenchRun, child_timer, make_baseline
from onnxrank.bench.workloads import (
    DEFAULT_SEED,
    PassageSource,
    Regime,
    Request,
    build_workload,
    load_dataset,
)
from onnxrank.engine.reranker import Reranker
from onnxrank.errors import MissingDependencyError, RerankError

SCENARIO = "families"
REGIMES = ("short", "mixed")
CANDIDATES = 50
QUERIES = 12
BASELINES = ("st", "fastembed_fp32")
TIME_CAP_S = 300.0


def family_model_dir(bench: BenchRun, family: str) -> Path:
    """`--models-dir/<family>-random-reranker`, or skip with the command that builds it."""
    directory = bench.models_dir / f"{family}{MODEL_SUFFIX}"
    if not (directory / "manifest.json").is_file():
        pytest.skip(f"no {directory.name} in {bench.models_dir}: build the family checkpoints "
                    "first (the commands are in onnxrank/bench/suite/test_families.py)")
    return directory


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_families(benchmark: Any, bench: BenchRun, device: str, regime: Regime,
                  family: str) -> None:
    label = f"{regime.name}/{family}"
    if regime.name not in REGIMES:
        pytest.skip(f"the families scenario runs the {', '.join(REGIMES)} regimes")
    bench.require_device(SCENARIO, label, device)
    model_dir = family_model_dir(bench, family)
    engine = Reranker.from_dir(model_dir, bench.engine_config(device))
    source = PassageSource(load_dataset(bench.dataset_path), engine.tokenizer)
    workload = build_workload(source, regime, queries=min(QUERIES, bench.sizes.latency_queries),
                              candidates=min(CANDIDATES, bench.sizes.candidates)
                              if bench.quick else CANDIDATES, seed=DEFAULT_SEED)
    items = [(request,) for request in workload.requests]
    contenders: list[Contender[Sequence[Request]]] = [engine_contender(
        "engine", f"onnxrank engine on {engine.spec.name} ({bench.engine_label()})", engine)]
    skipped: dict[str, str] = {}
    for name in BASELINES:
        try:
            baseline = make_baseline(name, engine.spec, model_dir, device=device,
                                     threads=bench.threads, peer_python=bench.peer_python)
        except (RerankError, MissingDependencyError, ValueError) as err:
            skipped[name] = f"skipped: {err}"
            continue
        contenders.append(pairs_contender(name, baseline.label, baseline.settings,
                                          baseline.score, child_timer(baseline)))
    ratios = [("engine", contender.name) for contender in contenders[1:]]
    stopping = StoppingRule(min_items=min(bench.sizes.min_items, len(items)),
                            max_items=len(items), time_cap_s=TIME_CAP_S)
    timings = measure_interleaved(benchmark, contenders, items,
                                  [len(request.documents) for request, in items],
                                  ratios=ratios, stopping=stopping)
    measured = workload.requests[:len(timings.seconds[contenders[0].name])]
    description = dataclasses.replace(workload, requests=measured).describe()
    description.update({"model": f"{engine.spec.name} ({family}): {SPEED_ONLY}",
                        "family": engine.spec.family, "variant": engine.device_info.variant,
                        "candidates": CANDIDATES})
    result = summarize(SCENARIO, label, device, contenders, timings, ratios=ratios,
                       skipped=skipped, workload=description)
    bench.record(benchmark, result, engine=engine)
