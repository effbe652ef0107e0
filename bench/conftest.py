"""The bench suite's options, shared state and report hooks (run it with `onnxrank bench`).

Every scenario test measures its contenders interleaved (onnxrank.bench.harness), records a
ScenarioResult here, and fails when a budget in the budgets file is broken. At the end of the
session the report (summary.json, summary.md, PNG plots) is written to --bench-out and the budget
table is printed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from onnxrank import Reranker
from onnxrank.bench.baselines import (
    FLASHRANK_SKIP_REASON,
    FastembedBaseline,
    NaiveOrtBaseline,
    SentenceTransformersBaseline,
)
from onnxrank.bench.budgets import BudgetFile, Verdict, check_budgets, load_budgets, verdict_table
from onnxrank.bench.contenders import pairs_contender
from onnxrank.bench.environment import (
    calibrate,
    device_unavailable_reason,
    machine_info,
    parse_devices,
)
from onnxrank.bench.harness import Contender, ScenarioResult, measure_interleaved, summarize
from onnxrank.bench.report import write_report
from onnxrank.bench.workloads import (
    DEFAULT_CANDIDATES,
    DEFAULT_SEED,
    REGIMES,
    PassageSource,
    Regime,
    Request,
    Workload,
    build_workload,
    load_dataset,
    parse_regimes,
)
from onnxrank.engine.session import usable_cpus
from onnxrank.engine.tokenize import load_tokenizer
from onnxrank.errors import MissingDependencyError, RerankError

logger = logging.getLogger(__name__)

BENCH_DIR = Path(__file__).resolve().parent
REPOSITORY = BENCH_DIR.parent
DEFAULT_DATASET = BENCH_DIR / "data" / "cranfield-sample"
DEFAULT_BUDGETS = BENCH_DIR / "budgets.toml"
DEFAULT_OUT = BENCH_DIR / "results" / "latest"
BASELINE_CLASSES = {
    "st": SentenceTransformersBaseline,
    "naive_ort": NaiveOrtBaseline,
    "fastembed": FastembedBaseline,
}


@dataclasses.dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each scenario does: --bench-quick uses the small column."""

    candidates: int
    latency_queries: int
    throughput_requests: int
    throughput_requests_per_round: int
    sweep_queries: int
    long_document_queries: int
    max_batch_tokens: tuple[int, ...]
    max_batch_size: tuple[int, ...]


# A full CPU run of MiniLM-L6 on 2 idle cores takes about 20 minutes with these sizes (19 min measured).
FULL = Sizes(candidates=DEFAULT_CANDIDATES, latency_queries=20, throughput_requests=40,
             throughput_requests_per_round=8, sweep_queries=8, long_document_queries=4,
             max_batch_tokens=(1024, 2048, 4096, 8192, 16384),
             max_batch_size=(8, 16, 32, 64, 128))
# Quick checks the suite, not the numbers: fewer candidates keep it under 2 minutes even with a
# full-size model.
QUICK = Sizes(candidates=10, latency_queries=2, throughput_requests=2,
              throughput_requests_per_round=1, sweep_queries=2, long_document_queries=1,
              max_batch_tokens=(512, 2048, 8192), max_batch_size=(8, 64))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("onnxrank bench")
    group.addoption("--bench-model", default="minilm-standin",
                    help="model name under --bench-models-dir, or a model directory")
    group.addoption("--bench-models-dir", default=str(REPOSITORY / "models"),
                    help="where model names are looked up")
    group.addoption("--bench-embedder", default="minilm-embedder",
                    help="embedding model (name or directory) of the retrieval-stages scenario")
    group.addoption("--bench-dataset", default=str(DEFAULT_DATASET),
                    help="dataset directory (corpus.jsonl, queries.jsonl)")
    group.addoption("--bench-quick", action="store_true",
                    help="few queries per scenario: checks the suite, not the numbers")
    group.addoption("--bench-device", default="all", help="cpu, cuda, cpu,cuda or all")
    group.addoption("--bench-regimes", default=",".join(REGIMES),
                    help="regimes for the latency and throughput scenarios")
    group.addoption("--bench-queries", type=int, default=None,
                    help="queries of the latency and retrieval scenarios (default: 20, quick 2)")
    group.addoption("--bench-threads", type=int, default=None,
                    help="threads for every runtime (default: usable cores)")
    group.addoption("--bench-out", default=str(DEFAULT_OUT), help="report directory")
    group.addoption("--bench-budgets", default=str(DEFAULT_BUDGETS), help="budgets TOML file")


