"""Interleaving order and statistics of onnxrank.bench.harness (with the real benchmark fixture)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from onnxrank.bench.harness import (
    Contender,
    interleaved_order,
    measure_interleaved,
    ratio_stats,
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
    assert ratios == {"n": 3, "min": 2.0, "median": 3.0, "max": 5.0}


def test_measure_needs_work() -> None:
    # Checked before the benchmark fixture is touched, so none is needed here.
    with pytest.raises(ValueError, match=re.escape(
        "need at least one contender and one item, got 0 and 1"
    )):
        measure_interleaved(None, [], [1], [1])
