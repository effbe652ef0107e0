"""The bench suite's options, shared state and report hooks (run it with `onnxrank bench`).

Every scenario test measures its contenders interleaved (onnxrank.bench.harness), records a
ScenarioResult in the session's BenchRun (bench_run.py), and fails when an enforced budget of the
budgets file is broken (quick runs enforce none). The ceiling scenario runs first, so that every
later contender's effective ops/s can be given as a share of the ceiling of its precision. At the
end of the session the report (summary.json, summary.md, PNG plots) is written to --bench-out and
the budget table is printed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest

from onnxrank.bench.budgets import verdict_table
from onnxrank.bench.harness import DEFAULT_PRECISION
from onnxrank.bench.paths import DEFAULT_BUDGETS, DEFAULT_DATASET, DEFAULT_OUT
from onnxrank.bench.report import interval_text, write_report
from onnxrank.bench.suite.bench_run import BenchRun
from onnxrank.bench.workloads import REGIMES
from onnxrank.engine.runtime import DEFAULT_MODELS_DIR
from onnxrank.rerankers.local import DEFAULT_LOCAL_MODEL
from onnxrank.retrieval.indexer import DEFAULT_EMBEDDER

logger = logging.getLogger(__name__)

FIRST_SCENARIO_FILE = "test_ceiling.py"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("onnxrank bench")
    group.addoption("--bench-model", default=DEFAULT_LOCAL_MODEL,
                    help="model name under --bench-models-dir, or a model directory")
    group.addoption("--bench-models-dir", default=DEFAULT_MODELS_DIR,
                    help="where model names are looked up")
    group.addoption("--bench-engine-options", default="{}",
                    help="EngineConfig options of every engine contender, as a JSON object (not "
                         "device or threads: --bench-device and --bench-threads set those); a "
                         "sweep varies its own setting on top")
    group.addoption("--bench-embedder", default=DEFAULT_EMBEDDER,
                    help="embedding model (name or directory) of the retrieval-stages scenario")
    group.addoption("--bench-late-model", default=None,
                    help="late-interaction model (name or directory) of the retrieval cascade "
                         "scenario; none: that scenario is skipped")
    group.addoption("--bench-dataset", default=str(DEFAULT_DATASET),
                    help="dataset directory (corpus.jsonl, queries.jsonl)")
    group.addoption("--bench-quick", action="store_true",
                    help="few queries per scenario: checks the suite, not the numbers; budgets "
                         "are reported, not enforced")
    group.addoption("--bench-device", default="all", help="cpu, cuda, cpu,cuda or all")
    group.addoption("--bench-regimes", default=",".join(REGIMES),
                    help="regimes for the latency and throughput scenarios")
    group.addoption("--bench-queries", type=int, default=None,
                    help="the most queries of a latency or retrieval-stages comparison (default: "
                         "40, quick 2); each stops sooner once its ratios are known to ±5%%")
    group.addoption("--bench-threads", type=int, default=None,
                    help="threads for every runtime (default: usable cores)")
    group.addoption("--bench-out", default=str(DEFAULT_OUT), help="report directory")
    group.addoption("--bench-infinity", default=None,
                    help="Infinity's infinity_emb executable for the serving scenario (default: "
                         "the one on PATH)")
    group.addoption("--bench-peer-python", default=None,
                    help="interpreter of the environment of the OpenVINO peers (peers scenario) "
                         "and of fastembed where it is not installed here")
    group.addoption("--bench-budgets", default=str(DEFAULT_BUDGETS), help="budgets TOML file")


BENCH_RUN = pytest.StashKey[BenchRun]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[BENCH_RUN] = BenchRun(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The ceiling first: every later scenario divides by it. A stable sort keeps the rest in order.
    items.sort(key=lambda item: item.path.name != FIRST_SCENARIO_FILE)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    run = metafunc.config.stash[BENCH_RUN]
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", run.devices)
    if "regime" in metafunc.fixturenames:
        metafunc.parametrize("regime", run.regimes, ids=[regime.name for regime in run.regimes])


@pytest.fixture(scope="session")
def bench(request: pytest.FixtureRequest) -> BenchRun:
    """The session's BenchRun."""
    return request.config.stash[BENCH_RUN]


@pytest.fixture(scope="session", autouse=True)
def _calibrate(bench: BenchRun) -> None:
    # Measured once, before the first scenario, while nothing of the suite is running.
    logger.info("calibration: %.1f ms", bench.calibration_ms)


@pytest.fixture(autouse=True)
def _release_engines(bench: BenchRun) -> Iterator[None]:
    yield
    bench.release_engines()


def pytest_sessionfinish(session: pytest.Session) -> None:
    run = session.config.stash[BENCH_RUN]
    if run.results:
        write_report(run.out, run.run_metadata(), run.results, run.verdicts)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    run = config.stash[BENCH_RUN]
    if not run.results:
        return
    write = terminalreporter.write_line
    terminalreporter.section("onnxrank bench: budgets")
    write(f"model: {run.model_label}")
    write(f"engine options: {run.engine_label()}")
    write(f"machine class: {run.machine_class} (budgets of other classes are reported, not "
          "enforced)")
    write(f"calibration {run.calibration_ms:.1f} ms vs {run.budgets.reference_ms:.1f} ms on "
          f"{run.budgets.reference_machine}: latency budgets x{run.scale:.2f}")
    for precision, ceiling in run.ceilings.items():
        write(f"{precision} GEMM ceiling: {ceiling['ops_per_s'] / 1e9:.0f} GOP/s "
              f"({ceiling['contender']}, {ceiling['shape']})")
    if not run.ceilings:
        write(f"no GEMM ceiling: {run.ceiling_note}")
    for precision, peak in run.peaks.items():
        rate = "?" if peak["ops_per_s"] is None else f"{peak['ops_per_s'] / 1e9:.0f}"
        write(f"{precision} peak (estimate): {rate} GOP/s = {peak['formula']} "
              f"({peak['instruction']})")
    write("ratios (median over queries, 95% interval of the median, queries it took):")
    for result in run.results:
        for key, ratio in result.ratios.items():
            settled = ("" if ratio.get("within", True)
                       else f", not within ±{ratio.get('precision', DEFAULT_PRECISION):.0%}")
            write(f"  {result.scenario}/{result.regime}/{result.device} {key}: "
                  f"{ratio['median']:.2f}x [{interval_text(ratio)}], {ratio['n']} queries"
                  f"{settled}")
    for result in run.results:
        if result.measurement.get("time_capped"):
            write(f"time cap bit: {result.scenario}/{result.regime}/{result.device}: "
                  f"{result.measurement['stop']}")
    write(verdict_table(run.verdicts) if run.verdicts else "no budget applies to this run")
    if run.not_enforced_reason is not None:
        write(f"budgets reported but NOT enforced: {run.not_enforced_reason}; a full run "
              "(without --quick) enforces them")
    elif any(verdict.verdict.startswith("not enforced") for verdict in run.verdicts):
        write("some budgets reported but NOT enforced: they were set for another model or "
              "another machine class, or follow GEMM ceilings this run did not measure")
    skipped = {f"{result.scenario}: {name} ({result.device})": reason for result in run.results
               for name, reason in result.skipped.items()}
    for name, reason in sorted(skipped.items()):
        write(f"skipped {name}: {reason}")
    failed = sum(verdict.failed for verdict in run.verdicts)
    write(f"{failed} budget(s) broken" if failed else "no enforced budget broken")
    write(f"report: {run.out}")
