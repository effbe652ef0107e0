"""`onnxrank bench`: run the benchmark suite (pytest-benchmark scenarios shipped in the package)."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from onnxrank._optional import require
from onnxrank.bench.budgets import load_budgets
from onnxrank.bench.contenders import BENCH_OWN_OPTIONS, bench_engine_options
from onnxrank.bench.environment import parse_devices
from onnxrank.bench.paths import (
    DEFAULT_BUDGETS,
    DEFAULT_DATASET,
    DEFAULT_OUT,
    PYTEST_CONFIG,
    SUITE_DIR,
)
from onnxrank.bench.workloads import REGIMES, parse_regimes
from onnxrank.cli.common import HelpFormatter
from onnxrank.cli.options import (
    DEFAULT_MODELS_DIR,
    DEFAULT_RERANK_MODEL,
    add_config_options,
    add_flag,
    config_overrides,
)
from onnxrank.engine.batching import DEFAULT_PAD_MULTIPLE
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.reranker import Reranker
from onnxrank.engine.runtime import choose_candidates
from onnxrank.engine.spec import load_model_spec
from onnxrank.retrieval.indexer import DEFAULT_EMBEDDER
from onnxrank.types import Device

logger = logging.getLogger(__name__)

COMMAND = "bench"
# Scenario groups and their files in onnxrank/bench/suite/, the default set (`all`). The ceiling
# runs first in every run: every other scenario reports its contenders' effective ops/s as a
# share of it.
SCENARIO_FILES = {
    "ceiling": "test_ceiling.py",
    "latency": "test_latency.py",
    "throughput": "test_throughput.py",
    "sweeps": "test_sweeps.py",
    "long_documents": "test_long_documents.py",
    "retrieval_stages": "test_retrieval_stages.py",
    "order_check": "test_order_check.py",
    "overhead": "test_overhead.py",
    "peers": "test_peers.py",
    "serving": "test_serving.py",
}
# Run only when named: families and decoder build and export full-size checkpoints of other
# model families first, and each takes far longer than the 15 minutes of a default run.
OPT_IN_SCENARIO_FILES = {
    "families": "test_families.py",
    "decoder": "test_decoder.py",
}
ALL_SCENARIOS = "all"
ALWAYS_RUN = "ceiling"
DATASET_FILES = ("corpus.jsonl", "queries.jsonl")
PYTEST_BENCHMARK_JSON = "pytest-benchmark.json"

EPILOG = f"""examples:
  onnxrank bench --quick                         # checks the suite, not the numbers
  onnxrank bench --model minilm-standin --embedder minilm-embedder --out bench-results/full
  onnxrank bench --device cpu,cuda --regimes short,mixed --scenarios latency
  onnxrank bench --quick --budgets my_budgets.toml
  onnxrank bench --quick --scenarios latency --precision fp32 --max-batch-tokens 4096
  onnxrank bench --scenarios peers --peer-python /tmp/peers/bin/python
  onnxrank bench --scenarios families,decoder    # opt-in: other model families; long

