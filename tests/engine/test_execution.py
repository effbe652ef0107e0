"""The one execution loop and the one ranking order, against simple oracles (no model)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from onnxrank.engine.batching import Batch, plan_batches
from onnxrank.engine.execution import FiniteCheck, RowPlan, run_in_order, run_plan
from onnxrank.engine.ranking import rank_order
from onnxrank.engine.rows import EncodedRow
from onnxrank.errors import InferenceError


def _rows(lengths: list[int]) -> list[EncodedRow]:
    return [EncodedRow(np.arange(1, length + 1, dtype=np.int64),
                       np.zeros(length, dtype=np.int64), index)
            for index, length in enumerate(lengths)]


def _row_sums(feeds: dict[str, np.ndarray]) -> np.ndarray:
    """A stand-in model: each row's sum of ids (padding is 0), as a [rows, 1] output."""
    return (feeds["input_ids"] * feeds["attention_mask"]).sum(axis=1, keepdims=True)


@pytest.mark.parametrize("seed", range(5))
def test_outputs_come_back_in_row_order_whatever_the_plan(seed: int) -> None:
    lengths = np.random.default_rng(seed).integers(1, 40, size=37).tolist()
    rows = _rows(lengths)
    expected = np.array([[length * (length + 1) / 2] for length in lengths], dtype=np.float32)
    for batch_size, sort in ((1, False), (5, True), (64, False)):
        batches = plan_batches(lengths, max_batch_tokens=200, max_batch_size=batch_size,
                               sort_by_length=sort, pad_to_multiple=8)
        got = run_in_order(RowPlan(rows, batches, 0), _row_sums, finite=None)
        np.testing.assert_array_equal(got, expected)


def test_a_run_stops_before_the_batch_it_is_told_to() -> None:
    rows = _rows([3, 4, 5, 6])
    batches = [Batch(rows=np.array([index]), padded_length=len(rows[index].ids))
               for index in range(4)]
    seen: list[int] = []

    def stop_before(batch: Batch) -> bool:
        return len(seen) == 2

    for batch, _ in run_plan(RowPlan(rows, batches, 0), _row_sums, finite=None,
                             stop_before=stop_before):
        seen.append(int(batch.rows[0]))
    assert seen == [0, 1]


def test_a_non_finite_output_is_one_clear_error_naming_the_input() -> None:
    rows = _rows([2, 3, 4])

    def broken(feeds: dict[str, np.ndarray]) -> np.ndarray:
        outputs = _row_sums(feeds).astype(np.float32)
        outputs[feeds["attention_mask"].sum(axis=1) == 4] = np.nan
        return outputs

    plan = RowPlan(rows, [Batch(rows=np.array([2, 0, 1]), padded_length=4)], 0)
    with pytest.raises(InferenceError, match=re.escape(
            "model.onnx produced a non-finite score (nan) for input pair 2; the model or its "
            "inputs are broken")):
        run_in_order(plan, broken, finite=FiniteCheck("model.onnx", "score", "pair"))
    # without a check (export validation) the values come back for the metrics to judge
    assert np.isnan(run_in_order(plan, broken, finite=None)[2, 0])


@pytest.mark.parametrize("seed", range(20))
def test_rank_order_is_best_first_with_ties_in_input_order(seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 6, size=int(rng.integers(0, 30))).astype(np.float64)  # many ties
    oracle = sorted(range(len(scores)), key=lambda index: (-scores[index], index))
    for top_k in (None, 1, 3, 10, 100):
        expected = oracle if top_k is None else oracle[:top_k]
        assert rank_order(scores, top_k=top_k).tolist() == expected
