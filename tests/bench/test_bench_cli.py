"""`onnxrank bench` end to end: the quick suite on the tiny model, its outputs, budget failure.

The numbers of a tiny-model run mean nothing; these tests check that the suite runs every
scenario, writes its JSON/markdown/PNG report, says what it could not run, reports model-size
budgets without enforcing them, and exits non-zero when an enforced budget is broken.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest

from onnxrank.cli import main

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


def _bench(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "onnxrank", "bench", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture(scope="module")
def quick_run(tiny_model_dir: Path, tiny_embedder_dir: Path,
              tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    work = tmp_path_factory.mktemp("bench-quick")
    out = work / "report"
    completed = _bench(work, "--quick", "--model", str(tiny_model_dir),
                       "--embedder", str(tiny_embedder_dir), "--out", str(out))
    return completed, out


def test_quick_run_passes_and_writes_every_output(quick_run) -> None:
    completed, out = quick_run
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    for name in ("summary.json", "summary.md", "pytest-benchmark.json"):
        assert (out / name).stat().st_size > 0, name
    for name in ("latency.png", "throughput_vs_max_batch_tokens.png", "padding.png"):
        width, height = _png_size(out / name)
        assert width >= 600 and height >= 400, (name, width, height)


def test_summary_covers_scenarios_devices_and_baselines(quick_run) -> None:
    _, out = quick_run
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["quick"] is True
    assert summary["run"]["model"]["name"] == "tiny-reranker"
    measured = {(r["scenario"], r["regime"], r["device"]): r for r in summary["results"]
                if r["status"] == "measured"}
    for regime in ("short", "medium", "long", "mixed"):
        latency = measured[("latency", regime, "cpu")]
        assert set(latency["contenders"]) >= {"engine", "st", "naive_ort"}
        assert latency["contenders"]["engine"]["stats"]["n"] == 2
        assert {"engine/st", "engine/naive_ort"} <= set(latency["ratios"])
        assert "FlashRank skipped" in latency["skipped"]["flashrank"]
        assert ("throughput", regime, "cpu") in measured
    for scenario, regime in [("padding", "mixed"), ("padding", "mixed_uniform"),
                             ("order_check", "short"), ("max_batch_tokens", "mixed"),
                             ("max_batch_size", "mixed"), ("threads", "medium"),
                             ("precision", "medium"), ("long_documents", "long_documents"),
                             ("retrieval_stages", "dataset")]:
        assert (scenario, regime, "cpu") in measured, scenario
    padding = measured[("padding", "mixed", "cpu")]
    assert set(padding["contenders"]) == {"length_sorted", "input_order", "pad_to_max",
                                          "no_padding", "naive_ort"}
    assert padding["contenders"]["no_padding"]["settings"]["max_batch_size"] == 1
    assert {"length_sorted/pad_to_max", "length_sorted/no_padding"} <= set(padding["ratios"])
    assert padding["contenders"]["pad_to_max"]["settings"]["pad_to_multiple"] == 512
    order_check = measured[("order_check", "short", "cpu")]
    assert set(order_check["contenders"]) == {"copy_a", "copy_b", "copy_c"}
    assert set(order_check["ratios"]) == {"copy_a/copy_b", "copy_b/copy_a", "copy_a/copy_c",
                                          "copy_c/copy_a"}
    precision = measured[("precision", "medium", "cpu")]
    assert set(precision["contenders"]) - {"openvino"} == {"int8", "opt", "fp32"}
    # OpenVINO is measured where its plugin lists a CPU device, else skipped with the reason
    assert ("openvino" in precision["contenders"]) != ("openvino" in precision["skipped"])
    if "openvino" in precision["skipped"]:
        assert "cpu_provider='openvino' was requested" in precision["skipped"]["openvino"]
    assert set(measured[("retrieval_stages", "dataset", "cpu")]["contenders"]) == {
        "lexical", "dense", "fusion", "rerank", "total"}
    cuda_rows = [r for r in summary["results"] if r["device"] == "cuda"]
    assert cuda_rows, "cuda rows must appear, measured or marked unavailable"
    if not HAS_CUDA:
        assert {r["status"] for r in cuda_rows} == {"unavailable: no CUDAExecutionProvider"}


def test_model_size_budgets_are_reported_not_enforced(quick_run) -> None:
    completed, out = quick_run
    summary = json.loads((out / "summary.json").read_text())
    verdicts = {v["verdict"] for v in summary["budgets"]}
    assert verdicts and all(v.startswith(("not enforced: budget is for model 'minilm-standin'",
                                          "not measured")) for v in verdicts)
    assert "budgets reported but NOT enforced" in completed.stdout
    markdown = (out / "summary.md").read_text()
    assert "its scores are NOT relevance scores" in markdown
    assert "| latency | short | cpu | engine: onnxrank engine (defaults) |" in markdown


def test_results_record_device_and_settings_in_extra_info(quick_run) -> None:
    _, out = quick_run
    benchmarks = json.loads((out / "pytest-benchmark.json").read_text())["benchmarks"]
    latency = next(b for b in benchmarks if b["name"] == "test_latency[cpu-short]")
    info = latency["extra_info"]
    engine = info["contenders"]["engine"]
    assert engine["provider"] == "CPUExecutionProvider" and engine["variant"] == "int8"
    assert engine["max_batch_tokens"] == 8192 and engine["threads"] == info["threads"]
    assert info["contenders"]["st"]["threads"] == info["threads"]
    assert set(info["machine"]) >= {"cpu_model", "usable_cores", "gpus", "onnxruntime",
                                    "git_commit"}
    assert latency["stats"]["rounds"] == 2


def test_impossible_budget_fails_the_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    budgets = tmp_path / "impossible.toml"
    budgets.write_text('model = "*"\n[calibration]\nreference_ms = 1000000.0\n'
                       '[[cpu]]\nscenario = "latency"\nregime = "short"\np50_ms = 0.001\n')
    completed = _bench(tmp_path, "--quick", "--model", str(tiny_model_dir), "--device", "cpu",
                       "--scenarios", "latency", "--regimes", "short", "--budgets", str(budgets),
                       "--out", str(tmp_path / "report"))
    assert completed.returncode == 1, completed.stdout[-4000:] + completed.stderr[-4000:]
    assert "budget broken" in completed.stdout
    assert re.search(r"latency/short engine p50_ms\s+cpu\s+[\d.]+ ms\s+<= 0\.00 ms\s+FAIL",
                     completed.stdout)
    assert "1 budget(s) broken" in completed.stdout


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["bench", "--regimes", "short,tiny"]) == 2
    assert capsys.readouterr().err == (
        "onnxrank bench: error: unknown regimes ['tiny']; choose from short, medium, long, "
        "mixed (comma-separated)\n"
    )
    assert main(["bench", "--budgets", str(tmp_path / "none.toml")]) == 2
    assert f"budgets file {tmp_path / 'none.toml'} does not exist" in capsys.readouterr().err
    assert main(["bench", "--models-dir", str(tmp_path), "--model", "absent"]) == 2
    assert capsys.readouterr().err.startswith(
        f"onnxrank bench: error: no exported model named 'absent' in {tmp_path}"
    )


@pytest.mark.gpu
def test_cuda_rows_are_measured_on_cuda(tiny_model_dir: Path, tmp_path: Path) -> None:
    if not HAS_CUDA:
        pytest.skip("needs a working CUDAExecutionProvider")
    completed = _bench(tmp_path, "--quick", "--model", str(tiny_model_dir), "--device", "cuda",
                       "--scenarios", "latency", "--regimes", "short",
                       "--out", str(tmp_path / "report"))
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    [row] = summary["results"]
    assert row["device"] == "cuda" and row["status"] == "measured"
    assert row["contenders"]["engine"]["settings"]["provider"] == "CUDAExecutionProvider"
    assert row["contenders"]["engine"]["settings"]["variant"] == "fp16"
    assert "CPU-only" in row["skipped"]["fastembed"]
