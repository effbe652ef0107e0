"""Batch planning by padded token cost (pure functions, no model)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True, slots=True)
class Batch:
    """Rows to run together, padded to `padded_length` tokens."""

    rows: NDArray[np.intp]  # indices into the encoded rows
    padded_length: int


def round_up(length: int, multiple: int) -> int:
    """Round `length` up to a multiple of `multiple` (1 means no rounding)."""
    return -(-length // multiple) * multiple


def plan_batches(
    lengths: NDArray[np.integer] | list[int],
    *,
    max_batch_tokens: int,
    max_batch_size: int,
    sort_by_length: bool = True,
    pad_to_multiple: int = 1,
) -> list[Batch]:
    """Cut rows into batches with ``padded_length * n_rows <= max_batch_tokens`` and ``n_rows <= max_batch_size``.

    1. ``sort_by_length=True``: rows are ordered by token length (stable, so ties keep input order)
       and cut greedily, so each batch holds rows of similar length and pads little.
    2. ``sort_by_length=False``: rows keep input order (used for deadlines, which must score
       the retrieval order first) and are cut greedily in that order.

    A row longer than the budget on its own still gets a batch of one; callers keep
    ``max_batch_tokens >= max_length`` so that never happens in the engine.
    """
    if max_batch_tokens < 1 or max_batch_size < 1 or pad_to_multiple < 1:
        raise ValueError(
            "max_batch_tokens, max_batch_size and pad_to_multiple must be >= 1, got "
            f"{max_batch_tokens}, {max_batch_size}, {pad_to_multiple}"
        )
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(lengths, kind="stable") if sort_by_length else np.arange(len(lengths))
    batches: list[Batch] = []
    start = 0
    longest = 0
    for position, row in enumerate(order):
        candidate = max(longest, round_up(int(lengths[row]), pad_to_multiple))
        count = position - start + 1
        if count > 1 and (candidate * count > max_batch_tokens or count > max_batch_size):
            batches.append(Batch(rows=order[start:position], padded_length=longest))
            start, candidate = position, round_up(int(lengths[row]), pad_to_multiple)
        longest = candidate
    if start < len(order):
        batches.append(Batch(rows=order[start:], padded_length=longest))
    return batches
