"""Peers: the engine against the fastest paths users already have, on time and on fidelity.

Every contender reranks the same queries interleaved, as in the latency scenario: the engine at
its defaults and at its faster float precision (fp32 or bf16 on a CPU, fp32 or fp16 on CUDA,
picked as the OpenVINO peers pick theirs), sentence-transformers on PyTorch fp32 (also the
fidelity reference) and, on CUDA, fp16; on CPU CTranslate2 int8, FlashRank and, with
--peer-python, sentence-transformers on OpenVINO and its static int8 export in a child process
(onnxrank.bench.peers). A peer that does not run on the device is skipped with its reason. Each
row has its time ratio against the engine and its fidelity to PyTorch fp32 on the queries it was
timed on; the report's verdict for every peer: is the engine, at its defaults or at float
precision, faster at no lower fidelity (onnxrank.bench.fidelity)? Budgets of kind ``pareto``
enforce it per machine class.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from onnxrank import Reranker
from onnxrank.bench.contenders import engine_settings
from onnxrank.bench.fidelity import REFERENCE, fidelity, frontier_verdict, pareto_verdict
from onnxrank.bench.harness import Contender, ScenarioResult, median_stats
from onnxrank.bench.peer_worker import BATCH_SIZE, fastest
from onnxrank.bench.peers import CHILD_PEERS, ONNX_SKIP_REASON, ChildPeer, child_peer_name
from onnxrank.bench.suite.bench_run import BenchRun
from onnxrank.bench.workloads import Regime, Request
from onnxrank.errors import MissingDependencyError, RerankError
from onnxrank.export.validate import load_calibration_pairs
from onnxrank.types import Device, Pair

SCENARIO = "peers"
# the regimes of the product's promises; the others are the latency scenario's
REGIMES = ("short", "mixed")
IN_PROCESS_PEERS = (REFERENCE, "st_fp16", "ct2", "flashrank")
ENGINE = "engine"
FLOAT_ENGINE = "engine_float"
# The float precisions the engine row at fp32's fidelity picks from, per device: a peer that keeps
# fp32's fidelity (OpenVINO at f32 or bf16) meets the engine at its own faster float precision.
FLOAT_PRECISIONS = {Device.CPU.value: ("fp32", "bf16"), Device.CUDA.value: ("fp32", "fp16")}

Scored = dict[int, np.ndarray]  # id(request) -> its scores, in document order


def _scoring(name: str, label: str, settings: dict[str, Any],
             score: Callable[[Sequence[Pair]], Any], store: Scored,
             timer: Callable[[], float] | None = None) -> Contender[Sequence[Request]]:
    """Scores each request of a chunk and keeps its scores for the fidelity columns."""
    def run(chunk: Sequence[Request]) -> None:
        for request in chunk:
            store[id(request)] = np.asarray(
                score([(request.query, document) for document in request.documents]),
                dtype=np.float64)
    return Contender(name=name, label=label, run=run, settings=settings, timer=timer)


def float_engine(bench: BenchRun, device: str,
                 default: Reranker) -> tuple[Reranker, dict[str, Any]] | str:
    """The engine at its faster float precision on `device`, picked as the OpenVINO peers pick
    theirs (peer_worker.fastest on the first BATCH_SIZE calibration pairs), with its settings and
    each precision's probe time or why it does not run; or why the row is not needed: no float
    precision runs, or the `default` engine already runs the chosen one (amx's bf16)."""
    loaded: dict[str, Reranker] = {}
    refused: dict[str, str] = {}
    for precision in FLOAT_PRECISIONS[device]:
        try:
            loaded[precision] = bench.engine(device, precision=precision)
        except (RerankError, MissingDependencyError) as err:  # e.g. bf16 on a CPU without BF16
            refused[precision] = str(err)
    if not loaded:
        return "skipped: no float precision runs here: " + "; ".join(
            f"{precision}: {reason}" for precision, reason in refused.items())
    pairs = [(pair.query, pair.passage) for pair in load_calibration_pairs()[:BATCH_SIZE]]
    chosen, times = fastest({precision: functools.partial(engine.score, pairs)
                             for precision, engine in loaded.items()})
    running = loaded[chosen].device_info
    if (running.backend, running.model_file, running.precision) == (
            default.device_info.backend, default.device_info.model_file,
            default.device_info.precision):
        return (f"skipped: the defaults already run {running.precision} on {running.backend}, "
                f"the faster float precision here")
    return loaded[chosen], {**engine_settings(loaded[chosen]), "precision_probe_ms": times,
                            "precisions_refused": refused}


def _with_fidelity(bench: BenchRun, result: ScenarioResult, requests: Sequence[Request],
                   scored: dict[str, Scored], peers: Sequence[str]) -> ScenarioResult:
    """The result with every contender's fidelity to PyTorch fp32 (on the requests it ran) and
    the verdict for every peer; fp32 scores of requests its timed runs did not reach are computed
    now, untimed."""
    reference = bench.baseline(REFERENCE, result.device)
    if isinstance(reference, str):
        return dataclasses.replace(result, pareto={name: {
            "verdict": "not measured", "why": f"no fp32 reference: {reference}"} for name in peers})
    truth = scored.setdefault(REFERENCE, {})
    timed = {key for store in scored.values() for key in store}
    for request in requests:
        if id(request) in timed and id(request) not in truth:
            truth[id(request)] = np.asarray(reference.score_logits(
                [(request.query, document) for document in request.documents]), dtype=np.float64)
    table = {}
    for name, store in scored.items():
        ran = [request for request in requests if id(request) in store]
        table[name] = fidelity([truth[id(r)] for r in ran], [store[id(r)] for r in ran])
    engines = [name for name in (ENGINE, FLOAT_ENGINE) if name in table]
    verdicts = {name: frontier_verdict({
        engine: pareto_verdict(result.ratios.get(f"{engine}/{name}"), table[engine], table[name])
        for engine in engines}) for name in peers if name in table}
    return dataclasses.replace(result, fidelity=table, pareto=verdicts)


def test_peers(benchmark: Any, bench: BenchRun, device: str, regime: Regime) -> None:
    if regime.name not in REGIMES:
        pytest.skip(f"the peer table measures {' and '.join(REGIMES)}")
    bench.require_device(SCENARIO, regime.name, device)
    workload = bench.workload(regime, bench.sizes.latency_queries)
    scored: dict[str, Scored] = {ENGINE: {}}
    engine = bench.engine(device)
    contenders = [_scoring(ENGINE, f"onnxrank engine ({bench.engine_label()})",
                           engine_settings(engine), engine.score, scored[ENGINE])]
    skipped = {"st_onnx_int8": ONNX_SKIP_REASON}
    floated = float_engine(bench, device, engine)
    if isinstance(floated, str):
        skipped[FLOAT_ENGINE] = floated
    else:
        contenders.append(_scoring(
            FLOAT_ENGINE, f"onnxrank engine at its faster float precision here "
            f"({floated[0].device_info.precision})", floated[1], floated[0].score,
            scored.setdefault(FLOAT_ENGINE, {})))
    engines = [contender.name for contender in contenders]
    children: dict[str, ChildPeer] = {}
    found = [(name, bench.baseline(name, device)) for name in IN_PROCESS_PEERS]
    found += [(child_peer_name(kind), bench.child_peer(kind, device)) for kind in CHILD_PEERS]
    for name, peer in found:
        if isinstance(peer, str):
            skipped[name] = peer
            continue
        timer = None
        if isinstance(peer, ChildPeer):
            children[name] = peer
            timer = peer.last_compute_s
        # the fp32 reference scores logits (its sigmoid would tie the most confident at 1.0)
        score = peer.score_logits if name == REFERENCE else peer.score
        contenders.append(_scoring(name, peer.label, peer.settings, score,
                                   scored.setdefault(name, {}), timer))
    peers = [contender.name for contender in contenders[len(engines):]]
    # fp32 is the reference: its fidelity is 1 by definition, so no verdict is read against it
    judged = [name for name in peers if name != REFERENCE]
    for child in children.values():  # this measurement's pipe round trips only
        child.round_trip_s.clear()

    def annotate(result: ScenarioResult) -> ScenarioResult:
        for name, child in children.items():
            result.contenders[name]["pipe_round_trip_ms"] = median_stats(
                [seconds * 1000.0 for seconds in child.round_trip_s])
        return _with_fidelity(bench, result, workload.requests, scored, judged)

    bench.compare(
        benchmark, scenario=SCENARIO, regime=regime.name, device=device, contenders=contenders,
        items=[(request,) for request in workload.requests],
        pairs_per_item=[len(request.documents) for request in workload.requests],
        ratios=[(engine, name) for engine in engines for name in peers]
        + [(ENGINE, name) for name in engines[1:]], skipped=skipped, workload=workload,
        annotate=annotate)
