"""Interleaved measurement of several contenders on the same items, and the statistics reported.

On a noisy machine, absolute times from separate runs are not comparable: another process may take
a core during one run and not the other. So contenders run in the same process on the same item one
after the other, and they are compared through the median of per-item time ratios. The order on
item i is the contender list rotated by i, so every contender takes every position equally often
and, with three or more contenders, none ever runs twice in a row. Running right after yourself is
an advantage (6-11% in an A/A test here; warm caches and thread pools are the likely cause, not
verified), so the schedule must hand it to nobody. The first contender is the one
pytest-benchmark times; the others run in pytest-benchmark's untimed ``setup`` hook, timed by us.

Every run starts on a quiet process (`wait_until_quiet`, untimed). Thread pools keep spinning
after a run returns: onnxruntime's for about 40 ms (35 ms of CPU while the caller slept, after
the naive and fastembed baselines), torch's OpenMP pool for about 10 ms, OpenVINO's for none
(AMD EPYC, 2 cores). A contender started meanwhile shares the cores with them: the engine took
13-16% longer right after an onnxruntime baseline than right after itself, and as long with a
50 ms pause between them (scratch study, 2026-11-25).

How many items: with a `StoppingRule`, each comparison (a ratio "a/b") stops once its median is
known to +-5%: the 95% confidence interval of the median of its per-item ratios lies within 5% of
that median. The interval is the distribution-free one from order statistics (`median_interval`):
if the per-item ratios are independent draws, the median lies between the k-th smallest and the
k-th largest with a probability given by the binomial distribution, whatever the distribution of
the ratios. It needs no resampling (a bootstrap of the median is unreliable at the 6-20 items
measured here: its resamples take only a few distinct values) and no seed, so the same times give
the same interval. Its price is a minimum: with fewer than 6 items no pair of order statistics
covers the median with 95% probability. A contender whose comparisons are all settled stops
running; the first contender runs on every item. A time cap per comparison is the last guard.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

logger = logging.getLogger(__name__)

Item = TypeVar("Item")
# A comparison is settled when the 95% interval of its median is within +-5% of the median.
DEFAULT_PRECISION = 0.05
DEFAULT_CONFIDENCE = 0.95
# wait_until_quiet: the process is quiet when its threads use under a fifth of a core over a step
QUIET_STEP_S = 0.005
QUIET_CPU_SHARE = 0.2
QUIET_MAX_WAIT_S = 0.25


@dataclass(frozen=True, slots=True)
class Contender(Generic[Item]):
    """Something timed on each item.

    Attributes:
        name: Short key used in ratios and budgets, e.g. "engine", "st", "naive_ort".
        label: Human description for reports.
        run: Processes one item (the work that is timed).
        settings: Device, provider, variant, threads, batching settings: goes to extra_info.
        timer: The seconds of its last run as it measured them itself (a peer in a child
            process: its compute without the pipe); None: the wall time around `run`.
    """

    name: str
    label: str
    run: Callable[[Item], object]
    settings: dict[str, Any] = field(default_factory=dict)
    timer: Callable[[], float] | None = None


@dataclass(frozen=True, slots=True)
class StoppingRule:
    """When a measurement has enough items.

    Attributes:
        min_items: Items every comparison measures at least (unless the time cap comes first).
        max_items: Items at most (None: every item given).
        precision: A comparison is settled when the confidence interval of its median lies within
            median × (1 ± precision).
        confidence: Coverage of that interval.
        time_cap_s: Wall time of the whole measurement (warm-up included) after which no further
            item is started; None: no cap. An item is not started when the last one's time would
            take the measurement past the cap.
    """

    min_items: int
    max_items: int | None = None
    precision: float = DEFAULT_PRECISION
    confidence: float = DEFAULT_CONFIDENCE
    time_cap_s: float | None = None

    def __post_init__(self) -> None:
        if self.min_items < 1 or (self.max_items is not None and self.max_items < self.min_items):
            raise ValueError(f"need 1 <= min_items <= max_items, got {self.min_items} and "
                             f"{self.max_items}")
        if not 0.0 < self.precision < 1.0 or not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"need 0 < precision < 1 and 0.5 <= confidence < 1, got "
                             f"{self.precision} and {self.confidence}")
        if self.time_cap_s is not None and self.time_cap_s <= 0:
            raise ValueError(f"time_cap_s must be > 0 or None, got {self.time_cap_s}")

    def describe(self) -> dict[str, Any]:
        """JSON-ready, for the report."""
        return {"min_items": self.min_items, "max_items": self.max_items,
                "precision": self.precision, "confidence": self.confidence,
                "time_cap_s": self.time_cap_s,
                "interval": "order statistics of the median (distribution-free, binomial)"}


@dataclass(frozen=True, slots=True)
class Timings:
    """Seconds per item for each contender, in item order.

    A contender that stopped early (its comparisons settled) has times for the first items only.

    Attributes:
        seconds: Per contender, the seconds of each item it ran, from the first item on.
        pairs_per_item: Pairs of every item given (measured or not).
        stop: How the measurement ended: "all items", "every comparison within ±5%" ... (one line).
        time_capped: True when the time cap ended it.
        elapsed_s: Wall time of the whole measurement, warm-up included.
        rule: The stopping rule applied (None: every item was measured).
    """

    seconds: dict[str, list[float]]
    pairs_per_item: list[int]
    stop: str = "all items"
    time_capped: bool = False
    elapsed_s: float = 0.0
    rule: StoppingRule | None = None


class _Enough(Exception):
    """Ends pytest-benchmark's rounds early: the stopping rule says every comparison is known."""


