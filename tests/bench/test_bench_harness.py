"""Interleaving order, stopping rule and statistics of onnxrank.bench.harness (with the real
benchmark fixture).

The stopping-rule tests give every contender a fixed duration per item on a clock of their own
(the harness reads that clock instead of the wall's), so the stopping points are exact.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import pytest

from onnxrank.bench import harness
from onnxrank.bench.harness import (
    Contender,
    StoppingRule,
    interleaved_order,
    measure_interleaved,
    median_interval,
    ratio_stats,
    summarize,
    time_stats,
)


def _contenders(log: list[str]) -> list[Contender[int]]:
    return [Contender(name=name, label=name, run=lambda item, name=name: log.append(f"{name}{item}"))
            for name in ("A", "B", "C")]


@pytest.mark.parametrize("items", [4, 5])
def test_contenders_rotate_item_by_item(benchmark, items: int) -> None:
    log: list[str] = []
    timings = measure_interleaved(benchmark, _contenders(log), list(range(items)), [50] * items)
    warm_up, measured = log[:3], log[3:]
    assert warm_up == ["A0", "B0", "C0"]
    expected = ["A0", "B0", "C0", "B1", "C1", "A1", "C2", "A2", "B2", "A3", "B3", "C3", "B4",
                "C4", "A4"]
    assert measured == expected[:3 * items]
    assert all(len(seconds) == items and not any(np.isnan(seconds))
               for seconds in timings.seconds.values())
    assert benchmark.stats.stats.rounds == items


def _spinner(seconds: float) -> None:
    """Start a thread that keeps a core busy for `seconds`, like a thread pool spinning after a run."""
    def spin() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    threading.Thread(target=spin, daemon=True).start()


def test_wait_until_quiet_outlasts_a_spinning_thread() -> None:
    # 50 ms steps, not the bench's 5 ms: under the other worker's load a spinning thread can get
    # under a fifth of a core in one short step and look quiet (the bench runs alone). The
    # spinner runs for 100 ms, so the wait takes at least two steps.
    _spinner(0.1)
    assert harness.wait_until_quiet(step_s=0.05, max_wait_s=5.0) >= 0.1
    # an idle process is quiet at the first step
    assert harness.wait_until_quiet(max_wait_s=5.0) < 1.0


def test_no_run_starts_while_the_last_one_still_spins(benchmark, monkeypatch: pytest.MonkeyPatch) -> None:
    # steps longer than a spinner's 30 ms (see above); a spinner counts as spinning until its
    # deadline, not while alive: a thread starved by the other worker can outlive its deadline
    monkeypatch.setattr(harness, "wait_until_quiet", partial(harness.wait_until_quiet, step_s=0.05))
    deadlines: list[float] = []
    overlapped: list[str] = []

    def run(item: int, name: str) -> None:
        if any(deadline > time.perf_counter() for deadline in deadlines):
            overlapped.append(f"{name}{item}")
        _spinner(0.03)  # returns at once, leaving a busy thread behind
        deadlines.append(time.perf_counter() + 0.03)

    contenders = [Contender(name=name, label=name, run=lambda item, name=name: run(item, name))
                  for name in ("A", "B")]
    measure_interleaved(benchmark, contenders, list(range(3)), [50] * 3)
    assert len(deadlines) == 8 and overlapped == []


@pytest.mark.parametrize("contenders", [3, 4, 5])
def test_order_favours_no_contender(contenders: int) -> None:
    # Running right after yourself is faster (an A/A test of identical engines under the old
    # order, which gave the first contender that, measured it 6-11% faster than its copies).
    items = 2 * contenders
    order = interleaved_order(contenders, items)
    assert sorted(order) == [(c, i) for c in range(contenders) for i in range(items)]
    assert all(a[0] != b[0] for a, b in zip(order, order[1:]))
    positions = np.zeros((contenders, contenders), dtype=int)
    for index, (contender, _) in enumerate(order):
        positions[contender, index % contenders] += 1
    assert np.all(positions == items // contenders)


def test_order_needs_contenders() -> None:
    with pytest.raises(ValueError, match=re.escape(
        "need contenders >= 1 and items >= 0, got 0 and 3"
    )):
        interleaved_order(0, 3)


def test_two_contenders_run_twice_in_a_row_equally_often() -> None:
    order = [contender for contender, _ in interleaved_order(2, 6)]
    assert order == [0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0]


def test_time_stats_against_numpy() -> None:
    seconds = [0.1, 0.2, 0.3, 0.4, 1.0]
    stats = time_stats(seconds, [50] * 5)
    assert stats["p50_ms"] == pytest.approx(300.0)
    assert stats["p95_ms"] == pytest.approx(np.percentile(seconds, 95) * 1000)
    assert stats["min_ms"] == pytest.approx(100.0) and stats["max_ms"] == pytest.approx(1000.0)
    assert stats["pairs_per_s"] == pytest.approx(250 / 2.0)


def test_ratio_stats_is_per_item_speed_up() -> None:
    ratios = ratio_stats(faster=[1.0, 2.0, 1.0], slower=[3.0, 4.0, 5.0])
    assert ratios == {"n": 3, "min": 2.0, "median": 3.0, "max": 5.0, "ci_low": None,
                      "ci_high": None, "ci_coverage": None}
    # over the items both ran: a contender that stopped early has fewer
    assert ratio_stats(faster=[1.0] * 8, slower=[2.0] * 6)["n"] == 6


def _coverage_by_enumeration(n: int, k: int) -> float:
    """P(k-th smallest <= median <= k-th largest) over all 2^n sides of the median."""
    inside = sum(k <= sum(sides) <= n - k for sides in itertools.product((0, 1), repeat=n))
    return inside / 2 ** n


@pytest.mark.parametrize("n", [1, 5, 6, 7, 10, 13])
def test_median_interval_is_the_order_statistic_interval(n: int) -> None:
    values = [float(value) for value in np.random.default_rng(n).permutation(n) * 1.5]
    ordered = sorted(values)
    # the widest k whose interval covers the median with >= 95%, found by brute force
    ks = [k for k in range(1, n // 2 + 1) if _coverage_by_enumeration(n, k) >= 0.95]
    interval = median_interval(values)
    if not ks:
        assert interval is None
        return
    k = max(ks)
    assert interval is not None
    low, high, coverage = interval
    assert (low, high) == (ordered[k - 1], ordered[n - k])
    assert coverage == pytest.approx(_coverage_by_enumeration(n, k))


class _Clock:
    """The harness's clock in these tests: advanced by the contenders' fixed durations."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:  # wait_until_quiet: no CPU is ever used here
        pass

    def process_time(self) -> float:
        return 0.0


