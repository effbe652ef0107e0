"""The peers scenario's parts: the peers against PyTorch fp32 on the tiny model, the child-process
worker driven through a real child interpreter, the fidelity columns, the Pareto verdict, its
budget kind and the report's peer table.

The OpenVINO peers' own environment is not here: the worker's ``torch`` kind runs in this
interpreter (sys.executable) and checks the protocol end to end; its OpenVINO kinds answer with a
typed error that the bench turns into the row's skip reason.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from onnxrank import Reranker
from onnxrank.bench import peer_worker
from onnxrank.bench.baselines import SentenceTransformersBaseline
from onnxrank.bench.budgets import BudgetFileError, check_budgets, load_budgets, verdict_table
from onnxrank.bench.environment import device_unavailable_reason
from onnxrank.bench.fidelity import (
    FIDELITY_TOLERANCES,
    fidelity,
    frontier_verdict,
    pareto_verdict,
)
from onnxrank.bench.harness import Contender, ScenarioResult, measure_interleaved
from onnxrank.bench.paths import DEFAULT_BUDGETS
from onnxrank.bench.peers import (
    FLASHRANK_DYNAMIC_FILE,
    CTranslate2Peer,
    FlashRankPeer,
    fastembed_peer,
    sentence_transformers_peer,
)
from onnxrank.bench.report import peer_section
from onnxrank.bench.suite.bench_run import BenchRun, make_baseline
from onnxrank.engine.spec import load_model_spec
from onnxrank.errors import DeviceUnavailableError, MissingDependencyError, ModelLoadError

pytestmark = pytest.mark.costly(10)

QUERY = "what is the pressure distribution on a wing at supersonic speed"
DOCUMENTS = [
    "the pressure distribution over a thin wing at supersonic speeds is computed by linear theory",
    "boundary layer transition on a flat plate",
    "heat transfer in hypersonic flow near a blunt nose, measured in a shock tunnel",
    "wing",
    "an experimental study of the pressure on delta wings at mach numbers from 1.5 to 3, with "
    "comparisons to slender body theory and to conical flow solutions",
    "the flutter of panels",
]
PAIRS = [(QUERY, document) for document in DOCUMENTS] + [("q2", "a second query's passage")]


def _logit(probabilities: np.ndarray) -> np.ndarray:
    return np.log(probabilities / (1.0 - probabilities))


@pytest.fixture(scope="module")
def fp32_logits(tiny_model_dir: Path) -> np.ndarray:
    """sentence-transformers' PyTorch fp32 logits of PAIRS."""
    baseline = SentenceTransformersBaseline(load_model_spec(tiny_model_dir), tiny_model_dir,
                                            device="cpu", threads=1)
    logits = baseline.score_logits(PAIRS)
    # the user's scores are the checkpoint's sigmoid of the same logits
    np.testing.assert_allclose(baseline.score(PAIRS), 1.0 / (1.0 + np.exp(-logits)), rtol=1e-5)
    return logits.astype(np.float64)


def test_ctranslate2_peer_follows_pytorch_fp32(tiny_model_dir: Path,
                                               fp32_logits: np.ndarray) -> None:
    peer = CTranslate2Peer(load_model_spec(tiny_model_dir), tiny_model_dir, device="cpu",
                           threads=1)
    scores = peer.score(PAIRS)
    # int8 weights and activations on a random tiny BERT: close to fp32, not equal
    np.testing.assert_allclose(scores, fp32_logits, rtol=0.1, atol=0.1,
                               err_msg=f"tiny-reranker ct2 {scores} vs fp32 {fp32_logits}")
    assert peer.settings["precision"].startswith("int8")
    # length-sorted batches scatter back to input order: one pair at a time gives the same
    one_by_one = np.concatenate([peer.score([pair]) for pair in PAIRS])
    np.testing.assert_allclose(scores, one_by_one, atol=1e-4)


