"""The Reranker: wires tokenization, batch planning, the runtime and ranking together."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray
from tokenizers import Tokenizer

from onnxrank.engine.backends.base import ModelRunner
from onnxrank.engine.batching import Batch, plan_engine_batches
from onnxrank.engine.cache import ScoreCache
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.deadline import DeadlineGate
from onnxrank.engine.execution import Feeds, RowPlan, batch_feeds, run_plan
from onnxrank.engine.inputs import check_documents, check_pairs, check_query, check_rank_options
from onnxrank.engine.model import EngineModel
from onnxrank.engine.prefix import plan_prefix_batches, run_with_prefix
from onnxrank.engine.prompt import PromptEncoder
from onnxrank.engine.ranking import RankedDocument, activate, fallback_ranking, rank
from onnxrank.engine.recipe import PromptRecipe
from onnxrank.engine.rows import EncodedRow, RowBudget, RowEncoder
from onnxrank.engine.runtime import LoadedModel, open_prefix_graph, probe_pairs
from onnxrank.engine.spec import ModelKind, ModelSpec
from onnxrank.engine.tokenize import PairEncoder
from onnxrank.errors import InferenceError, ModelLoadError
from onnxrank.types import Pair, Scores

logger = logging.getLogger(__name__)

OnError = Literal["raise", "fallback"]
Span = tuple[int, int] | None


@dataclass(slots=True)
class ScoreRun:
    """Scores of a list of pairs and what producing them took.

    Attributes:
        scores: Raw logits, in input order (the same values `Reranker.score` returns).
        token_counts: Tokens per pair (all windows of a pair in max_chunk mode; 0 for a cache hit
            or a pair repeated earlier in the call, which the model did not see again).
        tokenize_ms: Time spent tokenizing.
        inference_ms: Time spent in model runs (padding included).
        batches: (rows, padded length) of every model run, in run order (for a decoder's
            prefix batches, the length past the query's shared prefix, which runs once).
        spans: Best-window character span per pair (max_chunk mode), else None.
    """

    scores: Scores
    token_counts: NDArray[np.int64]
    tokenize_ms: float = 0.0
    inference_ms: float = 0.0
    batches: list[tuple[int, int]] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)

    def copy_repeats(self, repeats: dict[int, int]) -> None:
        """Give each repeated pair (index -> its first occurrence) the first one's score and span."""
        for index, first in repeats.items():
            self.scores[index], self.spans[index] = self.scores[first], self.spans[first]


def first_occurrences(pairs: Sequence[Pair], indices: Iterable[int]) -> tuple[list[int], dict[int, int]]:
    """The `indices` whose pair has not occurred before among them, in order, and every other
    index mapped to the first index of its pair."""
    first: dict[Pair, int] = {}
    repeats = {}
    for index in indices:
        seen = first.setdefault(pairs[index], index)
        if seen != index:
            repeats[index] = seen
    return list(first.values()), repeats


class Reranker(EngineModel[Pair]):
    """Scores (query, document) pairs with an exported cross-encoder (or, as DecoderReranker, a
    decoder reranker: the same engine with prompt rows).

    Load one with ``Reranker.from_dir(path, config=None, **overrides)`` or
    ``Reranker.from_pretrained(name)`` (onnxrank.engine.model.EngineModel): ModelLoadError for a
    model that is not a reranker, and ValueError for a max_length above the manifest's, a
    max_batch_tokens below max_length, or an instruction for a cross-encoder.

    Example:
        >>> reranker = Reranker.from_dir("models/minilm-standin", device="cpu")  # doctest: +SKIP
        >>> ranked = reranker.rerank("what is a wing flutter", ["doc one", "doc two"], top_k=1)
        >>> ranked[0].index  # doctest: +SKIP
        1
    """

    kind = ModelKind.CROSS_ENCODER
    needs = "a cross-encoder exported with --task rerank"
    output_noun = "score"
    item_noun = "pair"

    def __init__(self, spec: ModelSpec, model_dir: Path, runner: ModelRunner,
                 encoder: RowEncoder[Pair], tokenizer: Tokenizer, config: EngineConfig) -> None:
        super().__init__(spec, model_dir, runner, encoder, tokenizer, config)
        self._cache = ScoreCache(config.cache_size, self._cache_model_key()) \
            if config.cache_size else None

    @classmethod
    def _checked(cls, loaded: LoadedModel, config: EngineConfig) -> Reranker:
        spec, model_dir = loaded.spec, loaded.model_dir
        if spec.num_labels != 1:
            raise ModelLoadError(
                f"{model_dir} has num_labels={spec.num_labels}; Reranker needs one relevance logit"
            )
        if not spec.relevance_trained:
            logger.warning(
                "%s is not relevance-trained (manifest relevance_trained=false): its scores are "
                "not relevance scores; use it for speed measurements only", model_dir,
            )
        max_length = config.max_length or spec.max_length
        if max_length > spec.max_length:
            raise ValueError(
                f"max_length={max_length} exceeds the model's max_length={spec.max_length} "
                f"({model_dir / 'manifest.json'})"
            )
        if config.max_batch_tokens < max_length:
            raise ValueError(
                f"max_batch_tokens={config.max_batch_tokens} must be >= max_length={max_length} "
                "so that one full-length row fits in a batch"
            )
        config = replace(config, max_length=max_length)
        encoder = cls.row_encoder(loaded.tokenizer, max_length, spec.recipe)
        encoder.instruction_for(config.instruction)  # a cross-encoder refuses one at load
        return cls(spec, model_dir, loaded.runner, encoder, loaded.tokenizer, config)

    @classmethod
    def row_encoder(cls, tokenizer: Tokenizer, max_length: int,
                    recipe: PromptRecipe | None) -> RowEncoder[Pair]:
        """Pair rows from the tokenizer's own pair template."""
        return PairEncoder(tokenizer, max_length)

    @classmethod
    def probe_items(cls) -> list[Pair]:
        return probe_pairs()

    @property
    def uses_prefix_graph(self) -> bool:
        """Whether a query's shared prompt head runs once per query (decoder rerankers only;
        see DecoderReranker)."""
        return False

    def activate(self, logits: NDArray[np.floating]) -> NDArray[np.float64]:
        """The manifest's activation applied to raw logits (what `rerank` reports as score)."""
        return activate(logits, self.spec.activation)

    def score(self, pairs: Sequence[Pair], *, instruction: str | None = None) -> Scores:
        """Raw logits for (query, document) pairs, in input order.

        Args:
            pairs: (query, document) pairs.
            instruction: Decoder rerankers: the task instruction of the prompt; None = the
                `instruction` setting, else the recipe's default. Cross-encoders take none.

        Raises:
            TypeError: `pairs` is not a sequence of (str, str).
            ValueError: An empty query, or an instruction for a cross-encoder.
            InferenceError: The runtime failed or returned NaN/inf.
        """
        return self.score_detailed(pairs, instruction=instruction).scores

    def score_detailed(self, pairs: Sequence[Pair], *, instruction: str | None = None) -> ScoreRun:
        """`score`, plus token counts, stage times and the batches that ran (for servers).

        Raises:
            As for score.
        """
        return self._score_pairs(check_pairs(pairs), self._instruction(instruction))

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_k: int | None = None,
        activation: str | None = None,
        deadline_ms: float | None = None,
        on_error: OnError = "raise",
        instruction: str | None = None,
    ) -> list[RankedDocument]:
        """Rank documents for a query, best first (ties keep input order).

        Args:
            query: Non-empty query text.
            documents: Candidate texts; empty strings are scored like any other.
            top_k: Keep only the best k; None keeps all.
            activation: None applies the model's own activation (the manifest's, sigmoid for
                cross-encoders); "sigmoid" maps logits to (0, 1); "none" keeps raw logits.
            deadline_ms: Score in input (retrieval) order, batch by batch, until this budget is
                spent; unscored documents follow in input order with ``reranked=False``. Overshoots
                by at most one batch.
            on_error: "fallback" logs an inference error and returns the retrieval order with
                ``reranked=False`` instead of raising.
            instruction: Decoder rerankers: the task instruction (as for score).

        Returns:
            RankedDocument list, best first.

        Raises:
            ValueError: Empty query or bad option.
            TypeError: Documents not a list of str (names the bad element's index and type).
            InferenceError: Inference failed (only with on_error="raise").
        """
        check_query(query)
        documents = check_documents(documents)
        check_rank_options(top_k, activation, deadline_ms, on_error)
        instruction = self._instruction(instruction)
        if not documents:
            return []
        pairs = [(query, document) for document in documents]
        try:
            if deadline_ms is None:
                run = self._score_pairs(pairs, instruction)
                scored = np.ones(len(pairs), dtype=bool)
            else:
                run, scored = self._score_until(pairs, deadline_ms, instruction)
        except InferenceError:
            if on_error == "raise":
                raise
            logger.exception("reranking failed; returning %d documents in retrieval order",
                             len(documents))
            return fallback_ranking(documents, top_k=top_k)
        scores = activate(run.scores, activation or self.spec.activation)
        return rank(documents, scores, run.spans, scored, top_k=top_k)

    def rerank_many(
        self,
        requests: Sequence[tuple[str, Sequence[str]]],
        *,
        top_k: int | None = None,
        activation: str | None = None,
        instruction: str | None = None,
    ) -> list[list[RankedDocument]]:
        """Rerank several (query, documents) requests in one pass; their pairs share batches.

        Returns:
            One ranked list per request, in request order.

        Raises:
            ValueError, TypeError, InferenceError: As for rerank.
        """
        check_rank_options(top_k, activation, None, "raise")
        instruction = self._instruction(instruction)
        checked = [(check_query(query), check_documents(documents))
                   for query, documents in requests]
        pairs = [(query, document) for query, documents in checked for document in documents]
        run = self._score_pairs(pairs, instruction)
        scores = activate(run.scores, activation or self.spec.activation)
        results, start = [], 0
        for _, documents in checked:
            stop = start + len(documents)
            results.append(
                rank(documents, scores[start:stop], run.spans[start:stop],
                     np.ones(len(documents), dtype=bool), top_k=top_k)
                if documents else []
            )
            start = stop
        return results

    # --- stages -------------------------------------------------------------------------------

    def check_instruction(self, instruction: str | None) -> None:
        """Raise, before any work, what a call with `instruction` would raise for it.

        Raises:
            TypeError: Not a str or None.
            ValueError: A cross-encoder given one; a blank one; or, for a decoder reranker, one
                that leaves the prompt no room for the query and the document.
        """
        self.row_budget(instruction)

    def row_budget(self, instruction: str | None = None) -> RowBudget:
        """How a model row is shared between the fixed tokens (special tokens; a decoder
        reranker's prompt with `instruction`, else the call default), the query (capped) and the
        document: what a caller counts to know the tokens a pair will cost before scoring it.

        Raises:
            TypeError, ValueError: As for `check_instruction`.
        """
        return self._encoder.row_budget(self._instruction(instruction))

    def row_lengths(self, pairs: Sequence[Pair], instruction: str | None = None) -> list[int]:
        """The tokens of each row `score(pairs, instruction=...)` runs (each at most max_length;
        with long_documents="max_chunk", a long document's windows are one row each).

        Raises:
            TypeError, ValueError: As for `score`.
        """
        return [len(row.ids) for row in self._encode(check_pairs(pairs),
                                                     self._instruction(instruction))]

    def _instruction(self, instruction: str | None) -> str | None:
        """The instruction a call runs with: its own, else the setting, else the recipe's default
        (None for cross-encoders, which refuse one)."""
        return self._encoder.instruction_for(
            instruction if instruction is not None else self.config.instruction)

    def _encode(self, pairs: Sequence[Pair], instruction: str | None) -> list[EncodedRow]:
        if self.config.long_documents == "max_chunk":
            return self._encoder.encode_windows(
                pairs, window_tokens=self.config.window_tokens,
                overlap_tokens=self.config.window_overlap_tokens, instruction=instruction,
            )
        return self._encoder.encode(pairs, instruction=instruction)

    def _score_pairs(self, pairs: Sequence[Pair], instruction: str | None) -> ScoreRun:
        """Scores, spans and stage times for all pairs, using the cache when enabled; a pair
        repeated in the call runs once."""
        run = ScoreRun(scores=np.full(len(pairs), -np.inf, dtype=np.float32),
                       token_counts=np.zeros(len(pairs), dtype=np.int64),
                       spans=[None] * len(pairs))
        todo = list(range(len(pairs)))
        keys: list[str] = []
        if self._cache is not None:
            keys = [self._cache.key(query, document, instruction) for query, document in pairs]
            todo = []
            for index, key in enumerate(keys):
                hit = self._cache.get(key)
                if hit is None:
                    todo.append(index)
                else:
                    run.scores[index], run.spans[index] = hit
        if not todo:
            return run
        todo, repeats = first_occurrences(pairs, todo)
        started = time.perf_counter()
        todo_pairs = [pairs[index] for index in todo]
        rows = self._encode(todo_pairs, instruction)
        run.tokenize_ms = (time.perf_counter() - started) * 1000
        for row in rows:
            run.token_counts[todo[row.item_index]] += len(row.ids)
        started = time.perf_counter()
        plan = self._pair_plan(rows, todo_pairs, sort_by_length=self.config.sort_by_length)
        for batch, outputs in run_plan(plan, self._run, finite=self._finite):
            self._merge(rows, batch, outputs, todo, run)
        run.inference_ms = (time.perf_counter() - started) * 1000
        run.copy_repeats(repeats)
        if self._cache is not None:
            for index in todo:
                self._cache.put(keys[index], (float(run.scores[index]), run.spans[index]))
        return run

    def _score_until(self, pairs: Sequence[Pair], deadline_ms: float,
                     instruction: str | None) -> tuple[ScoreRun, np.ndarray]:
        """Score in input order until the deadline (a repeated pair runs once); also returns
        which pairs got every row scored."""
        gate = DeadlineGate.after(deadline_ms)
        run = ScoreRun(scores=np.full(len(pairs), -np.inf, dtype=np.float32),
                       token_counts=np.zeros(len(pairs), dtype=np.int64),
                       spans=[None] * len(pairs))
        distinct, repeats = first_occurrences(pairs, range(len(pairs)))
        distinct_pairs = [pairs[index] for index in distinct]
        rows = self._encode(distinct_pairs, instruction)
        rows_done = np.zeros(len(pairs), dtype=np.int64)
        rows_total = np.zeros(len(pairs), dtype=np.int64)
        for row in rows:
            rows_total[distinct[row.item_index]] += 1
        for batch, outputs in run_plan(self._pair_plan(rows, distinct_pairs, sort_by_length=False),
                                       self._run, finite=self._finite,
                                       stop_before=gate.stop_before):
            gate.ran(batch)
            self._merge(rows, batch, outputs, distinct, run)
            for row_index in batch.rows:
                rows_done[distinct[rows[row_index].item_index]] += 1
        run.copy_repeats(repeats)
        scored = rows_done == rows_total
        for index, first in repeats.items():
            scored[index] = scored[first]
        return run, scored

    def _pair_plan(self, rows: Sequence[EncodedRow], pairs: Sequence[Pair], *,
                   sort_by_length: bool) -> RowPlan:
        """The batches of `rows` (row.item_index indexes `pairs`)."""
        return self._plan(rows, sort_by_length=sort_by_length)

    @property
    def _run(self) -> Callable[[Feeds], np.ndarray]:
        """What runs one planned batch: the model's runner (taken per score call, not kept)."""
        return self._runner.run

    @staticmethod
    def _merge(rows: list[EncodedRow], batch: Batch, outputs: np.ndarray, targets: list[int],
               run: ScoreRun) -> None:
        """Scatter a batch's logits back to pair order, keeping each pair's best window."""
        run.batches.append((len(batch.rows), batch.padded_length))
        for row_index, logit in zip(batch.rows, outputs.reshape(len(batch.rows), -1)[:, 0]):
            row = rows[row_index]
            target = targets[row.item_index]
            if logit > run.scores[target]:
                run.scores[target] = logit
                run.spans[target] = row.span

    def _cache_model_key(self) -> str:
        settings = (
            self.spec.manifest_hash(), self.device_info.backend, self.device_info.variant,
            self.device_info.precision, self.config.max_length, self.config.long_documents,
            self.config.window_tokens, self.config.window_overlap_tokens, self.uses_prefix_graph,
        )
        return "|".join(str(setting) for setting in settings)


