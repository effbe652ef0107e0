"""How far a runner's outputs move with their batch mates, and the padding that stops it.

A row's outputs should not depend on the rows it happens to run with. In exact arithmetic right
padding changes nothing, but CPU kernels run the sequence axis in blocks, and a block that the
padded length cuts short takes another path that rounds differently. On an AVX-512 BF16 EPYC,
OpenVINO's blocks are 16 positions: the stand-in's bf16 score of a row moved by 0.055 x the score
spread between running alone (padded to a multiple of 8) and in a batch padded to a longer row,
and by nothing at all once every batch was padded to a multiple of 16 (docs/engine.md, "Batch
independence"). The block differs with the CPU, the runtime and the precision, so it is measured
on the machine: `measure_batch_invariance` finds the smallest multiple of PAD_MULTIPLES at which
rows run alone and together agree within BATCH_DEPENDENCE_BOUND x their spread, and the runtime
caches it with its choice (onnxrank.engine.runtime).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from onnxrank.engine.batching import DEFAULT_PAD_MULTIPLE, round_up
from onnxrank.engine.rows import EncodedRow

# A row's outputs may move with their batch mates by at most this share of the outputs' spread
# (issue #34 item 4): `precision="auto"` leaves out a rerank variant that moves more (the runtime
# reads the export's record for run-time int8 scales and this module's measurement for the rest).
BATCH_DEPENDENCE_BOUND = 1e-3
# The padding multiples tried, smallest first: every batch's length is rounded up to the first
# one within the bound (8 costs nothing measurable on CPUs; 32 cost 5% on the stand-in).
PAD_MULTIPLES = (DEFAULT_PAD_MULTIPLE, 16, 32, 64)
# Tokens of item text in the check's rows. Rounded up, these lengths leave the last block of each
# larger multiple part-filled (37 -> 40 of 48, 48 of 64; 85 -> 88 of 96, 96 of 128), so a block
# of 16, 32 or 64 positions shows at the multiple below it; the longest cut leaves shorter pairs
# their own lengths. Whether a row moves depends on its values as well (with static int8 scales a
# rounding difference moves a score only where it flips an int8 step): on the stand-in's
# int8+bf16 file, 4 rows of each length showed the movement on one set of lengths and not on
# another, all 16 probe pairs on both, so every probe pair is checked at each length.
CHECK_TOKENS = (37, 85, 150)
CHECK_ROWS_PER_LENGTH = 16

Feeds = dict[str, np.ndarray]
RunFeeds = Callable[[Feeds], np.ndarray]
# rows, padded length -> runtime inputs (onnxrank.engine.runtime.pad_rows with the model's pad id)
FeedsAt = Callable[[Sequence[EncodedRow], int], Feeds]


@dataclass(frozen=True, slots=True)
class BatchInvariance:
    """What the check measured for one runner on this machine.

    Attributes:
        pad_to_multiple: The padding multiple batches should use: the first of PAD_MULTIPLES
            within the bound, else the one that moved least.
        moved: Per multiple tried (in order), the largest movement of an output between its row
            run alone and in a batch, as a share of the outputs' standard deviation.
    """

    pad_to_multiple: int
    moved: dict[int, float]

    @property
    def within_bound(self) -> bool:
        """True when the chosen multiple keeps the outputs within BATCH_DEPENDENCE_BOUND."""
        return self.moved[self.pad_to_multiple] <= BATCH_DEPENDENCE_BOUND

    def describe(self) -> str:
        """"moved 0.055 x the spread padded to multiples of 8, 0 at 16", for reasons."""
        return "moved " + ", ".join(f"{share:.2g} x the spread padded to multiples of {multiple}"
                                    if index == 0 else f"{share:.2g} at {multiple}"
                                    for index, (multiple, share) in enumerate(self.moved.items()))


def batch_movement(run: RunFeeds, feeds_at: FeedsAt, rows: Sequence[EncodedRow], multiple: int,
                   max_length: int, *, unpadded_tokens: int = 0) -> float:
    """Largest |output difference| between each row run alone, padded to its own length rounded
    up to `multiple`, and all rows run as one batch padded one multiple past the longest (capped
    at `max_length`), as a share of the batch outputs' standard deviation.

    `unpadded_tokens` leading tokens of every row are fed apart (a decoder's shared prefix,
    onnxrank.engine.prefix): the whole rows' padded lengths are chosen as above, and `feeds_at`
    gets them less those tokens, as the engine plans prefix batches
    (batching.plan_batches' `leading_tokens`).

    Raises:
        ValueError: No rows, or a multiple below 1.
    """
    if not rows:
        raise ValueError("the batch check needs rows, got none")
    if multiple < 1:
        raise ValueError(f"the padding multiple must be >= 1, got {multiple}")
    longest = min(round_up(max(len(row.ids) for row in rows), multiple) + multiple, max_length)
    batch = np.asarray(run(feeds_at(rows, longest - unpadded_tokens)), dtype=np.float64)
    together = np.concatenate([_row_outputs(batch[index], row) for index, row in enumerate(rows)])
    alone = np.concatenate([
        _row_outputs(np.asarray(run(feeds_at([row], min(round_up(len(row.ids), multiple),
                                                         max_length) - unpadded_tokens)),
                                dtype=np.float64)[0], row)
        for row in rows])
    largest = float(np.abs(alone - together).max())
    spread = float(together.std())
    if spread == 0.0:
        return 0.0 if largest == 0.0 else float("inf")
    return largest / spread


def _row_outputs(outputs: np.ndarray, row: EncodedRow) -> np.ndarray:
    """One row's outputs, flat: a per-token output ([sequence, dim], late-interaction token
    vectors) cut to the row's own positions, which padding leaves alone."""
    if outputs.ndim == 2:
        outputs = outputs[:len(row.ids)]
    return outputs.reshape(-1)


def measure_batch_invariance(run: RunFeeds, feeds_at: FeedsAt, rows: Sequence[EncodedRow],
                             max_length: int) -> BatchInvariance:
    """Try PAD_MULTIPLES in order until one keeps `rows` within the bound (`batch_movement`).

    Raises:
        ValueError: No rows.
        InferenceError: The runner failed.
    """
    moved: dict[int, float] = {}
    for multiple in PAD_MULTIPLES:
        moved[multiple] = batch_movement(run, feeds_at, rows, multiple, max_length)
        if moved[multiple] <= BATCH_DEPENDENCE_BOUND:
            return BatchInvariance(multiple, moved)
    return BatchInvariance(min(moved, key=moved.__getitem__), moved)