Outputs in --out: summary.md (tables), summary.json (our summary), {PYTEST_BENCHMARK_JSON}
(pytest-benchmark's raw data, with device and settings in extra_info) and PNG plots.
Exit status: 0 when no enforced budget is broken (a --quick run enforces none), 1 when one is
broken (or a scenario failed), 2 on bad arguments. The suite ships inside the package
({SUITE_DIR}), so this works from an installed wheel. See docs/benchmarks.md.
"""


class InvalidValue(argparse.ArgumentTypeError, ValueError):
    """A bad flag value: argparse prints its message as is, and `add_flag` names the environment
    variable when the value came from a twin."""


def _checked(parse: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse `type` that checks a value with `parse` at parse time and keeps the text."""
    def check(value: str) -> str:
        try:
            parse(value)
        except ValueError as err:
            raise InvalidValue(str(err)) from err
        return value
    check.__name__ = parse.__name__
    return check


def positive_int(text: str) -> int:
    """An argparse `type` for counts: an int >= 1.

    Raises:
        InvalidValue: Not an int, or below 1.
    """
    try:
        value = int(text)
    except ValueError as err:
        raise InvalidValue(f"invalid int value: {text!r}") from err
    if value < 1:
        raise InvalidValue(f"must be >= 1, got {value}")
    return value


def parse_scenarios(value: str) -> list[str]:
    """Scenario groups from ``"all"`` (the default set) or a comma-separated list, which may also
    name the opt-in ones; the ceiling is always first.

    Raises:
        ValueError: An unknown or empty name.
    """
    if value.strip() == ALL_SCENARIOS:
        return list(SCENARIO_FILES)
    names = [name.strip() for name in value.split(",") if name.strip()]
    known = {**SCENARIO_FILES, **OPT_IN_SCENARIO_FILES}
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ValueError(
            f"unknown scenarios {unknown or value!r}; choose from {', '.join(SCENARIO_FILES)} "
            f"(comma-separated) or {ALL_SCENARIOS}, and the opt-in "
            f"{', '.join(OPT_IN_SCENARIO_FILES)}"
        )
    return [ALWAYS_RUN, *(name for name in names if name != ALWAYS_RUN)]


def scenario_files(names: list[str], *, explicit: bool) -> list[Path]:
    """The suite's files of these scenario groups.

    A file that is not in this installation is an error when the user named its scenario
    (`explicit`), and left out with a warning from `all` (a scenario registered before its file
    was shipped).

    Raises:
        ValueError: A named scenario's file is missing.
    """
    known = {**SCENARIO_FILES, **OPT_IN_SCENARIO_FILES}
    files = []
    for name in names:
        path = SUITE_DIR / known[name]
        if path.is_file():
            files.append(path)
        elif explicit:
            raise ValueError(f"scenario {name!r} has no file {path.name} in {SUITE_DIR}; this "
                             "installation does not ship it")
        else:
            logger.warning("scenario %s left out: %s is not in %s", name, path.name, SUITE_DIR)
            print(f"onnxrank bench: scenario {name} left out: {path.name} is not in {SUITE_DIR}")
    return files


def check_dataset(path: str | Path) -> Path:
    """The dataset directory, checked for the files the workloads are cut from.

    Raises:
        ValueError: A file is missing (the message names the file and the directory).
    """
    directory = Path(path)
    for name in DATASET_FILES:
        if not (directory / name).is_file():
            raise ValueError(
                f"could not find {name} in {directory}; --dataset takes a directory with "
                f"{' and '.join(DATASET_FILES)} (default: the shipped sample, {DEFAULT_DATASET})"
            )
    return directory


def check_model(name: str, models_dir: str | Path, options: dict[str, Any]) -> None:
    """Load the model once before any scenario, so that a missing model, or engine options it
    cannot run with on CPU, is one clear error instead of one per scenario.

    It loads the first candidate `options` allow, on one thread, without the runtime probe or
    the batch check: the scenarios' engines run them for themselves, and a probe here would time
    every candidate of a 0.6B decoder on one thread for many minutes.

    Raises:
        ModelLoadError: `name` is not an exported model (and is not exported on first use).
        ValueError: An option is out of range, or nothing the options allow can run on CPU.
    """
    config = EngineConfig().with_overrides(device="cpu", threads=1, **options)
    model_dir = Reranker.locate(name, models_dir=models_dir, config=config)
    candidates, _ = choose_candidates(load_model_spec(model_dir), Device.CPU, config.backend,
                                      config.precision)
    # a named padding multiple skips the batch check too (each scenario's engine runs its own)
    Reranker.from_dir(model_dir, config, backend=candidates[0].backend,
                      precision=candidates[0].precision,
                      pad_to_multiple=config.pad_to_multiple or DEFAULT_PAD_MULTIPLE)


def run_bench(args: argparse.Namespace) -> int:
    """Check the arguments, then run the selected scenario files under pytest.

    The parser has already checked --device, --regimes, --scenarios, --queries and --threads.

    Raises:
        ValueError: A missing or malformed budgets file or dataset, an engine option out of range,
            or one the model cannot run with on CPU.
        ModelLoadError: --model is not an exported model.
        MissingDependencyError: pytest or pytest-benchmark is not installed.
    """
    scenarios = parse_scenarios(args.scenarios)
    files = scenario_files(scenarios, explicit=args.scenarios.strip() != ALL_SCENARIOS)
    if not Path(args.budgets).is_file():
        raise ValueError(f"budgets file {args.budgets} does not exist; pass --budgets FILE "
                         f"(the default is {DEFAULT_BUDGETS})")
    load_budgets(args.budgets)
    check_dataset(args.dataset)
    engine_options = bench_engine_options(
        config_overrides(args, EngineConfig, exclude=BENCH_OWN_OPTIONS))
    check_model(args.model, args.models_dir,
                engine_options if Device.CPU.value in parse_devices(args.device) else {})
    pytest = require("pytest", extra="bench")
    require("pytest_benchmark", extra="bench")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pytest_args = [
        *map(str, files),
        # The suite's own configuration and root: no pytest.ini or pyproject.toml around the
        # installed package (or a checkout's unit-test settings) applies to it.
        "-c", str(PYTEST_CONFIG),
        f"--rootdir={SUITE_DIR}",
        f"--benchmark-json={out / PYTEST_BENCHMARK_JSON}",
        "--benchmark-columns=min,median,max,rounds",
        f"--bench-model={args.model}",
        f"--bench-models-dir={args.models_dir}",
        f"--bench-engine-options={json.dumps(engine_options)}",
        f"--bench-embedder={args.embedder}",
        *([f"--bench-late-model={args.late_model}"] if args.late_model else []),
        f"--bench-dataset={args.dataset}",
        f"--bench-device={args.device}",
        f"--bench-regimes={args.regimes}",
        f"--bench-out={out}",
        f"--bench-budgets={args.budgets}",
        "-rs",
    ]
    if args.quick:
        pytest_args.append("--bench-quick")
    if args.threads is not None:
        pytest_args.append(f"--bench-threads={args.threads}")
    if args.queries is not None:
        pytest_args.append(f"--bench-queries={args.queries}")
    if args.infinity is not None:
        pytest_args.append(f"--bench-infinity={args.infinity}")
    if args.peer_python is not None:
        pytest_args.append(f"--bench-peer-python={args.peer_python}")
    logger.info("pytest %s", " ".join(pytest_args))
    code = int(pytest.main(pytest_args))
    print(f"onnxrank bench: report in {out} (summary.md, summary.json, "
          f"{PYTEST_BENCHMARK_JSON}, *.png); exit status {code}")
    return code


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `bench` subcommand."""
    parser = subparsers.add_parser(
        COMMAND,
        help="benchmark latency, throughput and batching against baselines and the hardware "
             "ceiling, with budgets",
        description="Run the benchmark suite: every scenario on every requested device, the "
                    "engine interleaved with sentence-transformers, a naive onnxruntime loop and "
                    "fastembed, each contender's throughput as a share of this machine's GEMM "
                    "ceiling; write JSON, markdown and PNG plots; fail when a budget is broken.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    add_flag(parser, COMMAND, "--quick", action=argparse.BooleanOptionalAction, default=False,
             help="2 queries of 10 candidates per scenario: checks the suite and reports ratios, "
                  "but enforces no budget (they are set for the full workload of 50 candidates)")
    add_flag(parser, COMMAND, "--device", default="all", type=_checked(parse_devices),
             help="devices, comma-separated: cpu, cuda, or all (cuda rows say 'unavailable' "
                  "without a CUDAExecutionProvider)")
    add_flag(parser, COMMAND, "--regimes", default=",".join(REGIMES), type=_checked(parse_regimes),
             help="document-length regimes of the latency and throughput scenarios, "
                  f"comma-separated: {', '.join(REGIMES)}")
    add_flag(parser, COMMAND, "--scenarios", default=ALL_SCENARIOS,
             type=_checked(parse_scenarios),
             help=f"scenario groups, comma-separated: {', '.join(SCENARIO_FILES)}; or "
                  f"{ALL_SCENARIOS} (those). Run only when named, never by {ALL_SCENARIOS}: "
                  f"{', '.join(OPT_IN_SCENARIO_FILES)} (full-size checkpoints of other model "
                  "families: each takes far longer than a default run). The ceiling always "
                  "runs, first")
    # The rerank model: the engine's global twins (ONNXRANK_MODEL, ONNXRANK_MODELS_DIR), which
    # mean the same in every command.
    add_flag(parser, None, "--model", default=DEFAULT_RERANK_MODEL,
             help="rerank model: a name under --models-dir, or a model directory")
    add_flag(parser, None, "--models-dir", default=DEFAULT_MODELS_DIR,
             help="where model names are looked up")
    add_flag(parser, COMMAND, "--embedder", default=DEFAULT_EMBEDDER,
             help="embedding model (name or directory) of the retrieval-stages scenario")
    add_flag(parser, COMMAND, "--late-model", default=None,
             help="late-interaction model (name or directory) of the retrieval cascade scenario: "
                  "its stored document vectors over the candidates, then --model over the top "
                  "50; default: that scenario is skipped")
    add_flag(parser, COMMAND, "--dataset", default=str(DEFAULT_DATASET),
             help="dataset directory (corpus.jsonl, queries.jsonl) the workloads are cut from; "
                  "default: the sample shipped with the package")
    add_flag(parser, COMMAND, "--out", default=str(DEFAULT_OUT),
             help="report directory (relative to the working directory)")
    add_flag(parser, COMMAND, "--budgets", default=str(DEFAULT_BUDGETS),
             help="budgets file (TOML); see docs/budgets.md")
    add_flag(parser, COMMAND, "--queries", type=positive_int, default=None,
             help="the most queries a latency or retrieval-stages comparison measures (default: "
                  "40, or 2 with --quick); each stops sooner once its ratios are known to ±5%%, "
                  "or at its time cap")
    add_flag(parser, COMMAND, "--threads", type=positive_int, default=None,
             help="threads for every runtime (default: the CPUs this process may use)")
    add_flag(parser, COMMAND, "--infinity", default=None,
             help="the serving scenario's peer: Infinity's infinity_emb executable (default: the "
                  "one on PATH; reported as skipped, with its install command, when absent)")
    add_flag(parser, COMMAND, "--peer-python", default=None,
             help="the peers scenario's OpenVINO peers (sentence-transformers on OpenVINO and its "
                  "static int8 export), and fastembed's rows where fastembed is not installed "
                  "here, run in a child process of this interpreter, from an environment of "
                  "their own (docs/peers.md); without it their rows are skipped with the command "
                  "that builds it")
    engine = parser.add_argument_group(
        "engine options (same meaning and twins as in every command; for every engine "
        "contender, a sweep varies its own setting on top)")
    add_config_options(engine, EngineConfig, None, exclude=BENCH_OWN_OPTIONS)
    parser.set_defaults(handler=run_bench)