def planned_batches(reranker: Reranker, pairs: Sequence[Pair]) -> RowPlan:
    """The rows `reranker.score(pairs)` encodes and the batches it cuts them into, in its order
    (each row's ``item_index`` indexes `pairs`; Batch.tokens counts what a batch runs).

    Raises:
        TypeError, ValueError: As for `Reranker.score`.
    """
    checked = check_pairs(pairs)
    rows = reranker._encode(checked, reranker._instruction(None))
    return reranker._pair_plan(rows, checked, sort_by_length=reranker.config.sort_by_length)


def planned_feeds(reranker: Reranker, pairs: Sequence[Pair]) -> list[dict[str, np.ndarray]]:
    """The padded batches `reranker.score(pairs)` runs, in its order, as runtime feeds.

    Raises:
        TypeError, ValueError: As for `Reranker.score`.
    """
    plan = planned_batches(reranker, pairs)
    return [batch_feeds(plan, batch) for batch in plan.batches]


def inference_only(reranker: Reranker, pairs: Sequence[Pair]) -> Callable[[], None]:
    """The padded batches `reranker.score(pairs)` would run, fed straight to its runtime per call.

    Tokenization, batch planning and padding happen once, here; the returned function only runs
    those batches through the runner, as the engine does. The bench's overhead scenario times it
    against `rerank` to measure what the engine adds to the runtime's own time.

    Raises:
        TypeError, ValueError: As for `Reranker.score`.
    """
    feeds = planned_feeds(reranker, pairs)

    def run_batches() -> None:
        run = reranker._run  # one per call, as score's: a query's prefix cache is not carried over
        for feed in feeds:
            run(feed)

    return run_batches


