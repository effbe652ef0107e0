"""plan_batches against a brute-force oracle on seeded random lengths."""

from __future__ import annotations

import re

import numpy as np
import pytest

from onnxrank.engine.batching import plan_batches, round_up


def oracle(lengths: list[int], budget: int, cap: int, sort: bool, multiple: int) -> list[list[int]]:
    """Greedy reference: extend the batch while the padded cost and size stay in bounds."""
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i)) if sort else list(range(len(lengths)))
    batches: list[list[int]] = []
    for row in order:
        if batches:
            trial = batches[-1] + [row]
            padded = max(round_up(lengths[i], multiple) for i in trial)
            if padded * len(trial) <= budget and len(trial) <= cap:
                batches[-1] = trial
                continue
        batches.append([row])
    return batches


@pytest.mark.parametrize("seed", range(25))
def test_plan_matches_oracle(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 513, size=int(rng.integers(0, 200))).tolist()
    budget = int(rng.choice([512, 2048, 8192, 100_000]))
    cap = int(rng.choice([1, 7, 32, 64, 1000]))
    sort = bool(seed % 2)
    multiple = int(rng.choice([1, 8, 16]))
    batches = plan_batches(lengths, max_batch_tokens=budget, max_batch_size=cap,
                           sort_by_length=sort, pad_to_multiple=multiple)
    assert [batch.rows.tolist() for batch in batches] == oracle(lengths, budget, cap, sort, multiple)
    seen = sorted(row for batch in batches for row in batch.rows.tolist())
    assert seen == list(range(len(lengths)))
    for batch in batches:
        longest = max(lengths[row] for row in batch.rows)
        assert batch.padded_length == round_up(longest, multiple)
        assert len(batch.rows) <= cap
        assert len(batch.rows) == 1 or batch.padded_length * len(batch.rows) <= budget


def test_sorting_cuts_padding_on_mixed_lengths() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(20, 512, size=200)

    def padded_tokens(sort: bool) -> int:
        return sum(batch.padded_length * len(batch.rows) for batch in plan_batches(
            lengths, max_batch_tokens=8192, max_batch_size=64, sort_by_length=sort))

    assert padded_tokens(True) < 0.75 * padded_tokens(False)


def test_bad_settings() -> None:
    with pytest.raises(ValueError, match=re.escape(
        "max_batch_tokens, max_batch_size and pad_to_multiple must be >= 1, got 0, 8, 1"
    )):
        plan_batches([3], max_batch_tokens=0, max_batch_size=8)