def _timed(clock: _Clock, log: list[str], name: str,
           duration: Callable[[int], float]) -> Contender[int]:
    def run(item: int) -> None:
        log.append(f"{name}{item}")
        clock.now += duration(item)
    return Contender(name=name, label=name, run=run)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    fake = _Clock()
    monkeypatch.setattr(harness, "time", fake)
    return fake


def _measure(benchmark, contenders: Sequence[Contender[int]], items: int,
             ratios: Sequence[tuple[str, str]], rule: StoppingRule) -> harness.Timings:
    return measure_interleaved(benchmark, contenders, list(range(items)), [50] * items,
                               ratios=ratios, stopping=rule, warm_up=-1)


def test_a_settled_comparison_stops_after_the_minimum(benchmark, clock: _Clock) -> None:
    log: list[str] = []
    # B takes twice A's time on every item (within 1%): the ratio is known at once
    contenders = [_timed(clock, log, "A", lambda item: 1.0),
                  _timed(clock, log, "B", lambda item: 2.0 + 0.01 * (item % 2))]
    timings = _measure(benchmark, contenders, 20, [("A", "B")], StoppingRule(min_items=6))
    assert {name: len(values) for name, values in timings.seconds.items()} == {"A": 6, "B": 6}
    assert timings.stop == ("every comparison within ±5% after 6 items (95% interval of the "
                            "median)")
    assert not timings.time_capped
    assert log[:2] == ["A-1", "B-1"]  # the warm-up item
    assert len(log) == 2 + 12
    # pytest-benchmark timed the first contender on the 6 items and keeps the benchmark
    assert benchmark.stats.stats.rounds == 6 and not benchmark.has_error
    ratio = ratio_stats(timings.seconds["A"], timings.seconds["B"])
    assert ratio["n"] == 6 and ratio["ci_low"] == pytest.approx(2.0)
    assert ratio["ci_high"] == pytest.approx(2.01)