class DecoderReranker(Reranker):
    """A decoder reranker (Qwen3-Reranker and its kind): a Reranker whose pairs become prompt rows
    of the manifest's recipe (onnxrank.engine.prompt); everything else is the Reranker's."""

    kind = ModelKind.DECODER_RERANKER
    needs = "a decoder reranker exported with --recipe"

    def __init__(self, spec: ModelSpec, model_dir: Path, runner: ModelRunner,
                 encoder: RowEncoder[Pair], tokenizer: Tokenizer, config: EngineConfig) -> None:
        self._prefix_graph = open_prefix_graph(
            spec, model_dir, runner, config,
            lambda tokens: self.probe_rows(spec, tokenizer, tokens))
        super().__init__(spec, model_dir, runner, encoder, tokenizer, config)

    @property
    def uses_prefix_graph(self) -> bool:
        """Whether each query's shared prompt head runs once per query: the prefix_reuse
        setting is on and the running variant has a prefix graph that passed its gate."""
        return self._prefix_graph is not None

    @classmethod
    def row_encoder(cls, tokenizer: Tokenizer, max_length: int,
                    recipe: PromptRecipe | None) -> RowEncoder[Pair]:
        """Prompt rows of `recipe`.

        Raises:
            ValueError: No recipe (the manifest of a decoder reranker always records one).
        """
        if recipe is None:
            raise ValueError("a decoder reranker's rows need its prompt recipe, got none")
        return PromptEncoder(tokenizer, max_length, recipe)

    @classmethod
    def probe_rows(cls, spec: ModelSpec, tokenizer: Tokenizer, tokens: int) -> list[EncodedRow]:
        """Probe pairs of about `tokens` tokens, with the recipe's prompt on top."""
        prompt = cls.row_encoder(tokenizer, spec.max_length, spec.recipe).row_budget()
        length = min(spec.max_length, tokens + prompt.fixed_tokens)
        return cls.row_encoder(tokenizer, length, spec.recipe).encode(cls.probe_items())

    def _pair_plan(self, rows: Sequence[EncodedRow], pairs: Sequence[Pair], *,
                   sort_by_length: bool) -> RowPlan:
        """With the prefix graph: batches of one query's rows each, planned over the tokens past
        the query's shared prefix, which runs once per query (the batches' attention still
        reads it: the budget leaves room for it)."""
        if self._prefix_graph is None:
            return self._plan(rows, sort_by_length=sort_by_length)

        def plan(lengths: list[int], prefix: int) -> list[Batch]:
            return plan_engine_batches(lengths, self.config, self._runner,
                                       sort_by_length=sort_by_length, reserved_tokens=prefix)

        batches = plan_prefix_batches(rows, [pairs[row.item_index][0] for row in rows], plan)
        return RowPlan(rows, batches, self.spec.pad_token_id)

    @property
    def _run(self) -> Callable[[Feeds], np.ndarray]:
        """What runs the batches of one plan: with the prefix graph, a batch with a shared prefix
        through it (each query's cache computed once) and any other whole
        (onnxrank.engine.prefix.run_with_prefix)."""
        if self._prefix_graph is None:
            return self._runner.run
        return run_with_prefix(self._prefix_graph.plan_run(), self._runner.run)

