"""Prefix planning (onnxrank.engine.prefix): the shared prefix of a query's rows and the batches
of one query each, planned over the rows' own tokens."""

from __future__ import annotations

import numpy as np

from onnxrank.engine.batching import Batch, plan_batches
from onnxrank.engine.execution import RowPlan, batch_feeds
from onnxrank.engine.prefix import PREFIX_INPUT, plan_prefix_batches, shared_prefix_length
from onnxrank.engine.rows import EncodedRow


def _row(ids: list[int], index: int = 0) -> EncodedRow:
    array = np.asarray(ids, dtype=np.int64)
    return EncodedRow(ids=array, type_ids=np.zeros_like(array), item_index=index)


def test_the_shared_prefix_leaves_every_row_its_last_token() -> None:
    assert shared_prefix_length([_row([1, 2, 3, 4]), _row([1, 2, 5]), _row([1, 2, 3])]) == 2
    assert shared_prefix_length([_row([1, 2, 3]), _row([1, 2, 3])]) == 2
    assert shared_prefix_length([_row([1, 2, 3])]) == 2
    assert shared_prefix_length([_row([7, 2, 3]), _row([1, 2, 3])]) == 0
    assert shared_prefix_length([_row([1]), _row([1, 2])]) == 0


def test_a_marked_prompt_head_fixes_the_prefix_whatever_the_batch_mates() -> None:
    def row(ids: list[int]) -> EncodedRow:
        array = np.asarray(ids, dtype=np.int64)
        return EncodedRow(ids=array, type_ids=np.zeros_like(array), item_index=0, head_length=2)

    # rows of one query share their head [1, 2]; documents starting alike do not lengthen it
    alone = shared_prefix_length([row([1, 2, 7, 8, 9])])
    together = shared_prefix_length([row([1, 2, 7, 8, 9]), row([1, 2, 7, 5])])
    assert alone == together == 2
    assert shared_prefix_length([row([1, 2])]) == 1  # still leaves the scored token


def test_batches_hold_one_group_each_and_feed_its_prefix_once() -> None:
    rows = [_row([9, 9, 1, 5, 5]), _row([8, 8, 8, 2]), _row([9, 9, 1, 6]), _row([8, 8, 8, 3, 3])]
    seen: list[tuple[list[int], int]] = []

    def plan(lengths: list[int], prefix: int) -> list[Batch]:
        seen.append((lengths, prefix))
        return plan_batches(lengths, max_batch_tokens=100, max_batch_size=8, pad_to_multiple=2)

    batches = plan_prefix_batches(rows, ["a", "b", "a", "b"], plan)
    assert seen == [([2, 1], 3), ([1, 2], 3)]  # groups in order of first appearance
    assert [(batch.rows.tolist(), batch.prefix_length) for batch in batches] == [
        ([2, 0], 3), ([1, 3], 3)]
    # each group's first batch computes its prefix: counted in its tokens, once per group
    assert [batch.runs_prefix for batch in batches] == [True, True]
    assert [batch.tokens for batch in batches] == [2 * 2 + 3, 2 * 2 + 3]
    feeds = batch_feeds(RowPlan(rows, batches, pad_token_id=0), batches[1])
    assert feeds[PREFIX_INPUT].tolist() == [[8, 8, 8]]
    assert feeds["input_ids"].tolist() == [[2, 0], [3, 3]]
    assert feeds["attention_mask"].tolist() == [[1, 0], [1, 1]]


def test_only_a_groups_first_batch_computes_its_prefix() -> None:
    rows = [_row([4, 4, 1]), _row([4, 4, 2, 2]), _row([4, 4, 3]), _row([5, 6])]

    def plan(lengths: list[int], prefix: int) -> list[Batch]:
        return plan_batches(lengths, max_batch_tokens=100, max_batch_size=1)

    batches = plan_prefix_batches(rows, ["a", "a", "a", "b"], plan)
    assert [batch.runs_prefix for batch in batches] == [True, False, False, True]
    # the prefix (2 tokens) once, then each row's own tokens
    assert sum(batch.tokens for batch in batches[:3]) == 2 + 1 + 2 + 1
    # "b" alone shares its prompt head of 1 token with itself
    assert batches[3].prefix_length == 1 and batches[3].tokens == 1 + 1
