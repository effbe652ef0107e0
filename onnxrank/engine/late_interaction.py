"""The late-interaction (ColBERT) kind: queries and documents become token vectors apart, and a
pair's score is their MaxSim (onnxrank.engine.maxsim).

Rows come from onnxrank.engine.late_rows (the manifest's ``late_interaction`` settings); the
graph returns L2-normalised token vectors [batch, sequence, dim] (transformer, the checkpoint's
Dense projections, normalisation). Documents run through the engine's length-sorted batch plan,
each keeping its own rows only, so a document's vectors and score never depend on its batch or
list mates. It is a Reranker: ``Reranker.from_dir`` on a late-interaction export returns one, and
`score`, `rerank` and `rerank_many` keep their shape (scores are raw MaxSim sums; activation
"none").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from tokenizers import Tokenizer

from onnxrank.engine.backends.base import ModelRunner
from onnxrank.engine.batching import Batch
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.deadline import DeadlineGate
from onnxrank.engine.execution import FiniteCheck, RowPlan, RunFeeds, run_plan
from onnxrank.engine.inputs import check_documents, check_query
from onnxrank.engine.late_rows import LateInteractionEncoder, LateInteractionSettings
from onnxrank.engine.maxsim import maxsim, maxsim_many
from onnxrank.engine.recipe import PromptRecipe
from onnxrank.engine.reranker import Reranker, ScoreRun
from onnxrank.engine.rows import EncodedRow, RowEncoder
from onnxrank.engine.runtime import LoadedModel
from onnxrank.engine.spec import ModelKind, ModelSpec
from onnxrank.errors import ModelLoadError
from onnxrank.types import Pair

Vectors = NDArray[np.float32]
# which positions of a row's outputs count in MaxSim
Keep = Callable[[EncodedRow], NDArray[np.bool_]]


class LateInteractionReranker(Reranker):
    """Ranks with a late-interaction model exported from a PyLate / sentence-transformers
    MultiVectorEncoder or a Stanford ColBERT checkpoint.

    Beyond the Reranker's API: `encode_queries` and `encode_documents` give each text's kept
    token vectors (documents can be encoded once, at index time; `encode_documents_until` under
    a deadline), and `score_vectors` scores a query against stored document vectors without
    running the document side again. A repeated document runs once, and with ``cache_size`` a
    (query, document) pair scored before is read from the score cache, as for cross-encoders.

    Example:
        >>> model = Reranker.from_dir("models/colbert", device="cpu")  # doctest: +SKIP
        >>> model.rerank("wing flutter", ["doc one", "doc two"], top_k=1)[0].index  # doctest: +SKIP
        1
    """

    kind = ModelKind.LATE_INTERACTION
    needs = "a late-interaction model (a ColBERT checkpoint exported with `onnxrank export`)"
    output_noun = "token vector value"

    def __init__(self, spec: ModelSpec, model_dir: Path, runner: ModelRunner,
                 encoder: RowEncoder[Pair], tokenizer: Tokenizer, config: EngineConfig) -> None:
        if not isinstance(encoder, LateInteractionEncoder):
            raise TypeError(f"a late-interaction model needs a LateInteractionEncoder, got "
                            f"{type(encoder).__name__}")
        super().__init__(spec, model_dir, runner, encoder, tokenizer, config)
        self._late = encoder

    @classmethod
    def _checked(cls, loaded: LoadedModel, config: EngineConfig) -> LateInteractionReranker:
        spec, model_dir = loaded.spec, loaded.model_dir
        settings = _settings(spec)
        if config.max_length is not None and config.max_length != settings.document_length:
            raise ValueError(f"max_length={config.max_length} does not apply to late-interaction "
                             f"models: rows are cut at the manifest's document_length "
                             f"({settings.document_length}); leave max_length unset")
        if config.long_documents != "truncate":
            raise ValueError(f"long_documents={config.long_documents!r} does not apply to "
                             "late-interaction models: leave it 'truncate'")
        longest = max(settings.document_length, settings.query_length)
        if config.max_batch_tokens < longest:
            raise ValueError(f"max_batch_tokens={config.max_batch_tokens} must be >= {longest} "
                             "(the longest query or document row) so that one row fits a batch")
        encoder = LateInteractionEncoder(loaded.tokenizer, settings)
        encoder.instruction_for(config.instruction)
        return cls(spec, model_dir, loaded.runner, encoder, loaded.tokenizer,
                   replace(config, max_length=settings.document_length))

    @classmethod
    def row_encoder(cls, tokenizer: Tokenizer, max_length: int,
                    recipe: PromptRecipe | None) -> RowEncoder[Pair]:
        """Not available from these arguments: the rows need the manifest's settings.

        Raises:
            ValueError: Always; use `probe_rows` or the loaded model.
        """
        raise ValueError("late-interaction rows need the manifest's late_interaction settings "
                         "(LateInteractionEncoder), not a max_length and a recipe")

    @classmethod
    def probe_rows(cls, spec: ModelSpec, tokenizer: Tokenizer, tokens: int) -> list[EncodedRow]:
        """The probe's document rows of about `tokens` tokens (documents are what runs most)."""
        settings = _settings(spec)
        encoder = LateInteractionEncoder(tokenizer, replace(
            settings, document_length=max(4, min(tokens, settings.document_length))))
        return encoder.encode(cls.probe_items())

    @property
    def settings(self) -> LateInteractionSettings:
        """The manifest's late-interaction settings."""
        return self._late.settings

    def encode_queries(self, queries: Sequence[str]) -> list[Vectors]:
        """Each query's token vectors [rows, dim], float32: its real rows, and with query
        expansion every expansion row up to query_length.

        Raises:
            TypeError, ValueError: A query is not a non-empty str.
            InferenceError: The runtime failed or returned NaN/inf.
        """
        for query in check_documents(queries):
            check_query(query)
        return self._query_vectors(list(queries))

    def encode_documents(self, documents: Sequence[str]) -> list[Vectors]:
        """Each document's kept token vectors [rows, dim], float32 (skiplisted rows dropped),
        each computed as if it ran alone.

        Raises:
            TypeError: `documents` is not a list of str.
            InferenceError: The runtime failed or returned NaN/inf.
        """
        return self._document_vectors(check_documents(documents))[0]

    def score_vectors(self, query: str, document_vectors: Sequence[Vectors]) -> NDArray[np.float32]:
        """MaxSim of `query` against stored document vectors (from `encode_documents`), in order.

        Raises:
            ValueError: An empty query, or vectors that are not [rows, dim] of this model's dim.
            InferenceError: As for encode_queries.
        """
        check_query(query)
        for index, vectors in enumerate(document_vectors):
            if vectors.ndim != 2 or vectors.shape[1] != self.settings.dim:
                raise ValueError(f"document_vectors[{index}] must be [rows, {self.settings.dim}], "
                                 f"got shape {vectors.shape}")
        return maxsim_many(self._query_vectors([query])[0], document_vectors)

    def encode_documents_until(self, documents: Sequence[str],
                               deadline_ms: float) -> list[Vectors | None]:
        """`encode_documents` in input order, batch by batch, until `deadline_ms` is spent
        (overshooting by at most one batch); a document not encoded in time is None.

        Raises:
            TypeError, InferenceError: As for encode_documents.
        """
        vectors: list[Vectors | None] = [None] * len(documents)
        for _, row, kept in self._documents_until(check_documents(documents),
                                                  DeadlineGate.after(deadline_ms)):
            vectors[row.item_index] = kept
        return vectors

    def _score_pairs(self, pairs: Sequence[Pair], instruction: str | None) -> ScoreRun:
        """Each distinct query and document encoded once, each distinct pair scored once by
        MaxSim; with the score cache, a pair scored before is not encoded again."""
        started = time.perf_counter()
        scores = np.zeros(len(pairs), dtype=np.float32)
        tokens = np.zeros(len(pairs), dtype=np.int64)
        keys: list[str] = []
        hits: dict[int, float] = {}
        if self._cache is not None:
            keys = [self._cache.key(query, document) for query, document in pairs]
            hits = {index: entry[0] for index, key in enumerate(keys)
                    if (entry := self._cache.get(key)) is not None}
        todo = [index for index in range(len(pairs)) if index not in hits]
        queries = list(dict.fromkeys(pairs[index][0] for index in todo))
        documents = list(dict.fromkeys(pairs[index][1] for index in todo))
        vectors, rows, batches = self._document_vectors(documents)
        ran = {document: (kept, len(row.ids)) for document, kept, row in zip(documents, vectors, rows)}
        fresh = _pair_scores([pairs[index] for index in todo],
                             dict(zip(queries, self._query_vectors(queries))), ran)
        for index, (query, document) in enumerate(pairs):
            if index in hits:
                scores[index] = hits[index]
                continue
            scores[index], tokens[index] = fresh[(query, document)], ran[document][1]
            if self._cache is not None:
                self._cache.put(keys[index], (float(scores[index]), None))
        return ScoreRun(scores=scores, token_counts=tokens,
                        inference_ms=(time.perf_counter() - started) * 1000, batches=batches,
                        spans=[None] * len(pairs))

    def _score_until(self, pairs: Sequence[Pair], deadline_ms: float,
                     instruction: str | None) -> tuple[ScoreRun, np.ndarray]:
        """The queries, then each distinct document in input order batch by batch until the
        deadline (a pair is scored once its document ran; a repeated document runs once and a
        repeated pair is scored once); also returns which pairs were scored."""
        started = time.perf_counter()
        gate = DeadlineGate.after(deadline_ms)
        queries = list(dict.fromkeys(query for query, _ in pairs))
        query_vectors = dict(zip(queries, self._query_vectors(queries)))
        documents = list(dict.fromkeys(document for _, document in pairs))
        ran: dict[str, tuple[Vectors, int]] = {}
        batches: list[tuple[int, int]] = []
        current: Batch | None = None
        for batch, row, vectors in self._documents_until(documents, gate):
            if batch is not current:
                batches.append((len(batch.rows), batch.padded_length))
                current = batch
            ran[documents[row.item_index]] = (vectors, len(row.ids))
        fresh = _pair_scores(pairs, query_vectors, ran)
        scored = np.asarray([pair in fresh for pair in pairs], dtype=bool)
        return ScoreRun(scores=np.asarray([fresh.get(pair, -np.inf) for pair in pairs],
                                          dtype=np.float32),
                        token_counts=np.asarray([ran[document][1] if document in ran else 0
                                                 for _, document in pairs], dtype=np.int64),
                        inference_ms=(time.perf_counter() - started) * 1000,
                        batches=batches,
                        spans=[None] * len(pairs)), scored

    def _documents_until(self, documents: list[str], gate: DeadlineGate,
                         ) -> Iterator[tuple[Batch, EncodedRow, Vectors]]:
        """Each document's row and kept vectors, in input order batch by batch while `gate`
        lets batches through."""
        rows = self._late.encode_documents(documents)
        current: Batch | None = None
        for batch, index, vectors in kept_rows(self._plan(rows, sort_by_length=False),
                                               self._runner.run, self._late.document_keep,
                                               finite=self._finite,
                                               stop_before=gate.stop_before):
            if batch is not current:  # its first row: the batch has just run
                gate.ran(batch)
                current = batch
            yield batch, rows[index], vectors

    def _query_vectors(self, queries: list[str]) -> list[Vectors]:
        """Query vectors, run in batches of the engine's settings (with query expansion, every
        row padded to query_length: `query_plan`)."""
        if not queries:
            return []
        rows = self._late.encode_queries(queries)
        if self.settings.query_expansion:
            per_batch = max(1, self.config.max_batch_tokens // self.settings.query_length)
            plan = query_plan(rows, self.settings, min(per_batch, self.config.max_batch_size
                                                       or per_batch))
        else:
            plan = self._plan(rows)
        return token_vectors(plan, self._runner.run, self._late.query_keep, self.settings.dim,
                             finite=self._finite)

    def _document_vectors(self, documents: list[str]) -> tuple[
            list[Vectors], list[EncodedRow], list[tuple[int, int]]]:
        """Kept vectors, rows and (rows, padded length) of every run for `documents`."""
        if not documents:
            return [], [], []
        rows = self._late.encode_documents(documents)
        plan = self._plan(rows, sort_by_length=self.config.sort_by_length)
        vectors = token_vectors(plan, self._runner.run, self._late.document_keep,
                                self.settings.dim, finite=self._finite)
        return vectors, rows, [(len(batch.rows), batch.padded_length) for batch in plan.batches]


def query_plan(rows: Sequence[EncodedRow], settings: LateInteractionSettings,
               per_batch: int) -> RowPlan:
    """Expanded query rows in batches of `per_batch`, each padded to query_length with the
    expansion id: the padding is the expansion, unattended (rows that attend to it carry it
    themselves: LateInteractionEncoder.encode_queries)."""
    batches = [Batch(np.arange(start, min(start + per_batch, len(rows))), settings.query_length)
               for start in range(0, len(rows), per_batch)]
    return RowPlan(rows, batches, settings.expansion_token_id)


def kept_rows(plan: RowPlan, run: RunFeeds, keep: Keep, *, finite: FiniteCheck | None,
              stop_before: Callable[[Batch], bool] | None = None,
              ) -> Iterator[tuple[Batch, int, Vectors]]:
    """Run the plan's batches in order, yielding (batch, row index, the row's output vectors at
    the positions `keep` marks: float32 [kept, dim]) for each row once its batch ran; a row's
    vectors are its own whatever it ran with.

    Raises:
        InferenceError: As for onnxrank.engine.execution.run_plan.
    """
    for batch, outputs in run_plan(plan, run, finite=finite, stop_before=stop_before):
        for position, row_index in enumerate(batch.rows):
            mask = keep(plan.rows[row_index])
            yield batch, int(row_index), np.ascontiguousarray(outputs[position, :len(mask)][mask])


def token_vectors(plan: RowPlan, run: RunFeeds, keep: Keep, dim: int, *,
                  finite: FiniteCheck | None) -> list[Vectors]:
    """Every row's kept vectors (`kept_rows`), in row order.

    Raises:
        InferenceError: As for onnxrank.engine.execution.run_plan.
    """
    vectors: list[Vectors] = [np.zeros((0, dim), np.float32)] * len(plan.rows)
    for _, index, kept in kept_rows(plan, run, keep, finite=finite):
        vectors[index] = kept
    return vectors


def _pair_scores(pairs: Sequence[Pair], query_vectors: dict[str, Vectors],
                 documents: dict[str, tuple[Vectors, int]]) -> dict[Pair, float]:
    """MaxSim of each distinct pair whose document is in `documents` (vectors, tokens)."""
    return {(query, document): maxsim(query_vectors[query], documents[document][0])
            for query, document in dict.fromkeys(pairs) if document in documents}


def _settings(spec: ModelSpec) -> LateInteractionSettings:
    """The manifest's parsed late-interaction settings (ModelSpec checks they are there)."""
    if spec.late_settings is None:
        raise ModelLoadError(f"model {spec.name!r} is a {spec.task!r} model without "
                             "late_interaction settings")
    return spec.late_settings
