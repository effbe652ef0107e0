"""`onnxrank bench` runs of the checkout on the tiny model: a full run enforces its budgets and
exits non-zero when one is broken, a quick run only reports them, and every engine flag and its
twin reaches every engine contender.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import bench_outside_xdist
import onnxruntime as ort
import pytest
import worker_cores

pytestmark = pytest.mark.costly(85)

REPOSITORY = Path(__file__).resolve().parents[2]
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def _bench(cwd: Path, *args: str, **environment: str) -> subprocess.CompletedProcess[str]:
    """`onnxrank bench` of the checkout, in a subprocess, with `environment` added to ours."""
    return subprocess.run([sys.executable, "-m", "onnxrank", "bench", *args], cwd=cwd,
                          env=bench_outside_xdist.environment(**environment),
                          preexec_fn=worker_cores.all_cores, capture_output=True,
                          text=True, timeout=900)


def _small_dataset(directory: Path) -> Path:
    """Three queries and forty short documents of real words (enough for `short` passages)."""
    directory.mkdir()
    words = ("wing flutter boundary layer shock wave heat transfer pressure gradient supersonic "
             "nozzle plate cylinder laminar turbulent flow vortex").split()
    with open(directory / "corpus.jsonl", "w") as corpus:
        for number in range(40):
            text = " ".join(words[(number + step) % len(words)] for step in range(60))
            corpus.write(json.dumps({"id": str(number), "title": "", "text": text}) + "\n")
    queries = ["what is wing flutter", "laminar flow over a plate", "shock wave in a nozzle"]
    with open(directory / "queries.jsonl", "w") as handle:
        for number, query in enumerate(queries):
            handle.write(json.dumps({"id": str(number), "text": query}) + "\n")
    return directory


def test_a_full_run_enforces_budgets_and_takes_queries_threads_dataset(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    budgets = tmp_path / "impossible.toml"
    budgets.write_text('model = "*"\n[calibration]\nreference_ms = 1000000.0\n'
                       '[[cpu]]\nscenario = "latency"\nregime = "short"\np50_ms = 0.001\n'
                       # a floor that follows the GEMM ceilings the same run measured
                       '[[cpu]]\nscenario = "latency"\nregime = "short"\n'
                       'ratio = "engine/naive_ort"\n'
                       'min_ratio = { base = 1000.0, gemm_share = 0.5, ceilings = "best/fp32" }\n')
    dataset = _small_dataset(tmp_path / "tiny-collection")
    out = tmp_path / "report"
    completed = _bench(tmp_path, "--model", str(tiny_model_dir), "--device", "cpu",
                       "--scenarios", "latency", "--regimes", "short", "--budgets", str(budgets),
                       "--queries", "1", "--threads", "1", "--dataset", str(dataset),
                       "--out", str(out))
    assert completed.returncode == 1, completed.stdout[-4000:] + completed.stderr[-4000:]
    assert "budget broken" in completed.stdout
    assert re.search(r"latency/short engine p50_ms\s+cpu\s+any\s+[\d.]+ ms\s+<= 0\.00 ms\s+FAIL",
                     completed.stdout)
    assert re.search(r"latency/short engine/naive_ort ratio\s+cpu\s+any\s+[\d.]+x\s+"
                     r">= [\d.]+x \[1\]\s+FAIL", completed.stdout)
    assert re.search(r"\[1\] latency/short engine/naive_ort ratio: budget = 1000\.00 / "
                     r"\(0\.50 \+ 0\.50 / [\d.]+\); [\d.]+ = best \((int8|bf16|fp32)\) [\d]+ / "
                     r"fp32 [\d]+ GOP/s", completed.stdout)
    assert "2 budget(s) broken" in completed.stdout
    summary = json.loads((out / "summary.json").read_text())
    [scaled] = [v for v in summary["budgets"] if v["subject"] == "engine/naive_ort"]
    assert scaled["scaling"] == {"base": 1000.0, "gemm_share": 0.5, "faster": "best",
                                 "slower": "fp32"}
    assert scaled["allowed"] > 1000.0 and scaled["derivation"].startswith("1000.00 / (0.50 + ")
    assert summary["run"]["quick"] is False and summary["run"]["threads"] == 1
    assert summary["run"]["dataset"] == str(dataset)
    [latency] = [r for r in summary["results"] if r["scenario"] == "latency"]
    assert latency["workload"]["dataset"] == "tiny-collection"
    assert latency["workload"]["queries"] == 1 and latency["workload"]["pairs"] == 50
    for name, contender in latency["contenders"].items():
        assert contender["stats"]["n"] == 1, name
        assert contender["settings"]["threads"] == 1, name


@pytest.fixture(scope="module")
def quick_run_with_flags(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                         ) -> tuple[subprocess.CompletedProcess[str], Path]:
    """One quick run (latency and sweeps) with the engine's flags and twins set and a budget no
    engine can meet: the two tests below read it (a bench run costs about 20 s here)."""
    work = tmp_path_factory.mktemp("quick-flags")
    budgets = work / "impossible.toml"
    budgets.write_text('model = "*"\n[calibration]\nreference_ms = 1000000.0\n'
                       '[[cpu]]\nscenario = "latency"\nregime = "short"\np50_ms = 0.001\n')
    # --precision as a flag, max_batch_size through its global twin; ONNXRANK_THREADS is the
    # engine's twin, which the bench's own --threads (ONNXRANK_BENCH_THREADS) does not read.
    out = work / "report"
    completed = _bench(work, "--quick", "--model", str(tiny_model_dir), "--device", "cpu",
                       "--scenarios", "latency,sweeps", "--regimes", "short", "--precision", "fp32",
                       "--budgets", str(budgets), "--out", str(out),
                       ONNXRANK_MAX_BATCH_SIZE="32", ONNXRANK_THREADS="1")
    return completed, out


def test_a_quick_run_does_not_fail_on_a_broken_budget(
        quick_run_with_flags: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    completed, _ = quick_run_with_flags
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    assert re.search(r"latency/short engine p50_ms\s+cpu\s+any\s+[\d.]+ ms\s+<= 0\.00 ms\s+not "
                     r"enforced: quick run", completed.stdout)
    assert "no enforced budget broken" in completed.stdout


def test_engine_flags_and_twins_reach_every_engine_contender(
        quick_run_with_flags: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    completed, out = quick_run_with_flags
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    changed = "defaults except precision='fp32', max_batch_size=32"
    assert f"engine options: {changed}" in completed.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["engine_options"] == {"precision": "fp32", "max_batch_size": 32}
    assert summary["run"]["threads"] > 1, "ONNXRANK_THREADS must not set the bench's threads"
    assert f"- Engine options: {changed} (every engine contender" in (
        out / "summary.md").read_text()
    measured = {r["scenario"]: r for r in summary["results"] if r["status"] == "measured"
                and r["regime"] in ("short", "mixed", "medium")}
    engine = measured["latency"]["contenders"]["engine"]
    assert engine["label"] == f"onnxrank engine ({changed})"
    assert (engine["settings"]["precision"], engine["settings"]["variant"],
            engine["settings"]["max_batch_size"]) == ("fp32", "fp32", 32)
    # a sweep varies its own setting on top of the user's others
    padding = measured["padding"]["contenders"]
    assert padding["length_sorted"]["label"] == f"length-sorted token budget (engine {changed})"
    assert padding["no_padding"]["settings"]["max_batch_size"] == 1
    assert {padding[name]["settings"]["precision"] for name in (
        "length_sorted", "input_order", "pad_to_max", "no_padding")} == {"fp32"}
    sizes = measured["max_batch_size"]["contenders"]
    assert {name: c["settings"]["max_batch_size"] for name, c in sizes.items()} == {
        "max_batch_size=64": 64, "max_batch_size=8": 8}
    assert {c["settings"]["precision"] for c in sizes.values()} == {"fp32"}
    tokens = measured["max_batch_tokens"]["contenders"].values()
    assert {(c["settings"]["precision"], c["settings"]["max_batch_size"]) for c in tokens} == {
        ("fp32", 1024)}
    assert measured["precision"]["contenders"]["ort_int8"]["settings"]["precision"] == "int8"
    threads = measured["threads"]["contenders"]["threads=1"]["settings"]
    assert (threads["threads"], threads["precision"], threads["max_batch_size"]) == (1, "fp32", 32)



@pytest.mark.slow
def test_quick_run_exits_0_with_the_full_size_standin() -> None:
    """After the README's main command (models/minilm-standin exported), `--quick` passes."""
    standin = REPOSITORY / "models" / "minilm-standin" / "manifest.json"
    assert standin.is_file(), "run the README's main command first (it exports the stand-in)"
    completed = _bench(REPOSITORY, "--quick", "--out", "bench-results/quick-standin")
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]