def median_interval(values: Sequence[float], confidence: float = DEFAULT_CONFIDENCE
                    ) -> tuple[float, float, float] | None:
    """The distribution-free confidence interval of the median of independent draws.

    The k-th smallest and the k-th largest of n draws enclose the median unless at most k-1 of
    them fall on one side of it, which has probability P(B <= k-1) per side with B ~ Bin(n, 1/2).
    k is the largest with 2 P(B <= k-1) <= 1 - confidence.

    Returns:
        (low, high, coverage), coverage being the interval's exact probability of covering the
        median (>= confidence); None when no interval reaches `confidence` (fewer than 6 values
        at 95%).
    """
    ordered = sorted(values)
    n = len(ordered)
    tail, below, k = 0.0, 0.0, 0
    for j in range(n // 2 + 1):
        below += math.comb(n, j) / 2.0 ** n  # P(B <= j)
        if 2.0 * below > 1.0 - confidence:
            break
        k, tail = j + 1, below
    if k == 0:
        return None
    return ordered[k - 1], ordered[n - k], 1.0 - 2.0 * tail


def within(stats: dict[str, Any], precision: float) -> bool:
    """True when `stats` (of `ratio_stats` or `median_stats`) has an interval within
    median × (1 ± precision)."""
    low, high = stats.get("ci_low"), stats.get("ci_high")
    if low is None or high is None:
        return False
    median = stats["median"]
    return bool(low >= median * (1.0 - precision) and high <= median * (1.0 + precision))


def wait_until_quiet(*, step_s: float = QUIET_STEP_S, cpu_share: float = QUIET_CPU_SHARE,
                     max_wait_s: float = QUIET_MAX_WAIT_S) -> float:
    """Sleep until this process's threads use under `cpu_share` of a core over a step of
    `step_s` (spinning thread pools of the last run gone idle), at most `max_wait_s`.

    Returns:
        The seconds waited.
    """
    started = time.perf_counter()
    for _ in range(max(1, math.ceil(max_wait_s / step_s))):  # sleeps only overshoot: time-bound
        step_started, cpu_before = time.perf_counter(), time.process_time()
        time.sleep(step_s)
        if time.process_time() - cpu_before <= cpu_share * (time.perf_counter() - step_started):
            break
    return time.perf_counter() - started


def interleaved_order(contenders: int, items: int) -> list[tuple[int, int]]:
    """The (contender, item) run order: on item i, contenders rotated by i.

    With two contenders this is A B | B A | A B ..., with three A B C | B C A | C A B ...: each
    contender holds each position equally often, and no contender runs twice in a row unless
    there are only two (then both do, equally often).

    Raises:
        ValueError: contenders < 1 or items < 0.
    """
    if contenders < 1 or items < 0:
        raise ValueError(f"need contenders >= 1 and items >= 0, got {contenders} and {items}")
    order = []
    for item in range(items):
        shift = item % contenders
        order += [(contender, item) for contender in
                  [*range(shift, contenders), *range(shift)]]
    return order


class _Schedule:
    """The run order of `measure_interleaved`, deciding at each item boundary whether to go on.

    Without a rule it is `interleaved_order` over every item. With one, after each complete item
    every open comparison whose interval is within the rule's precision (after at least
    min_items) is settled; contenders left in no open comparison stop (the first never does);
    the rest rotate as before. It ends when every comparison is settled, at max_items, or when
    the next item would end past the time cap.
    """

    def __init__(self, names: Sequence[str], items: int, ratios: Sequence[tuple[str, str]],
                 rule: StoppingRule | None, seconds: dict[str, list[float]]) -> None:
        self.names = list(names)
        self.items = items if rule is None or rule.max_items is None else min(items,
                                                                               rule.max_items)
        self.ratios = [pair for pair in dict.fromkeys(ratios)
                       if pair[0] in seconds and pair[1] in seconds]
        self.rule = rule
        self.seconds = seconds
        self.measured = dict.fromkeys(names, 0)  # items each contender ran
        self.stop = f"all {self.items} items"
        self.time_capped = False
        self.started = time.perf_counter()

    def __iter__(self) -> Iterator[tuple[int, int]]:
        active = list(range(len(self.names)))
        for item in range(self.items):
            if item:
                for index in active:
                    self.measured[self.names[index]] = item
                if self.rule is not None:
                    kept = self._still_needed(item, active)
                    if kept is None:
                        return
                    active = kept
            shift = item % len(active)
            for index in [*active[shift:], *active[:shift]]:
                yield index, item
        for index in active:
            self.measured[self.names[index]] = self.items

    def _open(self, done: int) -> list[tuple[str, str]]:
        """Comparisons not yet known to the rule's precision after `done` items (a contender
        alone, without comparisons, is compared with itself: its median time)."""
        assert self.rule is not None
        if done < self.rule.min_items:
            return list(self.ratios) or [(self.names[0], self.names[0])]
        if not self.ratios:
            times = self.seconds[self.names[0]][:done]
            settled = within(median_stats(times, self.rule.confidence), self.rule.precision)
            return [] if settled else [(self.names[0], self.names[0])]
        return [(faster, slower) for faster, slower in self.ratios
                if not within(ratio_stats(self.seconds[faster][:done], self.seconds[slower][:done],
                                          confidence=self.rule.confidence), self.rule.precision)]

    def _still_needed(self, done: int, active: list[int]) -> list[int] | None:
        """The contenders to run on the next item, or None to stop after `done` items."""
        assert self.rule is not None
        still_open = self._open(done)
        if not still_open:
            self.stop = (f"every comparison within ±{self.rule.precision:.0%} after {done} items "
                         f"({self.rule.confidence:.0%} interval of the median)")
            return None
        cap = self.rule.time_cap_s
        last_item = sum(self.seconds[self.names[index]][done - 1] for index in active)
        if cap is not None and time.perf_counter() - self.started + last_item > cap:
            self.time_capped = True
            self.stop = (f"time cap of {cap:.0f} s after {done} items; not within "
                         f"±{self.rule.precision:.0%}: "
                         + ", ".join(f"{a}/{b}" if a != b else f"{a} (median time)"
                                     for a, b in still_open))
            return None
        in_ratios = {name for pair in self.ratios for name in pair}
        needed = {name for pair in still_open for name in pair}
        return [index for index in active if index == 0 or self.names[index] in needed
                or self.names[index] not in in_ratios]


def measure_interleaved(
    benchmark: Any, contenders: Sequence[Contender[Item]], items: Sequence[Item],
    pairs_per_item: Sequence[int], *, ratios: Sequence[tuple[str, str]] = (),
    stopping: StoppingRule | None = None, warm_up: Item | None = None,
) -> Timings:
    """Time every contender on the items, in the order of `interleaved_order`.

    The first contender is benchmarked with ``benchmark.pedantic`` (one round per item), so
    pytest-benchmark's own statistics describe it; the runs of the others between two of its runs
    happen in pytest-benchmark's setup hook. Each contender first runs once on `warm_up`
    (default ``items[0]``) untimed (session warm-up, allocator growth).

    Args:
        benchmark: The pytest-benchmark fixture.
        contenders: Contenders; the first is pytest-benchmark's target.
        items: Work items (a request, or a chunk of requests), at most as many as are measured.
        pairs_per_item: Pairs scored per item, for pairs/s.
        ratios: The (faster, slower) comparisons the stopping rule watches.
        stopping: When to stop (see `StoppingRule`); None: every contender on every item.
        warm_up: The item of the untimed first run (None: ``items[0]``).

    Raises:
        ValueError: No contenders or no items.
        RuntimeError: pytest-benchmark is disabled, so nothing would be timed.
    """
    if not contenders or not items:
        raise ValueError(
            f"need at least one contender and one item, got {len(contenders)} and {len(items)}"
        )
    if getattr(benchmark, "disabled", False):
        raise RuntimeError(
            "pytest-benchmark is disabled (--benchmark-disable, or pytest-xdist is active); "
            "the bench suite needs it enabled"
        )
    # NaN until timed, so a run the order missed could not pass for a real time.
    seconds = {contender.name: [math.nan] * len(items) for contender in contenders}
    schedule = _Schedule([contender.name for contender in contenders], len(items), ratios,
                         stopping, seconds)
    for contender in contenders:
        wait_until_quiet()
        contender.run(items[0] if warm_up is None else warm_up)

    def run(contender: Contender[Item], item: int) -> None:
        started = time.perf_counter()
        contender.run(items[item])
        wall = time.perf_counter() - started
        seconds[contender.name][item] = wall if contender.timer is None else contender.timer()

    pending = iter(schedule)

    def setup() -> tuple[tuple[int], dict[str, Any]]:
        # Runs the others up to the primary's next run, which pytest-benchmark then times.
        for index, item in pending:
            wait_until_quiet()
            if index == 0:
                return (item,), {}
            run(contenders[index], item)
        raise _Enough  # the rule stopped before pytest-benchmark's last round

    try:
        benchmark.pedantic(lambda item: run(contenders[0], item), setup=setup,
                           rounds=schedule.items, iterations=1)
    except _Enough:
        # pytest-benchmark marks a run that raised as failed and leaves it out of its report;
        # its rounds so far are complete and are the measurement (the hook spec of
        # pytest_benchmark_generate_json shows this flag being cleared the same way).
        benchmark.has_error = False
    for index, item in pending:  # the others after the primary's last run
        wait_until_quiet()
        run(contenders[index], item)
    measured = {name: values[:schedule.measured[name]] for name, values in seconds.items()}
    missed = [name for name, values in measured.items() if any(map(math.isnan, values))]
    if missed:
        raise AssertionError(f"the schedule skipped items of {missed}")
    return Timings(seconds=measured, pairs_per_item=list(pairs_per_item), stop=schedule.stop,
                   time_capped=schedule.time_capped,
                   elapsed_s=time.perf_counter() - schedule.started, rule=stopping)


def time_stats(seconds: Sequence[float], pairs: Sequence[int],
               flops: Sequence[float] | None = None) -> dict[str, float]:
    """Latency percentiles in ms (p50/p95/p99 with min/median/max/mean) and pairs per second.

    `pairs` (and `flops`) may run on past `seconds` (items a contender did not run): only the
    first ``len(seconds)`` count. With `flops` (model FLOPs per item) also
    ``effective_ops_per_s``: the model's work over the total time, whatever the contender actually
    computed (padding, pruning, int8).
    """
    pairs = pairs[:len(seconds)]
    flops = None if flops is None else flops[:len(seconds)]
    values = np.asarray(seconds, dtype=np.float64) * 1000.0
    extra = {} if flops is None else {
        "effective_ops_per_s": float(np.sum(flops) / (values.sum() / 1000.0))}
    return {
        "n": int(values.size),
        "min_ms": float(values.min()),
        "p50_ms": float(np.percentile(values, 50)),
        "p95_ms": float(np.percentile(values, 95)),
        "p99_ms": float(np.percentile(values, 99)),
        "max_ms": float(values.max()),
        "mean_ms": float(values.mean()),
        "pairs_per_s": float(np.sum(pairs) / (values.sum() / 1000.0)),
        **extra,
    }


def median_stats(values: Sequence[float], confidence: float = DEFAULT_CONFIDENCE
                 ) -> dict[str, Any]:
    """min/median/max of `values`, with the confidence interval of the median (`median_interval`;
    ci_low and ci_high are None when too few values give one)."""
    array = np.asarray(values, dtype=np.float64)
    interval = median_interval(array.tolist(), confidence)
    low, high, coverage = interval if interval is not None else (None, None, None)
    return {
        "n": int(array.size),
        "min": float(array.min()),
        "median": float(np.median(array)),
        "max": float(array.max()),
        "ci_low": low,
        "ci_high": high,
        "ci_coverage": coverage,
    }


def ratio_stats(faster: Sequence[float], slower: Sequence[float], *,
                confidence: float = DEFAULT_CONFIDENCE) -> dict[str, Any]:
    """Per-item speed-up of `faster` over `slower` (slower time / faster time): min/median/max
    and the confidence interval of the median, over the items both ran."""
    common = min(len(faster), len(slower))
    ratios = (np.asarray(slower[:common], dtype=np.float64)
              / np.asarray(faster[:common], dtype=np.float64))
    return median_stats(ratios.tolist(), confidence)


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    """One row group of the report: a scenario on one regime and device.

    Attributes:
        scenario: "latency", "throughput", "padding", "max_batch_tokens", ...
        regime: Workload regime name.
        device: "cpu" or "cuda".
        status: "measured", or why not ("unavailable: no CUDAExecutionProvider", "skipped: ...").
        contenders: Per contender: label, settings and time_stats.
        ratios: Per "a/b" key: ratio_stats of a's speed-up over b (with ``within``: whether its
            interval met the stopping rule's ``precision``, also given).
        skipped: Contenders that could not run, with the reason.
        workload: Workload.describe() of what was measured.
        measurement: How many items, why it stopped, the rule and whether its time cap bit.
        fidelity: Per contender, its agreement with PyTorch fp32 on the requests it ran
            (onnxrank.bench.fidelity; the peers scenario only).
        pareto: Per peer, whether the engine is faster at no lower fidelity (the same).
    """

    scenario: str
    regime: str
    device: str
    status: str = "measured"
    contenders: dict[str, dict[str, Any]] = field(default_factory=dict)
    ratios: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)
    measurement: dict[str, Any] = field(default_factory=dict)
    fidelity: dict[str, dict[str, Any]] = field(default_factory=dict)
    pareto: dict[str, dict[str, Any]] = field(default_factory=dict)


