"""Validation batches: rows longer than BATCH_ROW_TOKENS come fewer at a time (ModernBERT's
8,192 positions once took the export past 8 GB; onnxrank.export.validate)."""

from __future__ import annotations

import numpy as np

from onnxrank.engine.rows import EncodedRow
from onnxrank.export.tasks import RERANK
from onnxrank.export.validate import (
    BATCH_EFFECT_ROWS,
    BATCH_EFFECT_SIZE,
    BATCH_ROW_TOKENS,
    BATCH_SIZE,
    ValidationInputs,
    batch_dependence,
    length_batches,
)

# 20 rows of 100 tokens and 6 of 2,000, interleaved
LENGTHS = [2000 if index % 4 == 3 else 100 for index in range(26)]


def _rows(lengths: list[int]) -> list[EncodedRow]:
    return [EncodedRow(ids=np.full(length, 5, dtype=np.int64),
                       type_ids=np.zeros(length, dtype=np.int64), item_index=index)
            for index, length in enumerate(lengths)]


def test_long_rows_come_fewer_at_a_time_and_short_ones_as_before() -> None:
    plan = length_batches(_rows(LENGTHS), pad_id=0)
    shapes = [(len(batch.rows), batch.padded_length) for batch in plan.batches]
    assert shapes == [(BATCH_SIZE, 100), (4, 100), (4, 2000), (2, 2000)]
    assert sorted(int(row) for batch in plan.batches for row in batch.rows) == list(range(26))


def test_batch_dependence_bounds_its_together_batches_too() -> None:
    shapes: list[tuple[int, ...]] = []

    def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
        shapes.append(feeds["input_ids"].shape)
        return np.zeros((len(feeds["input_ids"]), 1), dtype=np.float32)

    rows = _rows(LENGTHS)
    inputs = ValidationInputs(RERANK, rows, ["q"] * len(rows), ["tuning"] * len(rows), ["short"] * len(rows),
                              [], 0)
    assert batch_dependence(run, inputs) == {"batch_1_vs_64_max_abs_diff": 0.0,
                                             "batch_1_vs_64_rows": len(rows)}
    together = shapes[len(rows):]
    assert together and all(count * length <= BATCH_EFFECT_SIZE * BATCH_ROW_TOKENS
                            for count, length in together)
    assert len(together) > 1  # 26 rows in one batch of 64 would be 26 x 2,000 tokens


def test_batch_dependence_measures_evenly_spaced_rows_up_to_its_limit() -> None:
    seen: list[int] = []

    def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
        lengths = feeds["attention_mask"].sum(axis=1)
        seen.extend(int(length) for length in lengths)
        # the score moves with the batch: the gap between alone and together is the batch size - 1
        return np.full((len(lengths), 1), len(lengths), dtype=np.float32)

    count = 3 * BATCH_EFFECT_ROWS + 5
    rows = _rows([8 + index for index in range(count)])
    inputs = ValidationInputs(RERANK, rows, ["q"] * count, ["tuning"] * count, ["short"] * count, [], 0)
    effect = batch_dependence(run, inputs)
    measured = effect["batch_1_vs_64_rows"]
    assert measured <= BATCH_EFFECT_ROWS
    alone = seen[:measured]
    assert alone == [8 + index for index in range(0, count, 4)]  # every 4th row, first to last
    assert effect["batch_1_vs_64_max_abs_diff"] == BATCH_EFFECT_SIZE - 1
