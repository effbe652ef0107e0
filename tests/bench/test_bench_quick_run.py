"""`onnxrank bench --quick` end to end: the quick suite on the tiny model from an installed wheel,
its outputs, the scenarios, devices and baselines it covers, every contender's share of the hardware
ceiling, and its budgets (reported, not enforced).

The numbers of a tiny-model run mean nothing; these tests check that the suite runs every
scenario outside a checkout, writes its JSON/markdown/PNG report where the user stands, says what it
could not run and gives every contender's share of the hardware ceiling. Runs of the checkout
(budgets enforced, the engine's flags) are in test_bench_runs.py, the options in
test_bench_options.py.
"""

from __future__ import annotations

import importlib.util
import json
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
import worker_cores

from onnxrank.bench.ceiling import GEMM_PRECISIONS
from onnxrank.bench.machine import classify, read_cpu
from onnxrank.bench.paths import DEFAULT_OUT

pytestmark = pytest.mark.costly(165)

REPOSITORY = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()
# fastembed pins huggingface-hub<2, so [all] leaves it out; its rows run where it is installed
HAS_FASTEMBED = importlib.util.find_spec("fastembed") is not None
FASTEMBED_ROWS = {"fastembed", "fastembed_fp32"}
HAS_BF16 = "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
SHIPPED_SUITE_FILES = (
    "onnxrank/bench/suite/conftest.py", "onnxrank/bench/suite/test_ceiling.py",
    "onnxrank/bench/suite/test_latency.py", "onnxrank/bench/suite/budgets.toml",
    "onnxrank/bench/suite/pytest.ini", "onnxrank/bench/suite/data/README.md",
    "onnxrank/bench/suite/data/cranfield-sample/corpus.jsonl",
    "onnxrank/bench/suite/data/cranfield-sample/queries.jsonl",
)


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
        cwd=work, env=environment, preexec_fn=worker_cores.all_cores, capture_output=True, text=True,
        timeout=900,
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
        assert set(latency["contenders"]) == {"engine", "st", "naive_ort"} | (
            FASTEMBED_ROWS if HAS_FASTEMBED else set())
        assert latency["contenders"]["engine"]["stats"]["n"] == 2
        assert {"engine/st", "engine/naive_ort"} | ({f"engine/{name}" for name in FASTEMBED_ROWS}
                                                    if HAS_FASTEMBED else set()) <= set(latency["ratios"])
        if not HAS_FASTEMBED:  # recorded with the install that brings it, not silently dropped
            for name in FASTEMBED_ROWS:
                assert 'pip install "onnxrank[fastembed]"' in latency["skipped"][name]
        assert ("throughput", regime, "cpu") in measured
    for regime in ("short", "mixed"):  # the peer table: the in-process peers measured, the
        # OpenVINO ones skipped with how to run them, each measured row with its fidelity
        peers = measured[("peers", regime, "cpu")]
        # the engine's float row (fp32 always runs on a CPU, bf16 where the CPU has it), unless
        # the defaults already run the faster of the two
        engines = {"engine", "engine_float"} & set(peers["contenders"])
        assert set(peers["contenders"]) == engines | {"st", "ct2", "flashrank"}
        if "engine_float" in engines:
            floated = peers["contenders"]["engine_float"]["settings"]
            assert "fp32" in floated["precision_probe_ms"]
            assert set(floated["precision_probe_ms"]) | set(floated["precisions_refused"]) == {
                "fp32", "bf16"}
            assert floated["precision"] in floated["precision_probe_ms"]
            if floated["precision"] == "fp32":
                assert peers["fidelity"]["engine_float"]["spearman"] == pytest.approx(1.0)
            assert {"engine/engine_float", "engine_float/ct2", "engine_float/flashrank"} <= set(
                peers["ratios"])
        else:
            assert "the defaults already run" in peers["skipped"]["engine_float"]
        assert "--peer-python" in peers["skipped"]["st_openvino"]
        assert "--peer-python" in peers["skipped"]["st_openvino_int8"]
        assert "optimum-onnx" in peers["skipped"]["st_onnx_int8"]
        assert set(peers["fidelity"]) == set(peers["contenders"])
        assert peers["fidelity"]["st"]["spearman"] == pytest.approx(1.0)
        assert all(row["queries"] == 2 for row in peers["fidelity"].values())
        assert {verdict["verdict"] for verdict in peers["pareto"].values()} == {"no"}, (
            "2 queries give no interval: never known to be faster")
        assert set(peers["pareto"]) == {"ct2", "flashrank"}
        assert all(set(verdict["rows"]) == engines for verdict in peers["pareto"].values())
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
    if HAS_FASTEMBED:
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
    assert "## Peers: time and fidelity" in markdown
    assert re.search(r"\| mixed \| ct2: CTranslate2 int8\w* \(length-sorted batches of 32\) \| "
                     r"[\d.]+x \[none: 2 too few\] \| [\d.]+ \| [\d.]+ \| [\d.]+ \| 2 \| - \| "
                     r"\*\*no\*\* \(engine: median [\d.]+x, too few queries for an interval; ",
                     markdown)
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


