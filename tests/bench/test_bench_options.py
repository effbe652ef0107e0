"""`onnxrank bench`'s options: the engine options checked (without the runtime probe) before the
suite runs, the parser's refusals and defaults, the opt-in scenarios, and every flag's environment
twin.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest

from onnxrank.bench.contenders import bench_engine_options, describe_engine_options
from onnxrank.bench.paths import DEFAULT_BUDGETS, DEFAULT_DATASET, DEFAULT_OUT
from onnxrank.cli import bench_cmd, build_parser, main
from onnxrank.cli.bench_cmd import OPT_IN_SCENARIO_FILES, SCENARIO_FILES, parse_scenarios, scenario_files
from onnxrank.engine.reranker import Reranker
from onnxrank.engine.runtime import default_choice_cache


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

