"""The state one `onnxrank bench` session shares between its scenarios: settings, model, caches,
the hardware ceiling, results and budget verdicts (conftest.py creates it from the --bench-* options).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import pytest

from onnxrank import Reranker
from onnxrank.bench import peer_worker
from onnxrank.bench.baselines import (
    FastembedBaseline,
    NaiveOrtBaseline,
    SentenceTransformersBaseline,
)
from onnxrank.bench.budgets import BudgetFile, Verdict, check_budgets, load_budgets, verdict_table
from onnxrank.bench.ceiling import CPU_ONLY_CEILING, ceiling_share, ceilings_for, peak_share
from onnxrank.bench.contenders import bench_engine_options, describe_engine_options, pairs_contender
from onnxrank.bench.environment import calibrate, device_unavailable_reason, machine_info, parse_devices
from onnxrank.bench.flops import ModelFlops, model_flops
from onnxrank.bench.harness import (
    DEFAULT_PRECISION,
    Contender,
    ScenarioResult,
    StoppingRule,
    measure_interleaved,
    median_interval,
    summarize,
)
from onnxrank.bench.machine import CpuFacts, classify, describe_machine, read_cpu
from onnxrank.bench.peers import (
    PEER_PYTHON_HINT,
    ChildPeer,
    CTranslate2Peer,
    FlashRankPeer,
    fastembed_peer,
    sentence_transformers_peer,
)
from onnxrank.bench.workloads import (
    DEFAULT_CANDIDATES,
    DEFAULT_SEED,
    PassageSource,
    Regime,
    Request,
    Workload,
    build_workload,
    load_dataset,
    parse_regimes,
)
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.devices import usable_cpus
from onnxrank.engine.spec import ModelSpec
from onnxrank.errors import MissingDependencyError, ModelLoadError, RerankError
from onnxrank.types import Device

logger = logging.getLogger(__name__)


def _min_items() -> int:
    """The fewest items whose median has a 95% interval from order statistics (6)."""
    return next(n for n in range(1, 100) if median_interval(range(n)) is not None)


MIN_ITEMS = _min_items()
# The cap of a comparison the time plan does not name (a new scenario's).
DEFAULT_TIME_CAP_S = 60.0
# The untimed warm-up of each contender scores the first request cut to this many candidates:
# first-call costs (sessions, thread pools, kernels) without a whole extra query of the slowest.
WARM_UP_CANDIDATES = 10

BASELINE_CLASSES = {
    "st": SentenceTransformersBaseline,
    "st_fp16": SentenceTransformersBaseline,
    "naive_ort": NaiveOrtBaseline,
    "fastembed": FastembedBaseline,
    "fastembed_fp32": FastembedBaseline,
    "ct2": CTranslate2Peer,
    "flashrank": FlashRankPeer,
}
# Keyword arguments of each baseline beyond (spec, model_dir, device, threads).
BASELINE_OPTIONS: dict[str, dict[str, Any]] = {
    "st_fp16": {"precision": "fp16"},
    "fastembed": {"variant": "int8"},
    "fastembed_fp32": {"variant": "fp32"},
}
# Baselines whose package does not install beside onnxrank's stack (fastembed pins
# huggingface-hub below it): where it is missing here they run in a child process of
# --peer-python (onnxrank.bench.peers), taking the same options plus name and python.
CHILD_BASELINES: dict[str, Callable[..., ChildPeer]] = {
    "fastembed": fastembed_peer,
    "fastembed_fp32": fastembed_peer,
}


def child_timer(baseline: Any) -> Callable[[], float] | None:
    """What times a baseline's score call: a child's own time, else None (the wall time)."""
    return baseline.last_compute_s if isinstance(baseline, ChildPeer) else None


def make_baseline(name: str, spec: ModelSpec, model_dir: Path, *, device: str, threads: int,
                  peer_python: str | None) -> Any:
    """Baseline `name` on the model in `model_dir`: in this process, else (its package missing
    here) in a child of `peer_python` where CHILD_BASELINES has it.

    Raises:
        RerankError, MissingDependencyError: It cannot run here (the message says why).
    """
    options = BASELINE_OPTIONS.get(name, {})
    try:
        return BASELINE_CLASSES[name](spec, model_dir, device=device, threads=threads, **options)
    except MissingDependencyError as err:
        if name not in CHILD_BASELINES:
            raise
        if peer_python is None:
            raise MissingDependencyError(
                f"{err}; or run it in a second environment that has it: pass --peer-python "
                f"PATH, that environment's interpreter ({peer_worker.INSTALL_HINT})") from err
    return CHILD_BASELINES[name](spec, model_dir, name=name, device=device, threads=threads,
                                 python=peer_python, **options)


@dataclasses.dataclass(frozen=True, slots=True)
class Sizes:
    """How much work each scenario may do: --bench-quick uses the small column.

    Query counts are maxima: a comparison stops once its ratios are known to ±5% (after at least
    `min_items` items), or at its time cap (`time_cap_s`).
    """

    candidates: int
    latency_queries: int
    throughput_requests: int
    throughput_requests_per_round: int
    sweep_queries: int
    long_document_queries: int
    max_batch_tokens: tuple[int, ...]
    max_batch_size: tuple[int, ...]
    ceiling_samples: int
    ceiling_sample_seconds: float
    serving_rounds: int
    serving_overload_s: float
    min_items: int = MIN_ITEMS
    time_caps_s: dict[str, float] = dataclasses.field(default_factory=dict)
    default_time_cap_s: float = DEFAULT_TIME_CAP_S

    def time_cap_s(self, scenario: str, regime: str) -> float:
        """The wall-time cap of one comparison: "scenario/regime", else "scenario", else the
        default."""
        return self.time_caps_s.get(f"{scenario}/{regime}",
                                    self.time_caps_s.get(scenario, self.default_time_cap_s))


# The time plan of a full run (docs/benchmarks.md, "How long a full run takes"): every default
# scenario and regime in 15 minutes on 2 cores. Caps are wall seconds per comparison, warm-up
# included; most comparisons stop sooner on a fast machine, and a cap that bites is reported. The
# regimes of the product's promises (short, mixed) get the largest share. Serving caps hold per
# client level; its server and peer start-ups (about a minute on 2 cores) come on top. Embeddings at
# 16 clients get more than the other levels: their budget against the in-process embedder judges
# 10%, and one round's ratio spread 0.67-1.13 on an AVX-512 EPYC (6 rounds in 25 s: too few).
FULL_TIME_CAPS_S = {
    "latency/short": 45.0, "latency/medium": 35.0, "latency/long": 35.0, "latency/mixed": 80.0,
    "throughput/short": 10.0, "throughput/medium": 15.0, "throughput/long": 20.0,
    "throughput/mixed": 15.0,
    "max_batch_tokens": 25.0, "max_batch_size": 25.0, "padding/mixed": 30.0,
    "padding/mixed_uniform": 25.0, "threads": 20.0, "precision": 30.0,
    "long_documents": 25.0, "order_check": 15.0, "retrieval_stages": 15.0,
    "retrieval_cascade": 120.0,
    "overhead/short": 20.0, "overhead/mixed": 20.0, "peers/short": 75.0, "peers/mixed": 150.0,
    "serving_c1": 15.0, "serving_c4": 15.0, "serving_c16/short": 45.0,
    "serving_c16/mixed": 50.0, "serving_c64": 30.0,
    "serving_embed_c1": 10.0, "serving_embed_c4": 10.0, "serving_embed_c16": 40.0,
    "serving_embed_c64": 25.0, "serving_search_c16": 30.0,
}
FULL = Sizes(candidates=DEFAULT_CANDIDATES, latency_queries=40, throughput_requests=40,
             throughput_requests_per_round=4, sweep_queries=20, long_document_queries=10,
             max_batch_tokens=(1024, 2048, 4096, 8192, 16384),
             max_batch_size=(8, 16, 32, 64, 128), ceiling_samples=15,
             ceiling_sample_seconds=0.02, serving_rounds=12, serving_overload_s=10.0,
             time_caps_s=FULL_TIME_CAPS_S)
# Quick checks the suite, not the numbers: fewer candidates and queries keep it short even with a
# full-size model, so its budgets (set for 50 candidates) are reported, never enforced. Its
# overload sends for 1 s per regime: enough to queue and turn requests away, which is what it checks.
QUICK = Sizes(candidates=10, latency_queries=2, throughput_requests=2,
              throughput_requests_per_round=1, sweep_queries=2, long_document_queries=1,
              max_batch_tokens=(512, 2048, 8192), max_batch_size=(8, 64), ceiling_samples=3,
              ceiling_sample_seconds=0.002, serving_rounds=1, serving_overload_s=1.0)


def _warm_up_item(item: Sequence[Request]) -> list[Request]:
    """The first request of `item` cut to WARM_UP_CANDIDATES candidates (see there)."""
    first = item[0]
    return [dataclasses.replace(first, documents=first.documents[:WARM_UP_CANDIDATES],
                                token_counts=first.token_counts[:WARM_UP_CANDIDATES])]


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
        self.late_model_name: str | None = option("--bench-late-model")
        # the interpreter of the OpenVINO peers' environment (None: those rows are skipped)
        self.peer_python: str | None = option("--bench-peer-python")
        # The user's engine options that differ from the defaults (empty: every engine contender
        # "with defaults" runs EngineConfig's defaults).
        self.engine_options = bench_engine_options(json.loads(option("--bench-engine-options")))
        self.results: list[ScenarioResult] = []
        self.verdicts: list[Verdict] = []
        # precision -> the fastest GEMM of that precision (set by the ceiling scenario)
        self.ceilings: dict[str, dict[str, Any]] = {}
        # a run without CPU rows measures no ceiling (test_ceiling.py times CPU GEMMs only)
        self.ceiling_note = ("the ceiling scenario did not run"
                             if Device.CPU.value in self.devices else CPU_ONLY_CEILING)
        self._engines: dict[EngineConfig, Reranker] = {}
        self._baselines: dict[tuple[str, str], Any] = {}
        self._workloads: dict[tuple[str, int, int], Workload] = {}
        self._request_flops: dict[int, float] = {}
        self._source: PassageSource | None = None
        self._calibration_ms: float | None = None
        self._machine: dict[str, Any] | None = None
        self._cpu: CpuFacts | None = None
        self._reference_engine: Reranker | None = None
        # the run's --model as a scenario that loads it itself measured it (the decoder scenario)
        self._measured_spec: ModelSpec | None = None
        self._flops: ModelFlops | str | None = None

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
        """The run's model for the report; it is loaded only by the scenarios that measure it."""
        spec = (self._reference_engine.spec if self._reference_engine is not None
                else self._measured_spec)
        if spec is None:
            return f"{self.model_name}: not loaded (no scenario of this run measured it)"
        return _model_label(spec)

    def record_model(self, spec: ModelSpec) -> None:
        """A scenario that loaded the run's --model itself (the decoder scenario, when --model
        is a decoder reranker) names it for the report."""
        self._measured_spec = spec

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
            self._machine = machine_info()
        return self._machine

    @property
    def cpu(self) -> CpuFacts:
        """What /proc/cpuinfo says about this CPU (flags, clock)."""
        if self._cpu is None:
            self._cpu = read_cpu()
        return self._cpu

    @property
    def machine_class(self) -> str:
        """amx, avx512_vnni_bf16, avx512, avx2 or other: the budgets file keys floors by it."""
        return classify(self.cpu.flags)

    @property
    def peaks(self) -> dict[str, dict[str, Any]]:
        """Per precision, the CPU's estimated peak for the run's threads (one per core)."""
        return describe_machine(self.cpu, self.threads)["peaks"]

    @property
    def model_flops(self) -> ModelFlops | str:
        """FLOPs per pair from the fp32 graph, or why they cannot be counted."""
        if self._flops is None:
            try:
                spec = self.reference_engine.spec
            except ModelLoadError as err:  # a run of the opt-in scenarios, which bring their own model
                self._flops = f"model FLOPs not counted: {err}"
                return self._flops
            if "fp32" not in spec.variants:
                self._flops = (f"model {spec.name!r} has no fp32 variant to count FLOPs on "
                               f"(it has {', '.join(spec.variants)})")
            else:
                try:
                    self._flops = model_flops(self.model_dir / spec.variants["fp32"].file)
                except (ValueError, MissingDependencyError) as err:
                    self._flops = f"model FLOPs not counted: {err}"
        return self._flops

    def workload(self, regime: Regime, queries: int, candidates: int | None = None) -> Workload:
        """The seeded workload of a regime (built once per session and size); `candidates` per
        query (None: the run's size)."""
        candidates = self.sizes.candidates if candidates is None else candidates
        key = (regime.name, queries, candidates)
        if key not in self._workloads:
            if self._source is None:
                self._source = PassageSource(load_dataset(self.dataset_path),
                                             self.reference_engine.tokenizer)
            self._workloads[key] = build_workload(self._source, regime, queries=queries,
                                                  candidates=candidates, seed=DEFAULT_SEED)
        return self._workloads[key]

    def request_flops(self, request: Request) -> float | None:
        """Model FLOPs of scoring every pair of `request` once (each pair truncated at
        max_length, as the engine reads it); None when FLOPs cannot be counted."""
        flops = self.model_flops
        if isinstance(flops, str):
            return None
        key = id(request)
        if key not in self._request_flops:
            engine = self.reference_engine
            encodings = engine.tokenizer.encode_batch(
                [(request.query, document) for document in request.documents])
            # the contenders' max_length: the user's, else the manifest's
            max_length: int = self.engine_options.get("max_length") or engine.spec.max_length
            self._request_flops[key] = flops.pairs(
                [min(len(encoding.ids), max_length) for encoding in encodings])
        return self._request_flops[key]

    def engine_label(self, **overrides: Any) -> str:
        """What `engine(device, **overrides)` runs besides its device and threads, for labels:
        "defaults", or "defaults except" the options that differ."""
        return describe_engine_options(bench_engine_options({**self.engine_options, **overrides}))

    def engine_config(self, device: str, **overrides: Any) -> EngineConfig:
        """The settings of an engine on `device`: the run's threads, the user's engine options,
        then `overrides` (EngineConfig fields: what a scenario varies)."""
        return EngineConfig(device=device, threads=self.threads).with_overrides(
            **{**self.engine_options, **overrides})

    def engine(self, device: str, **overrides: Any) -> Reranker:
        """A Reranker with `engine_config(device, **overrides)`, one per distinct config.

        The default engine of each device is kept for the session; engines with other settings
        live until the end of the test (release_engines), so that a sweep's sessions and their
        memory arenas do not pile up.
        """
        config = self.engine_config(device, **overrides)
        if config not in self._engines:
            self._engines[config] = Reranker.from_dir(self.model_dir, config)
        return self._engines[config]

    def release_engines(self) -> None:
        """Drop every engine except the default one of each device."""
        defaults = {self.engine_config(device) for device in self.devices}
        self._engines = {config: engine for config, engine in self._engines.items()
                         if config in defaults}

    def baseline(self, name: str, device: str) -> Any:
        """A baseline instance, or the reason (str) it cannot run here; cached per session."""
        key = (name, device)
        if key not in self._baselines:
            try:
                self._baselines[key] = make_baseline(
                    name, self.reference_engine.spec, self.model_dir, device=device,
                    threads=self.threads, peer_python=self.peer_python)
            except (RerankError, MissingDependencyError) as err:
                logger.warning("baseline %s skipped on %s: %s", name, device, err)
                self._baselines[key] = f"skipped: {err}"
        return self._baselines[key]

    def child_peer(self, kind: str, device: str) -> ChildPeer | str:
        """The peer of a worker kind (onnxrank.bench.peer_worker) in a child process of
        --peer-python, or the reason (str) it cannot run; cached per session (its start-up
        converts and calibrates the model)."""
        key = (kind, device)
        if key not in self._baselines:
            if self.peer_python is None:
                self._baselines[key] = f"skipped: {PEER_PYTHON_HINT}"
                return self._baselines[key]
            from onnxrank.export.validate import load_calibration_pairs

            calibration = [(pair.query, pair.passage) for pair in load_calibration_pairs()]
            try:
                self._baselines[key] = sentence_transformers_peer(
                    kind, self.reference_engine.spec, self.model_dir, device=device,
                    threads=self.threads, python=self.peer_python, calibration=calibration)
            except (RerankError, MissingDependencyError) as err:
                logger.warning("peer %s skipped on %s: %s", kind, device, err)
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
                                              baseline.score, child_timer(baseline)))
        return contenders, skipped

    def compare(
        self, benchmark: Any, *, scenario: str, regime: str, device: str,
        contenders: Sequence[Contender[Any]], items: Sequence[Sequence[Request]],
        pairs_per_item: Sequence[int], ratios: Sequence[tuple[str, str]],
        skipped: dict[str, str] | None = None, workload: Workload, count_flops: bool = True,
        time_cap_s: float | None = None, precision: float = DEFAULT_PRECISION,
        annotate: Callable[[ScenarioResult], ScenarioResult] | None = None,
    ) -> ScenarioResult:
        """Measure interleaved, record the result, and fail the test on a broken budget.

        Each of `ratios` stops being measured once its median is known to ±`precision` (95%
        interval, after at least ``sizes.min_items`` items); the measurement ends when all are,
        after the last of `items`, or at the time cap. Pass as many items as the comparison may
        take.

        Args:
            count_flops: Report effective model ops/s (False where a contender does more than
                one model pass per pair, as long_documents="max_chunk" does).
            time_cap_s: Wall-time cap of the whole comparison (None: the run's time plan for
                this scenario and regime, see ``Sizes.time_cap_s``).
            precision: Half-width of the interval, relative to the median, that settles a
                ratio (a budget that judges a few percent needs a narrower one than ±5%).
            annotate: What the scenario adds to the result before it is recorded and judged
                (the peers' fidelity and verdicts).
        """
        flops = None
        # The user's long_documents="max_chunk" makes every engine contender a max_chunk one.
        if count_flops and "long_documents" not in self.engine_options:
            per_item = [[self.request_flops(request) for request in item] for item in items]
            if all(value is not None for values in per_item for value in values):
                flops = [float(sum(values)) for values in per_item]  # type: ignore[arg-type]
        stopping = StoppingRule(
            min_items=min(self.sizes.min_items, len(items)), max_items=len(items),
            precision=precision,
            time_cap_s=self.sizes.time_cap_s(scenario, regime) if time_cap_s is None
            else time_cap_s)
        timings = measure_interleaved(benchmark, contenders, items, pairs_per_item,
                                      ratios=ratios, stopping=stopping,
                                      warm_up=_warm_up_item(items[0]))
        measured = [request for item in items[:len(timings.seconds[contenders[0].name])]
                    for request in item]
        result = summarize(scenario, regime, device, contenders, timings, ratios=ratios,
                           skipped=skipped or {},
                           workload=dataclasses.replace(workload,
                                                        requests=tuple(measured)).describe(),
                           flops_per_item=flops)
        if annotate is not None:
            result = annotate(result)
        self.record(benchmark, result)
        return result

    def record(self, benchmark: Any, result: ScenarioResult, *, engine: Reranker | None = None) -> None:
        """Add shares of the ceiling, then `result` to the report and extra_info; fail the test
        on a broken enforced budget. `engine`: the engine of a scenario that measures its own model
        (families, decoder), which then labels the result and picks its budgets; else the run's."""
        spec = (engine or self.reference_engine).spec
        ceilings, ceiling_note, peaks = ceilings_for(result.device, self.ceilings,
                                                     self.ceiling_note, self.peaks)
        for contender in result.contenders.values():
            stats = contender["stats"]
            if "effective_ops_per_s" in stats:
                precision = contender["settings"].get("precision")
                stats.update(ceiling_share(stats["effective_ops_per_s"], precision,
                                           ceilings, ceiling_note))
                stats.update(peak_share(stats["effective_ops_per_s"], precision, peaks))
        benchmark.group = f"{result.scenario}/{result.regime}/{result.device}"
        benchmark.extra_info.update({
            "scenario": result.scenario, "regime": result.regime, "device": result.device,
            "quick": self.quick, "model": _model_label(spec), "threads": self.threads,
            "contenders": {name: value["settings"] for name, value in result.contenders.items()},
            "ratios": result.ratios, "skipped": result.skipped, "workload": result.workload,
            "machine": self.machine, "machine_class": self.machine_class,
            "measurement": result.measurement,
        })
        self.results.append(result)
        verdicts = check_budgets(self.budgets, result, model=spec.name,
                                 scale=self.scale, machine_class=self.machine_class,
                                 not_enforced=self.not_enforced_reason, ceilings=ceilings,
                                 ceiling_note=ceiling_note)
        self.verdicts.extend(verdicts)
        broken = [verdict for verdict in verdicts if verdict.failed]
        if broken:
            pytest.fail("budget broken:\n" + verdict_table(broken), pytrace=False)

    @property
    def not_enforced_reason(self) -> str | None:
        """Why no budget is enforced in this run (a quick run), or None."""
        if not self.quick:
            return None
        return (f"quick run ({self.sizes.candidates} candidates, {self.sizes.latency_queries} "
                f"queries): budgets hold for the full workload of {DEFAULT_CANDIDATES} candidates")

    def skip_scenario(self, scenario: str, regime: str, device: str, reason: str) -> NoReturn:
        """Record a skipped row (shown in the report) and skip the test with `reason`."""
        self.results.append(ScenarioResult(scenario=scenario, regime=regime, device=device,
                                           status=f"skipped: {reason}"))
        pytest.skip(reason)

    def run_metadata(self) -> dict[str, Any]:
        reference = self._reference_engine
        flops = self._flops
        return {
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "quick": self.quick,
            "model": {
                "name": reference.spec.name if reference else self.model_name,
                "path": str(reference.model_dir) if reference else self.model_name,
                "label": self.model_label,
                "variants": list(reference.spec.variants) if reference else [],
                "flops": (dataclasses.asdict(flops) if isinstance(flops, ModelFlops)
                          else flops or "not counted"),
            },
            "dataset": str(self.dataset_path),
            "candidates": self.sizes.candidates,
            "seed": DEFAULT_SEED,
            "devices": self.devices,
            "regimes": [regime.name for regime in self.regimes],
            "threads": self.threads,
            "engine_options": self.engine_options,
            "sizes": dataclasses.asdict(self.sizes),
            "budgets_file": str(self.budgets.path),
            "budgets_enforced": self.not_enforced_reason is None,
            "reference_machine": self.budgets.reference_machine,
            "reference_ms": self.budgets.reference_ms,
            "calibration_ms": self.calibration_ms,
            "scale": self.scale,
            "ceilings": self.ceilings,
            "ceiling_note": self.ceiling_note if not self.ceilings else "",
            "machine": self.machine,
            "cpu": describe_machine(self.cpu, self.threads),
            "machine_class": self.machine_class,
            "peer_python": self.peer_python,
        }


def _model_label(spec: ModelSpec) -> str:
    if spec.relevance_trained:
        return f"{spec.name} (relevance-trained)"
    return (f"{spec.name}: NOT relevance-trained, its scores are NOT relevance scores "
            "(speed measurements only)")