def summarize(
    scenario: str, regime: str, device: str, contenders: Sequence[Contender[Any]],
    timings: Timings, *, ratios: Sequence[tuple[str, str]], skipped: dict[str, str],
    workload: dict[str, Any], flops_per_item: Sequence[float] | None = None,
) -> ScenarioResult:
    """Statistics of interleaved timings, with the requested (faster, slower) speed-up ratios.

    Args:
        flops_per_item: Model FLOPs of each item, for effective ops/s (None: not reported).
    """
    rule = timings.rule
    confidence = DEFAULT_CONFIDENCE if rule is None else rule.confidence
    precision = DEFAULT_PRECISION if rule is None else rule.precision
    compared = {}
    for faster, slower in ratios:
        if faster in timings.seconds and slower in timings.seconds:
            stats = ratio_stats(timings.seconds[faster], timings.seconds[slower],
                                confidence=confidence)
            compared[f"{faster}/{slower}"] = {**stats, "within": within(stats, precision),
                                              "precision": precision}
    return ScenarioResult(
        scenario=scenario,
        regime=regime,
        device=device,
        contenders={
            contender.name: {
                "label": contender.label,
                "settings": contender.settings,
                "stats": time_stats(timings.seconds[contender.name], timings.pairs_per_item,
                                    flops_per_item),
            }
            for contender in contenders
        },
        ratios=compared,
        skipped=dict(skipped),
        workload=workload,
        measurement=measurement_summary(timings, contenders[0].name, compared=bool(compared)),
    )


def measurement_summary(timings: Timings, primary: str, *, compared: bool) -> dict[str, Any]:
    """How a measurement went, for the report: items of the first contender, why it stopped,
    whether the time cap bit, its wall time and rule; without comparisons (`compared` False) also
    the median time per item with its interval, which the rule then watched."""
    rule = timings.rule
    summary: dict[str, Any] = {
        "items": len(timings.seconds[primary]), "stop": timings.stop,
        "time_capped": timings.time_capped, "elapsed_s": timings.elapsed_s,
        "rule": None if rule is None else rule.describe(),
    }
    if not compared:
        confidence = DEFAULT_CONFIDENCE if rule is None else rule.confidence
        stats = median_stats(timings.seconds[primary], confidence)
        precision = DEFAULT_PRECISION if rule is None else rule.precision
        summary["median_time"] = {**stats, "within": within(stats, precision)}
    return summary