@pytest.mark.parametrize(("precision", "items"), [(0.05, 6), (0.02, 12)])
def test_a_narrower_precision_measures_longer(benchmark, clock: _Clock, precision: float,
                                              items: int) -> None:
    log: list[str] = []
    # B's time swings by 6% (2.0 or 2.12 per item): its ratio is known to ±5% at once, never to ±2%
    contenders = [_timed(clock, log, "A", lambda item: 1.0),
                  _timed(clock, log, "B", lambda item: 2.0 + 0.12 * (item % 2))]
    rule = StoppingRule(min_items=6, precision=precision)
    timings = _measure(benchmark, contenders, 12, [("A", "B")], rule)
    assert len(timings.seconds["A"]) == items
    result = summarize("overhead", "short", "cpu", contenders, timings, ratios=[("A", "B")],
                       skipped={}, workload={})
    assert result.ratios["A/B"]["precision"] == precision
    assert result.ratios["A/B"]["within"] is (precision == 0.05)


def test_each_comparison_stops_on_its_own(benchmark, clock: _Clock) -> None:
    log: list[str] = []
    contenders = [_timed(clock, log, "A", lambda item: 1.0),
                  _timed(clock, log, "B", lambda item: 2.0),
                  # C's ratio swings between 1x and 3x: never within ±5%
                  _timed(clock, log, "C", lambda item: 1.0 + 2.0 * (item % 2))]
    timings = _measure(benchmark, contenders, 10, [("A", "B"), ("A", "C")],
                       StoppingRule(min_items=6, max_items=9))
    assert {name: len(values) for name, values in timings.seconds.items()} == {
        "A": 9, "B": 6, "C": 9}
    assert timings.stop == "all 9 items"
    # after item 5, B is done and A and C keep rotating
    assert log[3 + 18:] == ["A6", "C6", "C7", "A7", "A8", "C8"]
    assert not any(math.isnan(value) for values in timings.seconds.values() for value in values)
    assert benchmark.stats.stats.rounds == 9


def test_the_time_cap_is_the_last_guard(benchmark, clock: _Clock) -> None:
    log: list[str] = []
    contenders = [_timed(clock, log, "A", lambda item: 4.0),
                  _timed(clock, log, "B", lambda item: 6.0 + 6.0 * (item % 2))]
    # Warm-up (item -1) 16 s, item 0 10 s, item 1 16 s. After item 0 the clock reads 26 and the
    # last item predicts 10 more: item 1 runs, ending at 42 (a cap bounds items started, not
    # their length); after it 42 + 16 > 40.
    timings = _measure(benchmark, contenders, 20, [("A", "B")],
                       StoppingRule(min_items=6, time_cap_s=40.0))
    assert timings.time_capped and len(timings.seconds["A"]) == 2
    assert timings.stop == "time cap of 40 s after 2 items; not within ±5%: A/B"
    assert timings.elapsed_s == pytest.approx(42.0)
    assert benchmark.stats.stats.rounds == 2 and not benchmark.has_error


def test_a_lone_contender_stops_once_its_median_time_is_known(benchmark, clock: _Clock) -> None:
    log: list[str] = []
    contenders = [_timed(clock, log, "A", lambda item: 1.0 + 0.001 * item)]
    timings = _measure(benchmark, contenders, 30, [], StoppingRule(min_items=6))
    assert len(timings.seconds["A"]) == 6


@pytest.mark.parametrize(("arguments", "message"), [
    ({"min_items": 0}, "need 1 <= min_items <= max_items, got 0 and None"),
    ({"min_items": 6, "max_items": 3}, "need 1 <= min_items <= max_items, got 6 and 3"),
    ({"min_items": 6, "precision": 0.0},
     "need 0 < precision < 1 and 0.5 <= confidence < 1, got 0.0 and 0.95"),
    ({"min_items": 6, "time_cap_s": 0.0}, "time_cap_s must be > 0 or None, got 0.0"),
])
def test_bad_rules_name_the_values(arguments: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        StoppingRule(**arguments)


def test_measure_needs_work() -> None:
    # Checked before the benchmark fixture is touched, so none is needed here.
    with pytest.raises(ValueError, match=re.escape(
        "need at least one contender and one item, got 0 and 1"
    )):
        measure_interleaved(None, [], [1], [1])