def test_flashrank_peer_runs_our_int8_file_offline(tiny_model_dir: Path) -> None:
    spec = load_model_spec(tiny_model_dir)
    peer = FlashRankPeer(spec, tiny_model_dir, device="cpu", threads=1)
    scores = peer.score(PAIRS)
    # its sigmoid of the logits of our int8 file; onnxruntime on the same file gives the logits
    engine = Reranker.from_dir(tiny_model_dir, device="cpu", threads=1, backend="onnxruntime",
                               precision="int8")
    np.testing.assert_allclose(_logit(scores.astype(np.float64)), engine.score(PAIRS), atol=0.05)
    assert peer.settings["model_file"] == str(tiny_model_dir / spec.variants["int8"].file)


def test_flashrank_peer_quantizes_model_onnx_where_the_export_kept_no_int8(
        tiny_model_dir: Path, tmp_path: Path, fp32_logits: np.ndarray) -> None:
    import onnx

    model_dir = tmp_path / "no-int8"
    shutil.copytree(tiny_model_dir, model_dir)
    manifest = json.loads((model_dir / "manifest.json").read_text(encoding="utf-8"))
    (model_dir / manifest["variants"].pop("int8")["file"]).unlink()
    (model_dir / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    peer = FlashRankPeer(load_model_spec(model_dir), model_dir, device="cpu", threads=1)
    assert peer.settings["int8_file"].startswith("onnxruntime dynamic int8 of model.onnx")
    written = Path(peer.settings["model_file"])
    assert written.name == FLASHRANK_DYNAMIC_FILE and not written.is_relative_to(model_dir)
    ops = {node.op_type for node in onnx.load(str(written)).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    # int8, so near the fp32 logits (within 5% of their spread on the tiny model), same order
    logits = _logit(peer.score(PAIRS).astype(np.float64))
    np.testing.assert_allclose(logits, fp32_logits, atol=0.05 * np.ptp(fp32_logits))
    first = slice(0, len(DOCUMENTS))
    assert list(np.argsort(logits[first])) == list(np.argsort(fp32_logits[first]))


def test_child_peer_scores_through_a_real_child_interpreter(tiny_model_dir: Path,
                                                            fp32_logits: np.ndarray) -> None:
    peer = sentence_transformers_peer("torch", load_model_spec(tiny_model_dir), tiny_model_dir,
                                      device="cpu", threads=1, python=sys.executable)
    assert peer.name == "st_torch"
    assert peer.settings["python"] == sys.executable and peer.settings["precision"] == "fp32"
    np.testing.assert_allclose(peer.score(PAIRS), fp32_logits, atol=1e-4)
    assert len(peer.compute_s) == len(peer.round_trip_s) == 1
    assert peer.last_compute_s() == peer.compute_s[0] > 0.0
    assert peer.round_trip_s[0] >= 0.0


def test_a_child_without_the_peers_packages_answers_with_a_typed_error(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the peers' work dirs go
    with pytest.raises(MissingDependencyError, match=re.escape(
            "peer st_openvino: missing_dependency: peer 'openvino' needs optimum.intel, not "
            f"importable by {sys.executable}; build its environment as docs/peers.md")):
        sentence_transformers_peer("openvino", load_model_spec(tiny_model_dir), tiny_model_dir,
                                   device="cpu", threads=1, python=sys.executable)
    with pytest.raises(ModelLoadError, match="could not start the peer interpreter"):
        sentence_transformers_peer("openvino", load_model_spec(tiny_model_dir), tiny_model_dir,
                                   device="cpu", threads=1,
                                   python=str(tiny_model_dir / "no-such-python"))
    gc.collect()  # the first peer's finalizer; the second never started a child
    assert list(tmp_path.iterdir()) == []  # neither leaves its work directory behind


@pytest.mark.skipif(importlib.util.find_spec("fastembed") is not None,
                    reason="fastembed installs here: its rows run in this process")
def test_fastembed_runs_in_the_peer_environment_where_it_is_missing_here(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # fastembed pins huggingface-hub below today's stack: the bench runs its rows in a child of
    # --peer-python; here that child (this interpreter) lacks it too, and says so
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spec = load_model_spec(tiny_model_dir)
    with pytest.raises(MissingDependencyError, match=re.escape(
            'pip install "onnxrank[fastembed]"') + ".*--peer-python"):
        make_baseline("fastembed", spec, tiny_model_dir, device="cpu", threads=1,
                      peer_python=None)
    with pytest.raises(MissingDependencyError, match=re.escape(
            "peer fastembed_fp32: missing_dependency: peer 'fastembed' needs fastembed, not "
            f"importable by {sys.executable}")):
        make_baseline("fastembed_fp32", spec, tiny_model_dir, device="cpu", threads=1,
                      peer_python=sys.executable)
    with pytest.raises(DeviceUnavailableError, match="fastembed's CPU path only"):
        fastembed_peer(spec, tiny_model_dir, name="fastembed", device="cuda", threads=1,
                       python=sys.executable)
    gc.collect()
    assert list(tmp_path.iterdir()) == []  # the child's work directory and the file view


def test_worker_protocol_errors() -> None:
    requests = [{"op": "score", "pairs": [["q", "d"]]}, {"op": "load", "kind": "onnx"},
                {"op": "fly"}]
    completed = subprocess.run(
        [sys.executable, "-I", peer_worker.__file__],
        input="\n".join(json.dumps(request) for request in requests) + "\nnot json\n",
        capture_output=True, text=True, timeout=60, check=True)
    replies = [json.loads(line) for line in completed.stdout.splitlines()]
    assert [(reply["ok"], reply["error"]) for reply in replies] == [(False, "bad_request")] * 4
    assert replies[1]["message"] == (
        "kind must be one of torch, openvino, openvino_int8, fastembed, got 'onnx'")


def test_fastest_keeps_the_quickest_candidate_and_times_each_in_every_round() -> None:
    """The OpenVINO peers' precision choice (their faster hint): every candidate is called once
    untimed and once per round, and the one with the least best time wins."""
    calls: dict[str, int] = {"slow": 0, "quick": 0}

    def run(name: str, seconds: float):
        def call() -> None:
            calls[name] += 1
            time.sleep(seconds)
        return call

    chosen, times = peer_worker.fastest({"slow": run("slow", 0.03), "quick": run("quick", 0.0)},
                                        rounds=2)
    assert chosen == "quick" and calls == {"slow": 3, "quick": 3}
    assert times["slow"] >= 30.0 > times["quick"] >= 0.0
    for candidates, rounds in (({}, 3), ({"only": lambda: None}, 0)):
        with pytest.raises(ValueError, match="fastest needs candidates and rounds >= 1"):
            peer_worker.fastest(candidates, rounds=rounds)


def test_fidelity_on_constructed_rankings() -> None:
    reference = [np.arange(12.0), np.arange(5.0)]
    assert fidelity(reference, reference) == {"queries": 2, "spearman": 1.0,
                                              "top10_overlap": 1.0, "top10_overlap_min": 1.0}
    # first query reversed: Spearman -1 and 8 of its top 10 kept (12 candidates); second intact
    result = fidelity(reference, [-reference[0], reference[1]])
    assert result["spearman"] == pytest.approx(0.0)
    assert result["top10_overlap"] == pytest.approx((8 / 10 + 1.0) / 2)
    assert result["top10_overlap_min"] == pytest.approx(0.8)
    with pytest.raises(ValueError, match="same number"):
        fidelity(reference, reference[:1])


def _ratio(low: float | None, median: float, high: float | None) -> dict[str, float | None]:
    return {"ci_low": low, "median": median, "ci_high": high, "n": 6 if low else 2}


@pytest.mark.parametrize(("ratio", "engine", "verdict", "faster", "faithful"), [
    (_ratio(1.05, 1.10, 1.20), (0.990, 0.95), "yes", True, True),
    # interval touching 1: not known to be faster
    (_ratio(0.98, 1.10, 1.20), (0.990, 0.95), "no", False, True),
    # too few queries for an interval
    (_ratio(None, 3.00, None), (0.990, 0.95), "no", False, True),
    (None, (0.990, 0.95), "no", False, True),
    # within the tolerances below the peer: still no lower fidelity
    (_ratio(1.05, 1.10, 1.20), (0.991 - FIDELITY_TOLERANCES["spearman"],
                                0.95 - FIDELITY_TOLERANCES["top10_overlap"]), "yes", True, True),
    # past a tolerance: lower fidelity
    (_ratio(1.05, 1.10, 1.20), (0.985, 0.95), "no", True, False),
    (_ratio(1.05, 1.10, 1.20), (0.990, 0.90), "no", True, False),
])
def test_pareto_verdict(ratio: dict[str, float | None] | None, engine: tuple[float, float],
                        verdict: str, faster: bool, faithful: bool) -> None:
    peer = {"spearman": 0.991, "top10_overlap": 0.95}
    result = pareto_verdict(ratio, {"spearman": engine[0], "top10_overlap": engine[1]}, peer)
    assert (result["verdict"], result["faster"], result["no_lower_fidelity"]) == (
        verdict, faster, faithful), result["why"]


def _row(verdict: str, why: str) -> dict[str, str]:
    return {"verdict": verdict, "why": why}


def test_frontier_verdict_names_the_first_engine_row_that_beats_the_peer() -> None:
    both = frontier_verdict({"engine": _row("yes", "fast"), "engine_float": _row("yes", "exact")})
    assert (both["verdict"], both["by"], both["why"]) == ("yes", "engine", "fast")
    floated = frontier_verdict({"engine": _row("no", "spearman lower"),
                                "engine_float": _row("yes", "interval 1.2-1.3x > 1")})
    assert (floated["verdict"], floated["by"], floated["why"]) == (
        "yes", "engine_float", "interval 1.2-1.3x > 1")
    assert set(floated["rows"]) == {"engine", "engine_float"}
    neither = frontier_verdict({"engine": _row("no", "slower"),
                                "engine_float": _row("no", "much slower")})
    assert (neither["verdict"], neither["by"], neither["why"]) == (
        "no", None, "engine: slower; engine_float: much slower")
    with pytest.raises(ValueError, match="at least one engine row"):
        frontier_verdict({})


def _peers_result(verdicts: dict[str, str]) -> ScenarioResult:
    stats = {"p50_ms": 10.0}
    fidelity_row = {"queries": 6, "spearman": 0.99, "top10_overlap": 0.95}
    return ScenarioResult(
        scenario="peers", regime="short", device="cpu",
        contenders={name: {"label": name, "settings": {}, "stats": stats}
                    for name in ("engine", "st", *verdicts)},
        ratios={f"engine/{name}": {**_ratio(1.1, 1.2, 1.3), "n": 6} for name in verdicts},
        skipped={"st_openvino": "skipped: not run: pass --peer-python PATH"},
        fidelity={name: fidelity_row for name in ("engine", "st", *verdicts)},
        pareto={name: frontier_verdict({"engine": _row(verdict, f"because {verdict}")})
                for name, verdict in verdicts.items()})


def test_pareto_budgets_hold_where_the_row_is_measured(tmp_path: Path) -> None:
    path = tmp_path / "budgets.toml"
    path.write_text('[calibration]\nreference_ms = 10.0\nmodel = "*"\n' + "".join(
        f'[[cpu]]\nscenario = "peers"\npareto = "{name}"\n'
        for name in ("ct2", "flashrank", "st_openvino")))
    verdicts = check_budgets(load_budgets(path), _peers_result({"ct2": "yes", "flashrank": "no"}),
                             model="tiny", scale=1.0, machine_class="amx")
    assert [(v.budget.subject, v.measured_text(), v.verdict) for v in verdicts] == [
        ("ct2", "yes", "ok"), ("flashrank", "no", "FAIL"),
        ("st_openvino", "-", "not measured: skipped: not run: pass --peer-python PATH")]
    assert re.search(r"peers/short flashrank pareto +cpu +any +no +>= yes +FAIL",
                     verdict_table(verdicts))


def test_fidelity_floors_read_the_contenders_fidelity_row(tmp_path: Path) -> None:
    path = tmp_path / "budgets.toml"
    path.write_text('[calibration]\nreference_ms = 10.0\nmodel = "*"\n'
                    '[[cpu]]\nscenario = "peers"\nmin_spearman = 0.99\nmin_top10_overlap = 0.96\n'
                    '[[cpu]]\nscenario = "peers"\ncontender = "st_openvino"\nmin_spearman = 0.98\n')
    verdicts = check_budgets(load_budgets(path), _peers_result({"ct2": "yes"}), model="tiny",
                             scale=1.0, machine_class="amx")
    # the rows read 0.99 / 0.95; st_openvino was skipped
    assert [(v.budget.subject, v.budget.metric, v.measured_text(), v.limit_text(), v.verdict)
            for v in verdicts] == [
        ("engine", "spearman", "0.9900", ">= 0.9900", "ok"),
        ("engine", "top10_overlap", "0.9500", ">= 0.9600", "FAIL"),
        ("st_openvino", "spearman", "-", ">= 0.9800",
         "not measured: skipped: not run: pass --peer-python PATH")]
    path.write_text('[calibration]\nreference_ms = 10.0\n'
                    '[[cpu]]\nscenario = "peers"\nmin_top10_overlap = 95\n')
    with pytest.raises(BudgetFileError, match=r"min_top10_overlap is a mean per-query agreement "
                                              r"in \(0, 1\], got 95.0"):
        load_budgets(path)


def test_shipped_pareto_budgets_are_for_the_promise_class_and_where_measured() -> None:
    pareto = {(b.subject, b.machine_classes) for b in load_budgets(DEFAULT_BUDGETS).budgets
              if b.metric == "pareto"}
    # the class of issue 53's promise, and amx, where the verdicts were measured
    assert pareto == {(name, (machine_class,))
                      for name in ("ct2", "st_openvino", "st_openvino_int8")
                      for machine_class in ("avx512_vnni_bf16", "amx")}


def test_report_peer_table() -> None:
    lines = peer_section([_peers_result({"ct2": "yes"})])
    table = "\n".join(lines)
    assert "| short | engine: engine | 1 | 10.0 | 0.9900 | 0.950 | 6 | - | - |" in table
    assert "| short | st: st | - | 10.0 | 0.9900 | 0.950 | 6 | - | reference |" in table
    assert ("| short | ct2: ct2 | 1.20x [1.10-1.30] | 10.0 | 0.9900 | 0.950 | 6 | - | "
            "**yes** by engine (because yes) |") in table
    assert ("| short | st_openvino: skipped: not run: pass --peer-python PATH |  |  |  |  |  |  | "
            "not measured |") in table
    assert peer_section([]) == []


class _Engines:
    """What float_engine asks of the bench: engines of the tiny model by precision."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir

    def engine(self, device: str, **overrides: Any) -> Reranker:
        return Reranker.from_dir(self.model_dir, device=device, threads=1, **overrides)


def test_the_float_row_is_left_out_where_the_defaults_run_it(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from onnxrank.bench.suite import test_peers

    monkeypatch.setitem(test_peers.FLOAT_PRECISIONS, "cpu", ("fp32", "fp16"))  # fp16: refused
    bench = cast(BenchRun, _Engines(tiny_model_dir))
    int8 = bench.engine("cpu", precision="int8")
    floated = test_peers.float_engine(bench, "cpu", int8)
    assert not isinstance(floated, str), floated
    engine, settings = floated
    assert engine.device_info.precision in ("fp32", "fp16")
    assert set(settings["precision_probe_ms"]) | set(settings["precisions_refused"]) == {
        "fp32", "fp16"}
    monkeypatch.setitem(test_peers.FLOAT_PRECISIONS, "cpu", ("fp32",))
    assert test_peers.float_engine(bench, "cpu", bench.engine("cpu", precision="fp32")) == (
        f"skipped: the defaults already run fp32 on "
        f"{bench.engine('cpu', precision='fp32').device_info.backend}, the faster float "
        "precision here")
    if device_unavailable_reason("cuda") is not None:  # every CUDA precision is refused here
        reason = test_peers.float_engine(bench, "cuda", int8)
        assert isinstance(reason, str) and reason.startswith(
            "skipped: no float precision runs here: fp32: device='cuda' was requested but")


def test_the_harness_times_a_contender_by_its_own_timer(benchmark) -> None:
    own = Contender(name="child", label="child", run=lambda item: None, timer=lambda: 7.0)
    wall = Contender(name="engine", label="engine", run=lambda item: None)
    timings = measure_interleaved(benchmark, [wall, own], [0, 1, 2], [1, 1, 1])
    assert timings.seconds["child"] == [7.0, 7.0, 7.0]
    assert all(0.0 <= seconds < 1.0 for seconds in timings.seconds["engine"])
