"""The one execution loop: planned batches of rows are padded, run, checked and handed back.

Every path that runs rows goes through `run_plan` (the reranker, the embedder, export
validation): it pads each batch with `pad_rows` (a batch with a shared prefix feeds it once, as
``prefix_ids``, which the prefix graph's run turns into its cache: onnxrank.engine.prefix), runs
it, refuses non-finite outputs with one InferenceError, and yields each batch's outputs so that
the caller scatters them to input order (`run_in_order` does that for one row per input; the
reranker keeps each pair's best window).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from onnxrank.engine.batching import Batch
from onnxrank.engine.prefix import prefix_feeds
from onnxrank.engine.rows import EncodedRow
from onnxrank.engine.runtime import pad_rows
from onnxrank.errors import InferenceError

Feeds = dict[str, np.ndarray]
RunFeeds = Callable[[Feeds], np.ndarray]


@dataclass(frozen=True, slots=True)
class RowPlan:
    """Encoded rows and the batches they run in (Batch.rows index `rows`)."""

    rows: Sequence[EncodedRow]
    batches: list[Batch]
    pad_token_id: int


@dataclass(frozen=True, slots=True)
class FiniteCheck:
    """How a non-finite output is reported: the model file, what an output is ("score") and
    what an input item is ("pair")."""

    model_file: str
    output: str
    item: str

    def check(self, outputs: NDArray[np.float32], rows: Sequence[EncodedRow],
              batch: Batch) -> None:
        """Raise InferenceError naming the first batch row whose outputs are not all finite."""
        finite = np.isfinite(outputs)
        if finite.all():
            return
        bad = int(np.flatnonzero(~finite.reshape(len(outputs), -1).all(axis=1))[0])
        value = outputs[bad][~finite[bad]].flat[0]
        raise InferenceError(
            f"{self.model_file} produced a non-finite {self.output} ({value}) for input "
            f"{self.item} {rows[batch.rows[bad]].item_index}; the model or its inputs are broken"
        )


def batch_feeds(plan: RowPlan, batch: Batch) -> Feeds:
    """One batch's runtime inputs: its rows right-padded (past a shared prefix, which is fed
    once as ``prefix_ids`` [1, prefix])."""
    rows = [plan.rows[index] for index in batch.rows]
    if batch.prefix_length:
        return prefix_feeds(rows, plan.pad_token_id, batch.padded_length, batch.prefix_length)
    return pad_rows(rows, plan.pad_token_id, batch.padded_length)


def run_plan(plan: RowPlan, run: RunFeeds, *, finite: FiniteCheck | None,
             stop_before: Callable[[Batch], bool] | None = None,
             ) -> Iterator[tuple[Batch, NDArray[np.float32]]]:
    """Run the plan's batches in order, yielding each batch with its float32 outputs (one
    leading row per batch row, in the batch's row order).

    Args:
        plan: Rows and batches.
        run: The runner's run (feeds -> outputs).
        finite: Raise on non-finite outputs as this says; None hands them back as they are
            (export validation measures them).
        stop_before: Asked before each batch; True ends the run there (deadlines).

    Raises:
        InferenceError: Non-finite outputs (with `finite`), or the runner failed.
    """
    for batch in plan.batches:
        if stop_before is not None and stop_before(batch):
            return
        outputs = np.asarray(run(batch_feeds(plan, batch)), dtype=np.float32)
        if finite is not None:
            finite.check(outputs, plan.rows, batch)
        yield batch, outputs


def run_in_order(plan: RowPlan, run: RunFeeds, *, finite: FiniteCheck | None,
                 on_batch: Callable[[Batch], None] | None = None) -> NDArray[np.float32]:
    """Every row's outputs in row order: float32 [len(plan.rows), ...].

    Args:
        plan: Rows and batches; every row must be in one batch.
        run: The runner's run.
        finite: As for run_plan.
        on_batch: Called after each batch (progress bars).

    Raises:
        ValueError: The plan has no batches.
        InferenceError: As for run_plan.
    """
    outputs: NDArray[np.float32] | None = None
    for batch, result in run_plan(plan, run, finite=finite):
        if outputs is None:
            outputs = np.zeros((len(plan.rows), *result.shape[1:]), dtype=np.float32)
        outputs[batch.rows] = result
        if on_batch is not None:
            on_batch(batch)
    if outputs is None:
        raise ValueError("no rows to run: the plan has no batches")
    return outputs
