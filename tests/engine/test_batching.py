"""plan_batches against brute-force oracles on seeded random lengths."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from onnxrank.engine.batching import (
    Batch,
    _cut_optimally,
    plan_batches,
    round_up,
    run_overhead_tokens,
)


def greedy_oracle(lengths: list[int], budget: int, cap: int, multiple: int) -> list[list[int]]:
    """Input order: extend the batch while the padded cost and size stay in bounds."""
    batches: list[list[int]] = []
    for row in range(len(lengths)):
        if batches:
            trial = batches[-1] + [row]
            padded = max(round_up(lengths[i], multiple) for i in trial)
            if padded * len(trial) <= budget and len(trial) <= cap:
                batches[-1] = trial
                continue
        batches.append([row])
    return batches


def cheapest_cost(lengths: list[int], budget: int, cap: int, multiple: int, overhead: int) -> int:
    """Sorted rows: the minimum of padded tokens + overhead per batch over every feasible cut."""
    padded = sorted(round_up(length, multiple) for length in lengths)
    best = None
    for cuts in itertools.product([False, True], repeat=max(0, len(padded) - 1)):
        bounds = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [len(padded)]
        cost = 0
        for start, end in zip(bounds, bounds[1:]):
            size = end - start
            if size > 1 and (padded[end - 1] * size > budget or size > cap):
                break
            cost += padded[end - 1] * size + overhead
        else:
            best = cost if best is None else min(best, cost)
    assert best is not None
    return best


def check_batches(batches, lengths, budget, cap, multiple) -> None:  # type: ignore[no-untyped-def]
    seen = sorted(row for batch in batches for row in batch.rows.tolist())
    assert seen == list(range(len(lengths)))
    for batch in batches:
        longest = max(lengths[row] for row in batch.rows)
        assert batch.padded_length == round_up(longest, multiple)
        assert len(batch.rows) <= cap
        assert len(batch.rows) == 1 or batch.padded_length * len(batch.rows) <= budget


@pytest.mark.parametrize("seed", range(30))
def test_sorted_plan_is_optimal(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 513, size=int(rng.integers(1, 12))).tolist()
    budget = int(rng.choice([512, 1024, 2048, 100_000]))
    cap = int(rng.choice([1, 3, 7, 64]))
    multiple = int(rng.choice([1, 8, 16]))
    overhead = int(rng.choice([0, 64, 256, 4096]))
    batches = plan_batches(lengths, max_batch_tokens=budget, max_batch_size=cap,
                           pad_to_multiple=multiple, batch_overhead_tokens=overhead)
    check_batches(batches, lengths, budget, cap, multiple)
    cost = sum(batch.padded_length * len(batch.rows) + overhead for batch in batches)
    assert cost == cheapest_cost(lengths, budget, cap, multiple, overhead)
    rows = [row for batch in batches for row in batch.rows.tolist()]
    assert rows == sorted(range(len(lengths)), key=lambda row: (lengths[row], row))


@pytest.mark.parametrize("seed", range(20))
def test_free_runs_plan_the_same_batches_as_the_dynamic_programme(seed: int) -> None:
    # With no per-run charge (CPU) the planner groups equal padded lengths without the dynamic
    # programme's loop: the very same batches, so scores cannot depend on which path ran.
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 513, size=int(rng.integers(1, 300))).tolist()
    budget = int(rng.choice([512, 2048, 8192, 100_000]))
    cap = int(rng.choice([1, 3, 7, 64, 1000]))
    multiple = int(rng.choice([1, 8, 16]))
    fast = plan_batches(lengths, max_batch_tokens=budget, max_batch_size=cap,
                        pad_to_multiple=multiple, batch_overhead_tokens=0)
    order = np.argsort(lengths, kind="stable")
    padded = np.array([round_up(length, multiple) for length in lengths], dtype=np.int64)
    slow = _cut_optimally(order, padded[order], budget, cap, 0)
    assert [(batch.rows.tolist(), batch.padded_length) for batch in fast] == \
        [(batch.rows.tolist(), batch.padded_length) for batch in slow]


@pytest.mark.parametrize("seed", range(20))
def test_input_order_plan_matches_greedy_oracle(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 513, size=int(rng.integers(0, 200))).tolist()
    budget = int(rng.choice([512, 2048, 8192, 100_000]))
    cap = int(rng.choice([1, 7, 32, 64, 1000]))
    multiple = int(rng.choice([1, 8, 16]))
    batches = plan_batches(lengths, max_batch_tokens=budget, max_batch_size=cap,
                           sort_by_length=False, pad_to_multiple=multiple)
    assert [batch.rows.tolist() for batch in batches] == greedy_oracle(lengths, budget, cap, multiple)
    check_batches(batches, lengths, budget, cap, multiple)


def test_large_inputs_respect_the_limits() -> None:
    rng = np.random.default_rng(7)
    lengths = rng.integers(20, 513, size=3000).tolist()
    batches = plan_batches(lengths, max_batch_tokens=8192, max_batch_size=64, pad_to_multiple=8)
    check_batches(batches, lengths, 8192, 64, 8)


def test_sorting_cuts_padding_on_mixed_lengths() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 512, size=200)

    def padded_tokens(sort: bool) -> int:
        return sum(batch.padded_length * len(batch.rows) for batch in plan_batches(
            lengths, max_batch_tokens=8192, max_batch_size=64, sort_by_length=sort))

    assert padded_tokens(True) < 0.75 * padded_tokens(False)


def test_empty_and_bad_settings() -> None:
    assert plan_batches([], max_batch_tokens=512, max_batch_size=8) == []
    with pytest.raises(ValueError, match=re.escape(
        "max_batch_tokens, max_batch_size and pad_to_multiple must be >= 1, got 0, 8, 1"
    )):
        plan_batches([3], max_batch_tokens=0, max_batch_size=8)
    with pytest.raises(ValueError, match=re.escape("leading_tokens must be >= 0, got -1")):
        plan_batches([3], max_batch_tokens=512, max_batch_size=8, leading_tokens=-1)


def test_cpu_plans_by_its_runtimes_charge_and_cuda_by_run_count() -> None:
    lengths = [64] * 10 + [72] * 10  # input order already sorted; both fit one 8192-token batch

    def plan(device: str, cpu_charge: int) -> list[tuple[int, int]]:
        return [(len(batch.rows), batch.padded_length) for batch in plan_batches(
            lengths, max_batch_tokens=8192, max_batch_size=64,
            batch_overhead_tokens=run_overhead_tokens(device, 8192, cpu_charge))]

    # no charge (onnxruntime): no row is padded; a run that costs 128 tokens (OpenVINO) is worth
    # the 80 padding tokens of one run, as is CUDA's whatever the CPU charge
    assert plan("cpu", 0) == [(10, 64), (10, 72)]
    assert plan("cpu", 128) == [(20, 72)]
    assert plan("cpu", 64) == [(10, 64), (10, 72)]
    assert plan("cuda", 0) == [(20, 72)]


def test_a_batch_runs_its_padded_rows_and_its_prefix_where_it_computes_it() -> None:
    assert Batch(rows=np.arange(5), padded_length=24).tokens == 5 * 24
    assert Batch(rows=np.arange(3), padded_length=16, prefix_length=40,
                 runs_prefix=True).tokens == 3 * 16 + 40
    # a later batch of the query reads the prefix's cache: it runs only its rows
    assert Batch(rows=np.arange(3), padded_length=16, prefix_length=40).tokens == 3 * 16


@pytest.mark.parametrize("seed", range(10))
def test_rows_after_leading_tokens_pad_the_whole_length_to_the_multiple(seed: int) -> None:
    """A decoder's prefix batch: the cached prefix (leading tokens) plus each batch's padded
    length is a multiple, the same layout a whole row gets, and the plan is otherwise the
    whole rows' (same cuts, shifted by the prefix)."""
    rng = np.random.default_rng(seed)
    prefix = int(rng.integers(1, 120))
    lengths = rng.integers(1, 300, size=40).tolist()
    settings = {"max_batch_tokens": 4096, "max_batch_size": 16, "pad_to_multiple": 16,
                "batch_overhead_tokens": 64}
    batches = plan_batches(lengths, leading_tokens=prefix, **settings)
    assert sorted(row for batch in batches for row in batch.rows.tolist()) == list(range(40))
    for batch in batches:
        longest = max(lengths[row] for row in batch.rows)
        assert (prefix + batch.padded_length) % 16 == 0
        assert longest <= batch.padded_length < longest + 16
    # unchanged without leading tokens: padded to the multiple on the rows' own lengths
    assert [b.padded_length % 16 for b in plan_batches(lengths, **settings)] == \
        [0] * len(plan_batches(lengths, **settings))
