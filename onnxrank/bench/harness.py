"""Interleaved measurement of several contenders on the same items, and the statistics reported.

On a noisy machine, absolute times from separate runs are not comparable: another process may take
a core during one run and not the other. So contenders run in the same process on the same item one
after the other, and they are compared through the median of per-item time ratios. The order on
item i is the contender list rotated by i, so every contender takes every position equally often
and, with three or more contenders, none ever runs twice in a row. Running right after yourself is
an advantage (6-11% in an A/A test here; warm caches and thread pools are the likely cause, not
verified), so the schedule must hand it to nobody. The first contender is the one
pytest-benchmark times; the others run in pytest-benchmark's untimed ``setup`` hook, timed by us.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

logger = logging.getLogger(__name__)

Item = TypeVar("Item")


@dataclass(frozen=True, slots=True)
class Contender(Generic[Item]):
    """Something timed on each item.

    Attributes:
        name: Short key used in ratios and budgets, e.g. "engine", "st", "naive_ort".
        label: Human description for reports.
        run: Processes one item (the work that is timed).
        settings: Device, provider, variant, threads, batching settings: goes to extra_info.
    """

    name: str
    label: str
    run: Callable[[Item], object]
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Timings:
    """Seconds per item for each contender, in item order."""

    seconds: dict[str, list[float]]
    pairs_per_item: list[int]


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


def measure_interleaved(
    benchmark: Any, contenders: Sequence[Contender[Item]], items: Sequence[Item],
    pairs_per_item: Sequence[int],
) -> Timings:
    """Time every contender on every item, in the order of `interleaved_order`.

    The first contender is benchmarked with ``benchmark.pedantic`` (one round per item), so
    pytest-benchmark's own statistics describe it; the runs of the others between two of its runs
    happen in pytest-benchmark's setup hook. Each contender first runs once on ``items[0]``
    untimed (session warm-up, allocator growth).

    Args:
        benchmark: The pytest-benchmark fixture.
        contenders: Contenders; the first is pytest-benchmark's target.
        items: Work items (a request, or a chunk of requests).
        pairs_per_item: Pairs scored per item, for pairs/s.

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
    for contender in contenders:
        contender.run(items[0])

    def run(contender: Contender[Item], item: int) -> None:
        started = time.perf_counter()
        contender.run(items[item])
        seconds[contender.name][item] = time.perf_counter() - started

    pending = iter(interleaved_order(len(contenders), len(items)))

    def setup() -> tuple[tuple[int], dict[str, Any]]:
        # Runs the others up to the primary's next run, which pytest-benchmark then times.
        for index, item in pending:
            if index == 0:
                return (item,), {}
            run(contenders[index], item)
        raise AssertionError("every item has a primary run, so pedantic's rounds cannot overrun")

    benchmark.pedantic(lambda item: run(contenders[0], item), setup=setup, rounds=len(items),
                       iterations=1)
    for index, item in pending:  # the others after the primary's last run
        run(contenders[index], item)
    return Timings(seconds=seconds, pairs_per_item=list(pairs_per_item))


def time_stats(seconds: Sequence[float], pairs: Sequence[int],
               flops: Sequence[float] | None = None) -> dict[str, float]:
    """Latency percentiles in ms (p50/p95/p99 with min/median/max/mean) and pairs per second.

    With `flops` (model FLOPs per item) also ``effective_ops_per_s``: the model's work over the
    total time, whatever the contender actually computed (padding, pruning, int8).
    """
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


def ratio_stats(faster: Sequence[float], slower: Sequence[float]) -> dict[str, float]:
    """Per-item speed-up of `faster` over `slower` (slower time / faster time): min/median/max."""
    ratios = np.asarray(slower, dtype=np.float64) / np.asarray(faster, dtype=np.float64)
    return {
        "n": int(ratios.size),
        "min": float(ratios.min()),
        "median": float(np.median(ratios)),
        "max": float(ratios.max()),
    }


@dataclass(frozen=True, slots=True)
class ScenarioResult:
    """One row group of the report: a scenario on one regime and device.

    Attributes:
        scenario: "latency", "throughput", "padding", "max_batch_tokens", ...
        regime: Workload regime name.
        device: "cpu" or "cuda".
        status: "measured", or why not ("unavailable: no CUDAExecutionProvider", "skipped: ...").
        contenders: Per contender: label, settings and time_stats.
        ratios: Per "a/b" key: ratio_stats of a's speed-up over b.
        skipped: Contenders that could not run, with the reason.
        workload: Workload.describe() of what was measured.
    """

    scenario: str
    regime: str
    device: str
    status: str = "measured"
    contenders: dict[str, dict[str, Any]] = field(default_factory=dict)
    ratios: dict[str, dict[str, float]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)


def summarize(
    scenario: str, regime: str, device: str, contenders: Sequence[Contender[Any]],
    timings: Timings, *, ratios: Sequence[tuple[str, str]], skipped: dict[str, str],
    workload: dict[str, Any], flops_per_item: Sequence[float] | None = None,
) -> ScenarioResult:
    """Statistics of interleaved timings, with the requested (faster, slower) speed-up ratios.

    Args:
        flops_per_item: Model FLOPs of each item, for effective ops/s (None: not reported).
    """
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
        ratios={
            f"{faster}/{slower}": ratio_stats(timings.seconds[faster], timings.seconds[slower])
            for faster, slower in ratios
            if faster in timings.seconds and slower in timings.seconds
        },
        skipped=dict(skipped),
        workload=workload,
    )
