"""`onnxrank bench` end to end: the quick suite on the tiny model from an installed wheel, its
outputs, budgets (not enforced in a quick run, failing a full one), every flag and its twin.

The numbers of a tiny-model run mean nothing; these tests check that the suite runs every
scenario outside a checkout, writes its JSON/markdown/PNG report where the user stands, says what it
could not run, gives every contender's share of the hardware ceiling, and exits non-zero when an
enforced budget is broken.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import bench_outside_xdist
import onnxruntime as ort
import openvino
import pytest

from onnxrank.bench.ceiling import GEMM_PRECISIONS
from onnxrank.bench.contenders import bench_engine_options, describe_engine_options
from onnxrank.bench.machine import classify, read_cpu
from onnxrank.bench.paths import DEFAULT_BUDGETS, DEFAULT_DATASET, DEFAULT_OUT
from onnxrank.cli import bench_cmd, build_parser, main
from onnxrank.cli.bench_cmd import OPT_IN_SCENARIO_FILES, SCENARIO_FILES, parse_scenarios, scenario_files
from onnxrank.engine.reranker import Reranker
from onnxrank.engine.runtime import default_choice_cache

pytestmark = pytest.mark.costly(150)

REPOSITORY = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()
HAS_BF16 = "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
SHIPPED_SUITE_FILES = (
    "onnxrank/bench/suite/conftest.py", "onnxrank/bench/suite/test_ceiling.py",
    "onnxrank/bench/suite/test_latency.py", "onnxrank/bench/suite/budgets.toml",
    "onnxrank/bench/suite/pytest.ini", "onnxrank/bench/suite/data/README.md",
    "onnxrank/bench/suite/data/cranfield-sample/corpus.jsonl",
    "onnxrank/bench/suite/data/cranfield-sample/queries.jsonl",
)


def _bench(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`onnxrank bench` of the checkout, in a subprocess."""
    return subprocess.run([sys.executable, "-m", "onnxrank", "bench", *args], cwd=cwd,
                          env=bench_outside_xdist.environment(), capture_output=True, text=True,
                          timeout=900)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package built as a wheel and installed (not editable) into a directory of its own."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPOSITORY / name, source / name)
    shutil.copytree(REPOSITORY / "onnxrank", source / "onnxrank",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(work / "dist"), str(source)], check=True, timeout=300)
    [wheel] = (work / "dist").glob("onnxrank-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in SHIPPED_SUITE_FILES if name not in names]
    assert not missing, f"{wheel.name} lacks {missing}"
    site = work / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True, timeout=300)
    return site


