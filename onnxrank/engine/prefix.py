"""Prefix reuse for decoder rerankers: the tokens a query's rows share run once per query.

Every row of a query starts with the same tokens (the recipe's prefix, the instruction and the
query: onnxrank.engine.prompt tokenizes the pieces apart, so they are the same ids in every row).
A decoder export with a prefix graph (the manifest's ``prefix_graphs``, files named by
onnxrank.engine.variants.VARIANTS' ``prefix_file``;
onnxrank.export.families.decoder.prefix_cache_graph) takes a prefix's keys and values
(``prefix_cache``) and each row's own tokens (document, template tail, suffix) as right-padded
``input_ids`` / ``attention_mask`` [batch, D]; its scores equal the whole-row graph's to float
rounding. Run on the prefix alone with an empty cache, the same graph returns that prefix's
cache (``present_cache``).

`plan_prefix_batches` groups rows by query, finds each group's shared prefix once and plans the
group's batches over the rows' own lengths; `run_plan` (onnxrank.engine.execution) feeds a
batch's prefix ids beside its rows' remainders (`prefix_feeds`), and `PrefixGraph.plan_run`
computes the prefix's cache on the query's first batch and reuses it for the rest of its batches.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from onnxrank.engine.batch_invariance import batch_movement
from onnxrank.engine.batching import Batch
from onnxrank.engine.rows import EncodedRow
from onnxrank.errors import ModelLoadError

if TYPE_CHECKING:
    from onnxrank.engine.backends.base import ModelRunner

# a prefix batch's extra feed: the token ids every row of the batch starts with, [1, prefix]
PREFIX_INPUT = "prefix_ids"
# the prefix graph's input: every layer's keys then values of a prefix, float32
# [2 x layers, kv_heads, prefix, head_dim]; and its second output, the same for row 0's tokens
CACHE_INPUT = "prefix_cache"
CACHE_OUTPUT = "present_cache"
# plan(own lengths of a group's rows, prefix length) -> batches indexing those lengths
PlanGroup = Callable[[list[int], int], list[Batch]]
Feeds = dict[str, np.ndarray]


def shared_prefix_length(rows: Sequence[EncodedRow]) -> int:
    """Tokens every row starts with, leaving each row at least its last token (the one scored)
    and, where the encoder marks the prompt head (EncodedRow.head_length), no more than it.

    The head is fixed by the query, so a row's split between the prefix graph's two inputs does
    not depend on its batch mates: a row alone and in a group run the same prefix. Split at the
    group's longest common prefix instead, a row alone ran all but its last token as prefix, and
    its bf16 score moved by 0.16 x the spread between the two (docs/engine.md, "Prefix reuse").
    """
    shortest = min(len(row.ids) for row in rows) - 1
    marked = [row.head_length for row in rows if row.head_length]
    if marked:
        shortest = min(shortest, *marked)
    if shortest <= 0:
        return 0
    heads = np.stack([row.ids[:shortest] for row in rows])
    differs = (heads != heads[0]).any(axis=0)
    return int(np.argmax(differs)) if differs.any() else shortest


def plan_prefix_batches(rows: Sequence[EncodedRow], groups: Sequence[Hashable],
                        plan: PlanGroup) -> list[Batch]:
    """Batches of rows of one group each (`groups[i]` is row i's query), with the group's shared
    prefix length: groups in order of first appearance, each planned by `plan` over its rows'
    lengths past the prefix, whose first batch computes the prefix (Batch.runs_prefix).

    Args:
        rows: Encoded rows.
        groups: One key per row; rows of one key share their prompt's head.
        plan: Cuts a group's rows (their lengths past the prefix) into batches, given the
            prefix length (which the rows' attention reads).
    """
    members: dict[Hashable, list[int]] = {}
    for index, group in enumerate(groups):
        members.setdefault(group, []).append(index)
    batches = []
    for indices in members.values():
        group_rows = [rows[index] for index in indices]
        prefix = shared_prefix_length(group_rows)
        order = np.asarray(indices, dtype=np.intp)
        for position, batch in enumerate(plan([len(row.ids) - prefix for row in group_rows], prefix)):
            batches.append(Batch(rows=order[batch.rows], padded_length=batch.padded_length,
                                 prefix_length=prefix, runs_prefix=prefix > 0 and position == 0))
    return batches


def prefix_feeds(rows: Sequence[EncodedRow], pad_token_id: int, padded_length: int,
                 prefix_length: int) -> Feeds:
    """A prefix batch's inputs: the first `prefix_length` tokens the rows share, once, as
    ``prefix_ids`` [1, prefix], and each row's tokens past them right-padded to
    `padded_length` (``input_ids``, ``attention_mask``)."""
    input_ids = np.full((len(rows), padded_length), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((len(rows), padded_length), dtype=np.int64)
    for position, row in enumerate(rows):
        size = len(row.ids) - prefix_length
        input_ids[position, :size] = row.ids[prefix_length:]
        attention_mask[position, :size] = 1
    return {PREFIX_INPUT: rows[0].ids[None, :prefix_length], "input_ids": input_ids,
            "attention_mask": attention_mask}


class PrefixGraph:
    """A decoder's prefix graph as the engine runs it: a prefix's keys and values computed from
    the prefix alone (`cache`), then each batch's rows scored against them (`plan_run`).

    The cache comes from the prefix alone, so a row's score depends neither on which batch of its
    query it lands in nor on the queries beside it. It takes 2 x layers x kv_heads x head_dim
    float32 numbers per prefix token: 23 MB for Qwen3-0.6B's shape and 99 tokens.

    Raises:
        ModelLoadError: The graph does not take a prefix cache (a prefix graph exported before
            the cache existed, which took ``prefix_ids``: export the model again).
    """

    def __init__(self, runner: ModelRunner) -> None:
        dims = runner.input_shapes.get(CACHE_INPUT, ())
        if len(dims) != 4 or dims[0] is None or dims[1] is None or dims[3] is None:
            raise ModelLoadError(
                f"{runner.info.model_file} is not a prefix graph onnxrank runs: it declares "
                f"inputs {', '.join(runner.input_names)}, not {CACHE_INPUT} [2 x layers, "
                "kv_heads, prefix, head_dim] (a prefix graph from before the prefix cache); "
                "export the model again")
        self.runner = runner
        self._empty = np.zeros((dims[0], dims[1], 0, dims[3]), dtype=np.float32)

    def cache(self, prefix_ids: np.ndarray) -> np.ndarray:
        """The keys and values of `prefix_ids` [1, P]: the graph on the prefix alone as one row,
        with an empty cache."""
        return self.runner.run({CACHE_INPUT: self._empty, "input_ids": prefix_ids,
                                "attention_mask": np.ones_like(prefix_ids)}, output=CACHE_OUTPUT)

    def plan_run(self) -> Callable[[Feeds], np.ndarray]:
        """run(feeds) for the prefix batches of one plan (`prefix_feeds`), in plan order: a
        query's cache is computed on its first batch and kept while the next batches share its
        prefix. One per plan, so no cache outlives the call that needed it."""
        last: list[tuple[bytes, np.ndarray]] = []

        def run(feeds: Feeds) -> np.ndarray:
            key = feeds[PREFIX_INPUT].tobytes()
            if not last or last[0][0] != key:
                last[:] = [(key, self.cache(feeds[PREFIX_INPUT]))]
            return self.runner.run({**feeds, CACHE_INPUT: last[0][1]})

        return run


def prefix_batch_movement(graph: PrefixGraph, rows: Sequence[EncodedRow], pad_token_id: int,
                          multiple: int, max_length: int) -> float:
    """How far one query's rows move with their batch mates through the prefix graph:
    batch_invariance.batch_movement of the rows past their shared prefix (the cache computed
    once), each alone and all as one batch, as a share of the scores' spread; 0 for rows that
    share no token, which run through the whole-row graph (`run_with_prefix`).

    Raises:
        ValueError: No rows, or a multiple below 1.
    """
    if not rows:
        raise ValueError("the batch check needs rows, got none")
    prefix = shared_prefix_length(rows)
    if prefix == 0:
        return 0.0
    return batch_movement(
        graph.plan_run(), lambda batch, length: prefix_feeds(batch, pad_token_id, length, prefix),
        rows, multiple, max_length, unpadded_tokens=prefix)


def run_with_prefix(prefix_run: Callable[[Feeds], np.ndarray],
                    plain_run: Callable[[Feeds], np.ndarray]) -> Callable[[Feeds], np.ndarray]:
    """One run for a plan of prefix batches: feeds with a prefix go to the prefix graph, the
    others (a group whose rows share no token) to the whole-row graph."""

    def run(feeds: Feeds) -> np.ndarray:
        return prefix_run(feeds) if PREFIX_INPUT in feeds else plain_run(feeds)

    return run