@pytest.mark.gpu
def test_cuda_rows_are_measured_on_cuda(tiny_cuda_model_dir: Path, tmp_path: Path) -> None:
    if not HAS_CUDA:
        pytest.skip("needs a working CUDAExecutionProvider")
    completed = _bench(tmp_path, "--quick", "--model", str(tiny_cuda_model_dir),
                       "--device", "cuda", "--scenarios", "latency,peers", "--regimes", "short",
                       "--out", str(tmp_path / "report"))
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    [row] = [r for r in summary["results"] if r["scenario"] == "latency"]
    assert row["device"] == "cuda" and row["status"] == "measured"
    assert row["contenders"]["engine"]["settings"]["provider"] == "CUDAExecutionProvider"
    assert row["contenders"]["engine"]["settings"]["variant"] == "fp16"
    assert "CPU path only" in row["skipped"]["fastembed"]
    # the GPU's peer table: sentence-transformers on PyTorch fp16 beside the fp32 reference, each
    # with its fidelity and the engine's verdict; the CPU-only peers skipped with their reason
    [peers] = [r for r in summary["results"] if r["scenario"] == "peers"]
    assert peers["device"] == "cuda" and peers["status"] == "measured"
    settings = peers["contenders"]["st_fp16"]["settings"]
    assert (settings["device"], settings["precision"]) == ("cuda", "fp16")
    assert {"engine", "st", "st_fp16"} <= set(peers["fidelity"])
    assert peers["pareto"]["st_fp16"]["verdict"] in {"yes", "no"}
    assert "CPU only" in peers["skipped"]["ct2"]
