"""The bench's decoder scenario on the tiny decoder: it measures its own model, so it runs and
writes its report where the run's model (the stand-in) was never exported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import bench_outside_xdist
import pytest
import worker_cores

from onnxrank.bench.suite.test_decoder import DECODER_MODEL
from onnxrank.engine.spec import load_model_spec

pytestmark = pytest.mark.costly(25)

REPO = Path(__file__).resolve().parents[2]


def _run_scenario(tmp_path: Path, models: Path, *options: str) -> Path:
    """The decoder scenario's quick short/20 run in its own pytest process; its --bench-out."""
    out = tmp_path / "out"
    out.mkdir()  # as `onnxrank bench` does before the suite runs
    suite = REPO / "onnxrank" / "bench" / "suite"
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
         str(suite / "pytest.ini"), f"--rootdir={suite}", str(suite / "test_decoder.py"),
         "--bench-quick", f"--bench-models-dir={models}", "--bench-device=cpu",
         "--bench-regimes=short", "--bench-threads=1", f"--bench-out={out}",
         f"--benchmark-json={out / 'pytest-benchmark.json'}", "-k", "20", *options],
        cwd=tmp_path, env=bench_outside_xdist.environment(), preexec_fn=worker_cores.all_cores,
        capture_output=True, text=True,
        timeout=600, check=False)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return out


def test_decoder_scenario_records_its_own_model_without_the_runs_model(
        decoder_model_dir: Path, tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    (models / DECODER_MODEL).symlink_to(decoder_model_dir)
    out = _run_scenario(tmp_path, models)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["model"]["label"] == (
        "minilm-standin: not loaded (no scenario of this run measured it)")
    (result,) = summary["results"]
    assert (result["scenario"], result["regime"]) == ("decoder", "short/20")
    assert "engine/transformers_fp32" in result["ratios"]
    # prefix reuse vs the whole rows, where the engine's variant has a prefix graph
    assert ("engine/engine_no_prefix" in result["ratios"]) != ("engine_no_prefix" in result["skipped"])
    workload = result["workload"]
    assert workload["prefix_tokens_per_row"] >= 0
    if "engine/engine_no_prefix" in result["ratios"]:
        # each query's prompt head runs once instead of once per row
        padded = workload["padded_tokens"]
        assert 0 < padded["engine"] < padded["engine_no_prefix"]
        assert workload["padded_token_bound"] == pytest.approx(
            padded["engine_no_prefix"] / padded["engine"])
    else:
        assert "padded_tokens" not in workload
    benchmarks = json.loads((out / "pytest-benchmark.json").read_text())["benchmarks"]
    assert [entry["extra_info"]["model"] for entry in benchmarks] == [
        f"{load_model_spec(decoder_model_dir).name}: NOT relevance-trained, its scores are NOT "
        "relevance scores (speed measurements only)"]


def test_the_scenario_measures_the_runs_model_when_it_is_a_decoder(
        decoder_model_dir: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    from onnxrank.bench.suite.test_decoder import _decoder_dir

    empty = tmp_path / "models"
    empty.mkdir()
    run = SimpleNamespace(model_name=str(decoder_model_dir), models_dir=empty)
    assert _decoder_dir(run) == decoder_model_dir  # type: ignore[arg-type]
    # a name under --models-dir works too
    (empty / "my-decoder").symlink_to(decoder_model_dir)
    run = SimpleNamespace(model_name="my-decoder", models_dir=empty)
    assert _decoder_dir(run) == empty / "my-decoder"  # type: ignore[arg-type]
    # a cross-encoder --model falls back to DECODER_MODEL, and without it the scenario skips
    run = SimpleNamespace(model_name=str(tiny_model_dir), models_dir=empty)
    with pytest.raises(pytest.skip.Exception, match="is not a decoder reranker"):
        _decoder_dir(run)  # type: ignore[arg-type]
    (empty / DECODER_MODEL).symlink_to(decoder_model_dir)
    assert _decoder_dir(run) == empty / DECODER_MODEL  # type: ignore[arg-type]


def test_the_report_names_the_runs_model_when_the_decoder_scenario_measured_it(
        decoder_model_dir: Path, tmp_path: Path) -> None:
    empty = tmp_path / "models"
    empty.mkdir()
    out = _run_scenario(tmp_path, empty, f"--bench-model={decoder_model_dir}")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["model"]["label"] == (
        f"{load_model_spec(decoder_model_dir).name}: NOT relevance-trained, its scores are NOT "
        "relevance scores (speed measurements only)")
    (result,) = summary["results"]
    assert (result["scenario"], result["regime"]) == ("decoder", "short/20")