@pytest.fixture(scope="module")
def quick_run(installed: Path, tiny_model_dir: Path, tiny_embedder_dir: Path,
              tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[subprocess.CompletedProcess[str], Path]:
    # A directory with no checkout in sight; the installed console script; no --out.
    work = tmp_path_factory.mktemp("bench-quick")
    environment = bench_outside_xdist.environment(PYTHONPATH=str(installed))
    where = subprocess.run([sys.executable, "-c", "import onnxrank; print(onnxrank.__file__)"],
                           cwd=work, env=environment, capture_output=True, text=True, check=True)
    assert where.stdout.strip() == str(installed / "onnxrank" / "__init__.py")
    completed = subprocess.run(
        # every default scenario, serving included (its servers and report plot)
        [str(installed / "bin" / "onnxrank"), "bench", "--quick", "--model", str(tiny_model_dir),
         "--embedder", str(tiny_embedder_dir)],
        cwd=work, env=environment, capture_output=True, text=True, timeout=900,
    )
    return completed, work


def test_quick_run_from_the_installed_package_writes_every_output_in_the_cwd(
        quick_run, installed: Path) -> None:
    completed, work = quick_run
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    out = work / DEFAULT_OUT
    for name in ("summary.json", "summary.md", "pytest-benchmark.json"):
        assert (out / name).stat().st_size > 0, name
    for name in ("latency.png", "throughput_vs_max_batch_tokens.png", "padding.png", "serving.png"):
        width, height = _png_size(out / name)
        assert width >= 600 and height >= 400, (name, width, height)
    run = json.loads((out / "summary.json").read_text())["run"]
    # the shipped dataset and budgets, read from the installed package
    suite = installed / "onnxrank" / "bench" / "suite"
    assert run["dataset"] == str(suite / "data" / "cranfield-sample")
    assert run["budgets_file"] == str(suite / "budgets.toml")
    assert run["machine"]["git_commit"].startswith("not a git checkout: onnxrank 0.1.0")
    assert not list((installed / "onnxrank").rglob("summary.json")), "a report went into the package"


def test_summary_covers_scenarios_devices_and_baselines(quick_run) -> None:
    _, work = quick_run
    summary = json.loads((work / DEFAULT_OUT / "summary.json").read_text())
    assert summary["run"]["quick"] is True
    assert summary["run"]["model"]["name"] == "tiny-reranker"
    measured = {(r["scenario"], r["regime"], r["device"]): r for r in summary["results"]
                if r["status"] == "measured"}
    for regime in ("short", "medium", "long", "mixed"):
        latency = measured[("latency", regime, "cpu")]
        assert set(latency["contenders"]) == {"engine", "st", "naive_ort", "fastembed",
                                              "fastembed_fp32"}
        assert latency["contenders"]["engine"]["stats"]["n"] == 2
        assert {"engine/st", "engine/naive_ort", "engine/fastembed",
                "engine/fastembed_fp32"} <= set(latency["ratios"])
        assert "FlashRank skipped" in latency["skipped"]["flashrank"]
        assert ("throughput", regime, "cpu") in measured
    for scenario, regime in [("ceiling", "gemm"), ("padding", "mixed"),
                             ("padding", "mixed_uniform"), ("order_check", "short"),
                             ("max_batch_tokens", "mixed"), ("max_batch_size", "mixed"),
                             ("threads", "medium"), ("precision", "medium"),
                             ("long_documents", "long_documents"),
                             ("retrieval_stages", "dataset")]:
        assert (scenario, regime, "cpu") in measured, scenario
    assert summary["results"][0]["scenario"] == "ceiling", "the ceiling runs first"
    padding = measured[("padding", "mixed", "cpu")]
    assert set(padding["contenders"]) == {"length_sorted", "input_order", "pad_to_max",
                                          "no_padding"}
    assert padding["contenders"]["no_padding"]["settings"]["max_batch_size"] == 1
    assert {"length_sorted/pad_to_max", "length_sorted/no_padding"} <= set(padding["ratios"])
    assert padding["contenders"]["pad_to_max"]["settings"]["pad_to_multiple"] == 512
    order_check = measured[("order_check", "short", "cpu")]
    assert set(order_check["contenders"]) == {"copy_a", "copy_b", "copy_c"}
    assert set(order_check["ratios"]) == {"copy_a/copy_b", "copy_b/copy_a", "copy_a/copy_c",
                                          "copy_c/copy_a"}
    precision = measured[("precision", "medium", "cpu")]
    # onnxruntime's variants and OpenVINO's side by side; the tiny export has no OpenVINO int8 IR
    assert {"ort_int8", "ort_opt", "ort_fp32", "ov_fp32"} <= set(precision["contenders"])
    for optional in ("ov_int8", "ov_bf16"):  # not exported / no BF16: skipped with the reason
        assert (optional in precision["contenders"]) != (optional in precision["skipped"])
    if "ov_int8" in precision["skipped"]:
        assert "variant 'ov_int8' was not exported" in precision["skipped"]["ov_int8"]
    assert ("ov_bf16" in precision["contenders"]) == HAS_BF16
    for name, contender in precision["contenders"].items():
        settings = contender["settings"]
        assert (settings["backend"], settings["precision"]) == (
            {"ort": "onnxruntime", "ov": "openvino"}[name.split("_")[0]],
            {"opt": "fp32"}.get(name.split("_")[1], name.split("_")[1])), name
    assert set(precision["ratios"]) == {f"{name}/ort_fp32" for name in precision["contenders"]
                                        if name != "ort_fp32"}
    assert set(measured[("retrieval_stages", "dataset", "cpu")]["contenders"]) == {
        "lexical", "dense", "fusion", "rerank", "total"}
    # serving: every level on short, the capacity level on mixed; Infinity (absent here, or not)
    # for rerank at the capacity level only
    serving = measured[("serving_c16", "short", "cpu")]
    assert {"serve", "serve_nobatch", "rerank_many"} <= set(serving["contenders"])
    assert ("infinity" in serving["contenders"]) != ("infinity" in serving["skipped"])
    assert serving["contenders"]["serve"]["stats"]["statuses"] == {"200": 16}
    assert serving["measurement"]["stop"] == "all 1 items"
    for clients in (1, 4, 64):
        level = measured[("serving_c" + str(clients), "short", "cpu")]
        assert "infinity" not in level["contenders"] and "infinity" not in level["skipped"]
        assert next(r for r in summary["results"] if r["scenario"] == f"serving_c{clients}"
                    and r["regime"] == "mixed")["status"] == (
            "skipped: the time plan runs mixed at 16 clients only")
    assert ("serving_c16", "mixed", "cpu") in measured
    assert {"serve", "embed_inprocess"} <= set(
        measured[("serving_embed_c16", "short", "cpu")]["contenders"])
    assert ("serving_embed_c64", "short", "cpu") in measured
    assert ("serving_search_c16", "short", "cpu") in measured
    assert {("serving_overload", regime, "cpu") for regime in ("short", "mixed")} <= set(measured)
    # every comparison says how many queries it took, its interval and why it stopped
    for row in measured.values():
        if row["scenario"] in ("ceiling", "serving_overload"):
            continue  # fixed samples; an open loop of fixed duration
        assert row["measurement"]["stop"].startswith("all "), row["scenario"]
        for key, ratio in row["ratios"].items():
            assert {"n", "median", "ci_low", "ci_high", "within", "precision"} <= set(ratio), (
                row["scenario"], key)
    # the overhead budget judges 5%: its ratio is measured to ±2%, the others to ±5%
    assert measured[("overhead", "short", "cpu")]["ratios"]["engine/raw_infer"]["precision"] \
        == pytest.approx(0.02)
    assert latency["measurement"]["stop"] == "all 2 items"
    assert latency["measurement"]["rule"]["min_items"] == 2
    assert latency["ratios"]["engine/st"]["n"] == 2
    assert latency["ratios"]["engine/st"]["precision"] == pytest.approx(0.05)
    assert latency["ratios"]["engine/st"]["ci_low"] is None  # 2 queries give no 95% interval
    assert summary["run"]["machine_class"] == classify(read_cpu().flags)
    cuda_rows = [r for r in summary["results"] if r["device"] == "cuda"]
    assert cuda_rows, "cuda rows must appear, measured or marked unavailable"
    if not HAS_CUDA:
        assert {r["status"] for r in cuda_rows} == {
            "unavailable: no CUDAExecutionProvider", "skipped: the GEMM ceiling is measured on "
            "CPU only"}


def test_every_contender_gets_its_share_of_the_ceiling(quick_run) -> None:
    _, work = quick_run
    summary = json.loads((work / DEFAULT_OUT / "summary.json").read_text())
    ceilings = summary["run"]["ceilings"]
    assert set(ceilings) == {"int8", "fp32"} | ({"bf16"} if HAS_BF16 else set())
    [ceiling] = [r for r in summary["results"] if r["scenario"] == "ceiling"
                 and r["status"] == "measured"]
    paths = {c["settings"]["path"] for c in ceiling["contenders"].values()}
    assert paths == {"ort_matmul_integer", "ort_dynamic_quantize_matmul", "openvino_int8",
                     "ort_matmul_fp32", "openvino_fp32"} | ({"openvino_bf16"} if HAS_BF16 else set())
    for precision, best in ceilings.items():
        rates = [c["stats"]["ops_per_s"] for c in ceiling["contenders"].values()
                 if c["settings"]["precision"] == precision
                 and c["settings"]["shape"] in ("ffn_up", "ffn_down", "projection")]
        assert best["ops_per_s"] == max(rates), precision
    latency = next(r for r in summary["results"] if r["scenario"] == "latency"
                   and r["status"] == "measured")
    for name, contender in latency["contenders"].items():
        stats, settings = contender["stats"], contender["settings"]
        assert stats["effective_ops_per_s"] > 0, name
        # int8+bf16 (the probe's pick on some BF16 CPUs) multiplies in int8: held to int8's ceiling.
        gemm_precision = GEMM_PRECISIONS.get(settings["precision"], settings["precision"])
        assert stats["ceiling_precision"] == gemm_precision, name
        assert stats["ceiling_share"] == pytest.approx(
            stats["effective_ops_per_s"] / ceilings[gemm_precision]["ops_per_s"]), name
    assert latency["contenders"]["fastembed"]["settings"]["precision"] == "int8"
    assert latency["contenders"]["fastembed_fp32"]["settings"]["precision"] == "fp32"
    peaks = summary["run"]["cpu"]["peaks"]
    for precision, peak in peaks.items():
        assert peak["ops_per_s"] == pytest.approx(
            peak["cores"] * peak["clock_ghz"] * 1e9 * peak["ops_per_cycle"]), precision
    for name, contender in latency["contenders"].items():
        stats = contender["stats"]
        precision = contender["settings"]["precision"]
        peak = peaks.get(GEMM_PRECISIONS.get(precision, precision), {}).get("ops_per_s")
        expected = None if peak is None else stats["effective_ops_per_s"] / peak
        assert stats["peak_share"] == pytest.approx(expected), name
    markdown = (work / DEFAULT_OUT / "summary.md").read_text()
    assert "## Hardware ceiling (GEMM, GOP/s)" in markdown
    assert f"Machine class **{summary['run']['machine_class']}**" in markdown
    assert "fp32" not in peaks or re.search(
        r"\| fp32 \| \*\*[\d.]+\*\* \(\w+, [\w ]+\) \| [\d.]+ = \d+ cores x [\d.]+ GHz x "
        rf"{peaks['fp32']['ops_per_cycle']:.0f} ops/cycle", markdown)
    assert re.search(r"\| latency \| short \| cpu \| engine \| \w+ \| [\d.]+ \| [\d.]+ \| "
                     r"\*\*\d+%\*\* \|", markdown)


def test_quick_budgets_are_reported_not_enforced(quick_run) -> None:
    completed, work = quick_run
    summary = json.loads((work / DEFAULT_OUT / "summary.json").read_text())
    assert summary["run"]["budgets_enforced"] is False
    verdicts = {v["verdict"] for v in summary["budgets"]}
    assert verdicts and all(v.startswith(("not enforced: ", "not measured")) for v in verdicts)
    assert ("budgets reported but NOT enforced: quick run (10 candidates, 2 queries): budgets "
            "hold for the full workload of 50 candidates") in completed.stdout
    markdown = (work / DEFAULT_OUT / "summary.md").read_text()
    assert "its scores are NOT relevance scores" in markdown
    assert "| latency | short | cpu | engine: onnxrank engine (defaults) |" in markdown
    assert re.search(r"\| latency \| short \| cpu \| engine/st \| [\d.]+ \| \*\*[\d.]+\*\* \| [\d.]+ \| "
                     r"2 \| none: 2 too few \| no \(±5%\) \|", markdown)
    assert re.search(r"\| overhead \| short \| cpu \| engine/raw_infer \| .* \| (yes|no) \(±2%\) \|",
                     markdown)
    assert "| latency | short | cpu | 2 |" in markdown and "| all 2 items |" in markdown
    assert re.search(r"  latency/short/cpu engine/st: [\d.]+x \[none: 2 too few\], 2 queries, "
                     "not within ±5%", completed.stdout)
    assert f"machine class: {classify(read_cpu().flags)} (budgets of other classes" in (
        completed.stdout)


def test_results_record_device_and_settings_in_extra_info(quick_run) -> None:
    _, work = quick_run
    benchmarks = json.loads((work / DEFAULT_OUT / "pytest-benchmark.json").read_text())["benchmarks"]
    latency = next(b for b in benchmarks if b["name"] == "test_latency[cpu-short]")
    info = latency["extra_info"]
    engine = info["contenders"]["engine"]
    assert engine["device"] == "cpu" and engine["backend"] in ("onnxruntime", "openvino")
    assert engine["max_batch_tokens"] == 8192 and engine["threads"] == info["threads"]
    assert info["contenders"]["st"]["threads"] == info["threads"]
    assert set(info["machine"]) >= {"cpu_model", "usable_cores", "gpus", "onnxruntime",
                                    "openvino", "openvino_capabilities", "git_commit"}
    assert info["machine_class"] == classify(read_cpu().flags)
    assert latency["stats"]["rounds"] == 2


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


def test_a_quick_run_does_not_fail_on_a_broken_budget(tiny_model_dir: Path,
                                                      tmp_path: Path) -> None:
    budgets = tmp_path / "impossible.toml"
    budgets.write_text('model = "*"\n[calibration]\nreference_ms = 1000000.0\n'
                       '[[cpu]]\nscenario = "latency"\nregime = "short"\np50_ms = 0.001\n')
    completed = _bench(tmp_path, "--quick", "--model", str(tiny_model_dir), "--device", "cpu",
                       "--scenarios", "latency", "--regimes", "short", "--budgets", str(budgets),
                       "--out", str(tmp_path / "report"))
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    assert re.search(r"latency/short engine p50_ms\s+cpu\s+any\s+[\d.]+ ms\s+<= 0\.00 ms\s+not "
                     r"enforced: quick run", completed.stdout)
    assert "no enforced budget broken" in completed.stdout


def test_engine_flags_and_twins_reach_every_engine_contender(tiny_model_dir: Path,
                                                             tmp_path: Path) -> None:
    # --precision as a flag, max_batch_size through its global twin; ONNXRANK_THREADS is the
    # engine's twin, which the bench's own --threads (ONNXRANK_BENCH_THREADS) does not read.
    environment = bench_outside_xdist.environment(ONNXRANK_MAX_BATCH_SIZE="32", ONNXRANK_THREADS="1")
    out = tmp_path / "report"
    completed = subprocess.run(
        [sys.executable, "-m", "onnxrank", "bench", "--quick", "--model", str(tiny_model_dir),
         "--device", "cpu", "--scenarios", "latency,sweeps", "--regimes", "short",
         "--precision", "fp32", "--out", str(out)],
        cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=900)
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


def test_engine_options_are_checked_before_the_suite_runs(
        capsys: pytest.CaptureFixture[str], tiny_model_dir: Path, tmp_path: Path) -> None:
    # (a small run in tmp_path, should the check ever let one through)
    run = ["bench", "--quick", "--model", str(tiny_model_dir), "--device", "cpu", "--scenarios",
           "latency", "--regimes", "short", "--out", str(tmp_path)]
    assert main([*run, "--max-batch-tokens", "0"]) == 2
    assert capsys.readouterr().err == (
        "onnxrank bench: error: max_batch_tokens must be >= 1, got 0\n")
    # an option the model cannot run with: one error, not one per scenario
    assert main([*run, "--max-length", "4096"]) == 2
    assert capsys.readouterr().err == (
        "onnxrank bench: error: max_length=4096 exceeds the model's max_length=512 "
        f"({tiny_model_dir / 'manifest.json'})\n")


def test_the_check_before_the_suite_loads_the_model_without_the_probe(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a probe here timed every candidate of a 0.6B decoder on one thread for over ten minutes
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    bench_cmd.check_model(str(tiny_model_dir), tmp_path, {})
    assert not default_choice_cache().exists()
    Reranker.from_dir(tiny_model_dir, device="cpu", threads=1)  # what the check used to do
    assert default_choice_cache().exists()


def test_only_changed_engine_options_are_reported() -> None:
    assert bench_engine_options({"precision": "auto", "max_batch_tokens": 4096,
                                 "max_length": None}) == {"max_batch_tokens": 4096}
    assert describe_engine_options({}) == "defaults"
    with pytest.raises(ValueError, match=re.escape(
            "engine options ['device', 'threads'] are set by the bench itself (its --device list "
            "and --threads), not per engine")):
        bench_engine_options({"threads": 2, "device": "cpu"})


@pytest.mark.parametrize(("args", "message"), [
    (["--regimes", "short,tiny"], "argument --regimes: unknown regimes ['tiny']; choose from "
                                  "short, medium, long, mixed (comma-separated)"),
    (["--device", "gpu"],
     "argument --device: unknown devices ['gpu']; choose from cpu, cuda or all (comma-separated)"),
    (["--scenarios", "latency,speed"],
     f"argument --scenarios: unknown scenarios ['speed']; choose from {', '.join(SCENARIO_FILES)} "
     f"(comma-separated) or all, and the opt-in {', '.join(OPT_IN_SCENARIO_FILES)}"),
    (["--queries", "0"], "argument --queries: must be >= 1, got 0"),
    (["--queries", "-3"], "argument --queries: must be >= 1, got -3"),
    (["--queries", "two"], "argument --queries: invalid int value: 'two'"),
    (["--threads", "0"], "argument --threads: must be >= 1, got 0"),
    (["--threads", "1.5"], "argument --threads: invalid int value: '1.5'"),
])
def test_bad_values_are_refused_by_the_parser(capsys: pytest.CaptureFixture[str], args: list[str],
                                              message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *args])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.endswith(f"onnxrank bench: error: {message}\n")


def test_bad_files_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["bench", "--budgets", str(tmp_path / "none.toml")]) == 2
    assert f"budgets file {tmp_path / 'none.toml'} does not exist" in capsys.readouterr().err
    assert main(["bench", "--dataset", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"onnxrank bench: error: could not find corpus.jsonl in {tmp_path}; --dataset takes a "
        f"directory with corpus.jsonl and queries.jsonl (default: the shipped sample, "
        f"{DEFAULT_DATASET})\n")
    (tmp_path / "corpus.jsonl").write_text('{"id": "1", "text": "a"}\n')
    assert main(["bench", "--dataset", str(tmp_path)]) == 2
    assert "could not find queries.jsonl in" in capsys.readouterr().err
    assert main(["bench", "--models-dir", str(tmp_path), "--model", "absent"]) == 2
    assert capsys.readouterr().err.startswith(
        f"onnxrank bench: error: no exported model named 'absent' in {tmp_path}"
    )


def _bench_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", *argv])


def test_defaults_point_at_the_package_and_the_cwd(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ONNXRANK_"):
            monkeypatch.delenv(name)
    args = _bench_args()
    assert args.scenarios == "all" and parse_scenarios(args.scenarios) == list(SCENARIO_FILES)
    assert (args.device, args.quick, args.queries, args.threads) == ("all", False, None, None)
    assert Path(args.dataset) == DEFAULT_DATASET and Path(args.budgets) == DEFAULT_BUDGETS
    assert Path(args.out) == DEFAULT_OUT and not Path(args.out).is_absolute()
    assert (args.model, args.models_dir) == ("minilm-standin", "models")


def test_the_ceiling_always_runs_first() -> None:
    assert parse_scenarios("latency, sweeps") == ["ceiling", "latency", "sweeps"]
    assert parse_scenarios("sweeps,ceiling") == ["ceiling", "sweeps"]
    assert parse_scenarios("all")[0] == "ceiling"


def test_opt_in_scenarios_run_only_when_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert {"families", "decoder"} == set(OPT_IN_SCENARIO_FILES)
    assert not set(OPT_IN_SCENARIO_FILES) & set(parse_scenarios("all"))
    assert {"overhead", "serving"} <= set(parse_scenarios("all"))
    assert parse_scenarios("families,decoder") == ["ceiling", "families", "decoder"]
    # A registered file that is not installed: named, an error; from `all`, left out and said so.
    monkeypatch.setattr(bench_cmd, "SUITE_DIR", tmp_path)
    for name in ("test_ceiling.py", "test_latency.py"):
        (tmp_path / name).write_text("")
    assert scenario_files(["ceiling", "latency"], explicit=True) == [
        tmp_path / "test_ceiling.py", tmp_path / "test_latency.py"]
    with pytest.raises(ValueError, match=re.escape(
            f"scenario 'families' has no file test_families.py in {tmp_path}; this installation "
            "does not ship it")):
        scenario_files(["ceiling", "families"], explicit=True)
    assert scenario_files(["ceiling", "overhead"], explicit=False) == [tmp_path / "test_ceiling.py"]
    assert capsys.readouterr().out == (
        f"onnxrank bench: scenario overhead left out: test_overhead.py is not in {tmp_path}\n")


def test_help_names_the_opt_in_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert ("Run only when named, never by all: families, decoder (full-size checkpoints of "
            "other model families: each takes far longer than a default run)") in help_text


def test_environment_twins_are_scoped_to_bench(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    # The engine's ONNXRANK_DEVICE (auto/cpu/cuda) is not bench's device list.
    monkeypatch.setenv("ONNXRANK_DEVICE", "cuda")
    monkeypatch.setenv("ONNXRANK_BENCH_DEVICE", "cpu")
    monkeypatch.setenv("ONNXRANK_BENCH_OUT", str(tmp_path / "reports"))
    monkeypatch.setenv("ONNXRANK_OUT", str(tmp_path / "not-this"))
    monkeypatch.setenv("ONNXRANK_BENCH_QUICK", "yes")
    monkeypatch.setenv("ONNXRANK_BENCH_QUERIES", "7")
    monkeypatch.setenv("ONNXRANK_BENCH_THREADS", "1")
    monkeypatch.setenv("ONNXRANK_BENCH_SCENARIOS", "latency")
    monkeypatch.setenv("ONNXRANK_BENCH_REGIMES", "short")
    monkeypatch.setenv("ONNXRANK_BENCH_DATASET", str(tmp_path))
    monkeypatch.setenv("ONNXRANK_BENCH_BUDGETS", str(tmp_path / "b.toml"))
    monkeypatch.setenv("ONNXRANK_BENCH_EMBEDDER", "my-embedder")
    monkeypatch.setenv("ONNXRANK_MODEL", "my-reranker")
    monkeypatch.setenv("ONNXRANK_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("ONNXRANK_BENCH_INFINITY", str(tmp_path / "bin" / "infinity_emb"))
    args = _bench_args()
    assert args.infinity == str(tmp_path / "bin" / "infinity_emb")
    assert _bench_args("--infinity", "/opt/peer/infinity_emb").infinity == "/opt/peer/infinity_emb"
    assert (args.device, args.out, args.quick, args.queries, args.threads) == (
        "cpu", str(tmp_path / "reports"), True, 7, 1)
    assert (args.scenarios, args.regimes, args.dataset, args.budgets, args.embedder) == (
        "latency", "short", str(tmp_path), str(tmp_path / "b.toml"), "my-embedder")
    assert (args.model, args.models_dir) == ("my-reranker", str(tmp_path / "models"))
    # a flag wins over its twin
    assert _bench_args("--device", "cuda", "--no-quick").device == "cuda"
    assert _bench_args("--no-quick").quick is False
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines anywhere
    for twin in ("ONNXRANK_BENCH_DEVICE", "ONNXRANK_BENCH_OUT", "ONNXRANK_BENCH_QUICK",
                 "ONNXRANK_MODEL", "ONNXRANK_MODELS_DIR", "ONNXRANK_PRECISION",
                 "ONNXRANK_MAX_BATCH_TOKENS", "ONNXRANK_BENCH_THREADS"):
        assert f"(env {twin})" in help_text, twin
    # the bench's own --device and --threads are not the engine's
    assert "(env ONNXRANK_DEVICE)" not in help_text and "(env ONNXRANK_THREADS)" not in help_text


@pytest.mark.parametrize(("name", "value", "reason"), [
    ("ONNXRANK_BENCH_QUERIES", "many", "invalid int value: 'many'"),
    ("ONNXRANK_BENCH_QUERIES", "0", "must be >= 1, got 0"),
    ("ONNXRANK_BENCH_THREADS", "-1", "must be >= 1, got -1"),
    ("ONNXRANK_BENCH_DEVICE", "auto", "unknown devices ['auto']; choose from cpu, cuda or all"),
    ("ONNXRANK_BENCH_QUICK", "maybe", "expected a boolean"),
])
def test_a_bad_twin_value_is_an_error_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, name: str, value: str, reason: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape(
            f"environment variable {name}={value!r} is not valid: {reason}")):
        build_parser()


@pytest.mark.slow
def test_quick_run_exits_0_with_the_full_size_standin() -> None:
    """After the README's main command (models/minilm-standin exported), `--quick` passes."""
    standin = REPOSITORY / "models" / "minilm-standin" / "manifest.json"
    assert standin.is_file(), "run the README's main command first (it exports the stand-in)"
    completed = _bench(REPOSITORY, "--quick", "--out", "bench-results/quick-standin")
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]


@pytest.mark.gpu
def test_cuda_rows_are_measured_on_cuda(tiny_model_dir: Path, tmp_path: Path) -> None:
    if not HAS_CUDA:
        pytest.skip("needs a working CUDAExecutionProvider")
    completed = _bench(tmp_path, "--quick", "--model", str(tiny_model_dir), "--device", "cuda",
                       "--scenarios", "latency", "--regimes", "short",
                       "--out", str(tmp_path / "report"))
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    [row] = [r for r in summary["results"] if r["scenario"] == "latency"]
    assert row["device"] == "cuda" and row["status"] == "measured"
    assert row["contenders"]["engine"]["settings"]["provider"] == "CUDAExecutionProvider"
    assert row["contenders"]["engine"]["settings"]["variant"] == "fp16"
    assert "CPU path only" in row["skipped"]["fastembed"]