class BenchRun:
    """State shared by the scenarios of one session: settings, model, caches, results."""

    def __init__(self, config: pytest.Config) -> None:
        option = config.getoption
        self.quick: bool = option("--bench-quick")
        sizes = QUICK if self.quick else FULL
        queries = option("--bench-queries")
        if queries is not None and queries < 1:
            raise ValueError(f"--bench-queries must be >= 1, got {queries}")
        self.sizes = sizes if queries is None else dataclasses.replace(sizes,
                                                                        latency_queries=queries)
        self.devices = parse_devices(option("--bench-device"))
        self.regimes: list[Regime] = parse_regimes(option("--bench-regimes"))
        threads = option("--bench-threads")
        self.threads: int = usable_cpus() if threads is None else threads
        if self.threads < 1:
            raise ValueError(f"--bench-threads must be >= 1, got {self.threads}")
        self.out = Path(option("--bench-out"))
        self.budgets: BudgetFile = load_budgets(option("--bench-budgets"))
        self.dataset_path = Path(option("--bench-dataset"))
        self.model_name: str = option("--bench-model")
        self.models_dir = Path(option("--bench-models-dir"))
        self.embedder_name: str = option("--bench-embedder")
        self.results: list[ScenarioResult] = []
        self.verdicts: list[Verdict] = []
        self._engines: dict[tuple[Any, ...], Reranker] = {}
        self._baselines: dict[tuple[str, str], Any] = {}
        self._workloads: dict[tuple[str, int], Workload] = {}
        self._source: PassageSource | None = None
        self._calibration_ms: float | None = None
        self._machine: dict[str, Any] | None = None
        self._reference_engine: Reranker | None = None

    # --- lazily computed, once per session ----------------------------------------------------

    @property
    def reference_engine(self) -> Reranker:
        """The default engine on CPU: gives the model directory, spec and tokenizer."""
        if self._reference_engine is None:
            self._reference_engine = Reranker.from_pretrained(
                self.model_name, models_dir=self.models_dir, device="cpu", threads=self.threads
            )
        return self._reference_engine

    @property
    def model_dir(self) -> Path:
        return self.reference_engine.model_dir

    @property
    def model_label(self) -> str:
        spec = self.reference_engine.spec
        if spec.relevance_trained:
            return f"{spec.name} (relevance-trained)"
        return (f"{spec.name}: NOT relevance-trained, its scores are NOT relevance scores "
                "(speed measurements only)")

    @property
    def calibration_ms(self) -> float:
        if self._calibration_ms is None:
            self._calibration_ms = calibrate()
        return self._calibration_ms

    @property
    def scale(self) -> float:
        """Factor applied to absolute budgets: this machine now vs the reference machine."""
        return self.calibration_ms / self.budgets.reference_ms

    @property
    def machine(self) -> dict[str, Any]:
        if self._machine is None:
            self._machine = machine_info(REPOSITORY)
        return self._machine

    def workload(self, regime: Regime, queries: int) -> Workload:
        """The seeded workload of a regime (built once per session and size)."""
        key = (regime.name, queries)
        if key not in self._workloads:
            if self._source is None:
                spec = self.reference_engine.spec
                self._source = PassageSource(load_dataset(self.dataset_path),
                                             load_tokenizer(spec, self.model_dir))
            self._workloads[key] = build_workload(self._source, regime, queries=queries,
                                                  candidates=self.sizes.candidates,
                                                  seed=DEFAULT_SEED)
        return self._workloads[key]

    def engine(self, device: str, **settings: Any) -> Reranker:
        """A Reranker on `device` with `settings` (from_dir keywords).

        The default engine of each device is kept for the session; engines with other settings
        live until the end of the test (release_engines), so that a sweep's sessions and their
        memory arenas do not pile up.
        """
        settings.setdefault("threads", self.threads)
        key = (device, tuple(sorted(settings.items())))
        if key not in self._engines:
            self._engines[key] = Reranker.from_dir(self.model_dir, device=device, **settings)
        return self._engines[key]

    def release_engines(self) -> None:
        """Drop every engine except the default one of each device."""
        default = (("threads", self.threads),)
        self._engines = {key: engine for key, engine in self._engines.items()
                         if key[1] == default}

    def baseline(self, name: str, device: str) -> Any:
        """A baseline instance, or the reason (str) it cannot run here; cached per session."""
        key = (name, device)
        if key not in self._baselines:
            try:
                self._baselines[key] = BASELINE_CLASSES[name](
                    self.reference_engine.spec, self.model_dir, device=device,
                    threads=self.threads,
                )
            except (RerankError, MissingDependencyError) as err:
                logger.warning("baseline %s skipped on %s: %s", name, device, err)
                self._baselines[key] = f"skipped: {err}"
        return self._baselines[key]

    # --- measuring and recording ----------------------------------------------------------------

    def require_device(self, scenario: str, regime: str, device: str) -> None:
        """Record an "unavailable" row and skip the test when `device` cannot run here."""
        reason = device_unavailable_reason(device)
        if reason is not None:
            self.results.append(ScenarioResult(scenario=scenario, regime=regime, device=device,
                                               status=reason))
            pytest.skip(reason)

    def baseline_contenders(
        self, device: str, names: Sequence[str]
    ) -> tuple[list[Contender[Sequence[Request]]], dict[str, str]]:
        """Baselines scoring a chunk of requests' pairs, plus skip reasons of the others."""
        contenders, skipped = [], {}
        for name in names:
            baseline = self.baseline(name, device)
            if isinstance(baseline, str):
                skipped[name] = baseline
                continue
            contenders.append(pairs_contender(name, baseline.label, baseline.settings,
                                              baseline.score))
        return contenders, skipped

    def compare(
        self, benchmark: Any, *, scenario: str, regime: str, device: str,
        contenders: Sequence[Contender[Any]], items: Sequence[Any], pairs_per_item: Sequence[int],
        ratios: Sequence[tuple[str, str]], skipped: dict[str, str] | None = None,
        workload: Workload,
    ) -> ScenarioResult:
        """Measure interleaved, record the result, and fail the test on a broken budget."""
        timings = measure_interleaved(benchmark, contenders, items, pairs_per_item)
        result = summarize(scenario, regime, device, contenders, timings, ratios=ratios,
                           skipped=skipped or {}, workload=workload.describe())
        self.record(benchmark, result)
        return result

    def record(self, benchmark: Any, result: ScenarioResult) -> None:
        """Add `result` to the report and extra_info; fail the test on a broken budget."""
        benchmark.group = f"{result.scenario}/{result.regime}/{result.device}"
        benchmark.extra_info.update({
            "scenario": result.scenario, "regime": result.regime, "device": result.device,
            "quick": self.quick, "model": self.model_label, "threads": self.threads,
            "contenders": {name: value["settings"] for name, value in result.contenders.items()},
            "ratios": result.ratios, "skipped": result.skipped, "workload": result.workload,
            "machine": self.machine,
        })
        self.results.append(result)
        verdicts = check_budgets(self.budgets, result, model=self.reference_engine.spec.name,
                                 scale=self.scale)
        self.verdicts.extend(verdicts)
        broken = [verdict for verdict in verdicts if verdict.failed]
        if broken:
            pytest.fail("budget broken:\n" + verdict_table(broken), pytrace=False)

    def skip_scenario(self, scenario: str, regime: str, device: str, reason: str) -> None:
        """Record a skipped row (shown in the report) and skip the test with `reason`."""
        self.results.append(ScenarioResult(scenario=scenario, regime=regime, device=device,
                                           status=f"skipped: {reason}"))
        pytest.skip(reason)

    def run_metadata(self) -> dict[str, Any]:
        reference = self._reference_engine
        return {
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "quick": self.quick,
            "model": {
                "name": reference.spec.name if reference else self.model_name,
                "path": str(reference.model_dir) if reference else self.model_name,
                "label": self.model_label if reference else "not loaded",
                "variants": list(reference.spec.variants) if reference else [],
            },
            "dataset": str(self.dataset_path),
            "candidates": self.sizes.candidates,
            "seed": DEFAULT_SEED,
            "devices": self.devices,
            "regimes": [regime.name for regime in self.regimes],
            "threads": self.threads,
            "sizes": dataclasses.asdict(self.sizes),
            "budgets_file": str(self.budgets.path),
            "reference_machine": self.budgets.reference_machine,
            "reference_ms": self.budgets.reference_ms,
            "calibration_ms": self.calibration_ms,
            "scale": self.scale,
            "machine": self.machine,
            "flashrank": FLASHRANK_SKIP_REASON,
        }


BENCH_RUN = pytest.StashKey[BenchRun]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[BENCH_RUN] = BenchRun(config)


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
    write(f"calibration {run.calibration_ms:.1f} ms vs {run.budgets.reference_ms:.1f} ms on "
          f"{run.budgets.reference_machine}: latency budgets x{run.scale:.2f}")
    write(verdict_table(run.verdicts) if run.verdicts else "no budget applies to this run")
    not_enforced = sum(verdict.verdict.startswith("not enforced") for verdict in run.verdicts)
    if not_enforced:
        write(f"{not_enforced} budgets reported but NOT enforced: they were set for another "
              "model (latencies and model-vs-model ratios depend on model size)")
    skipped = {f"{name} ({result.device})": reason for result in run.results
               for name, reason in result.skipped.items()}
    for name, reason in sorted(skipped.items()):
        write(f"skipped baseline {name}: {reason}")
    failed = sum(verdict.failed for verdict in run.verdicts)
    write(f"{failed} budget(s) broken" if failed else "all enforced budgets met")
    write(f"report: {run.out}")
