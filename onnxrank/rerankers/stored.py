"""The stored-vectors backend: late-interaction reranking of indexed passages without running the
document encoder.

Passages found in the index's stored vectors (onnxrank.retrieval.document_vectors, looked up by
their text's hash) are scored from them: one query encoding and MaxSim. A passage without stored
vectors (indexed before the vectors were, or not from this index) is encoded on the spot, so
the answer is the same either way, within the stored precision.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
from numpy.typing import NDArray

from onnxrank.engine.maxsim import maxsim
from onnxrank.errors import InferenceError
from onnxrank.rerankers.base import (
    DEFAULT_ON_ERROR,
    Degradation,
    OnError,
    check_rerank_arguments,
    ranked_by_score,
)

if TYPE_CHECKING:
    from onnxrank.engine.late_interaction import LateInteractionReranker
    from onnxrank.engine.ranking import RankedDocument

logger = logging.getLogger(__name__)


class StoredVectorsModel(Protocol):
    """Which model an index's vectors were stored with (its manifest's ``document_vectors``)."""

    @property
    def name(self) -> str:
        """The model's name."""

    @property
    def manifest_hash(self) -> str:
        """ModelSpec.manifest_hash() of the model."""

    def check_model(self, manifest_hash: str, name: str) -> None:
        """Raise IndexMismatchError unless the vectors were stored with this model."""


class StoredVectors(Protocol):
    """An index's stored document vectors, as this backend reads them (written by
    onnxrank.retrieval.document_vectors.DocumentVectorStore; a protocol so that rerankers do not
    depend on the retrieval package above them)."""

    @property
    def record(self) -> StoredVectorsModel:
        """The model the vectors were stored with."""

    def lookup(self, passages: Sequence[str]) -> list[NDArray[np.float32] | None]:
        """Each passage's stored vectors (float32 [rows, dim]), None where none are stored."""


class StoredVectorReranker:
    """Reranks with a late-interaction model, reading document vectors from an index.

    A call encodes the query once, scores the passages with stored vectors by MaxSim (the cheap
    step a cascade puts first), then encodes the others. A passage repeated in the list is scored
    once and its repeats get that score. With `deadline_ms`, each step goes in input order while
    the budget lasts (the encoding batch by batch, overshooting by at most one batch); passages
    not scored in time follow in input order with ``reranked=False``, as with the local backend.

    Args:
        model: The late-interaction model the index's vectors were stored with.
        vectors: The index's stored vectors; None encodes every document (the same scores,
            without the saving).
        on_error: "fallback" (retrieval order, one warning) or "raise" when inference fails.

    Raises:
        IndexMismatchError: `model` is not the one whose vectors `vectors` holds.
    """

    name = "stored_vectors"

    def __init__(self, model: LateInteractionReranker, vectors: StoredVectors | None = None,
                 *, on_error: OnError = DEFAULT_ON_ERROR) -> None:
        if vectors is not None:
            vectors.record.check_model(model.spec.manifest_hash(), model.spec.name)
        self.model = model
        self.vectors = vectors
        self._degradation = Degradation(self.name, on_error)

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_k: int | None = None,
        deadline_ms: float | None = None,
    ) -> list[RankedDocument]:
        """Documents best first by MaxSim (the model's activation, "none" for ColBERT exports).

        Raises:
            ValueError, TypeError: Bad arguments.
            BackendUnavailableError: Only with ``on_error="raise"``.
        """
        documents = check_rerank_arguments(query, documents, top_k, deadline_ms)
        if not documents:
            return []
        ends_at = math.inf if deadline_ms is None else time.perf_counter() + deadline_ms / 1000
        passages = list(dict.fromkeys(documents))
        stored: list[NDArray[np.float32] | None] = (
            self.vectors.lookup(passages) if self.vectors is not None else [None] * len(passages))
        try:
            raw = self._maxsims(query, passages, stored, ends_at)
        except InferenceError as err:
            return self._degradation.fallback(
                documents, top_k=top_k, reason=f"inference failed ({err})", error=err)
        by_passage = dict(zip(raw, self.model.activate(np.asarray(list(raw.values())))))
        return ranked_by_score(documents, {index: float(by_passage[passage])
                                           for index, passage in enumerate(documents)
                                           if passage in by_passage},
                               top_k=top_k, backend=self.name)

    def _maxsims(self, query: str, passages: list[str], stored: list[NDArray[np.float32] | None],
                 ends_at: float) -> dict[str, float]:
        """MaxSim of each passage scored before `ends_at` (time.perf_counter(); inf: all): those
        with stored vectors, then the others, encoded now.

        Raises:
            InferenceError: The model failed.
        """
        query_vectors = self.model.encode_queries([query])[0]
        scores: dict[str, float] = {}
        for passage, vectors in zip(passages, stored):
            if vectors is not None and time.perf_counter() < ends_at:
                scores[passage] = maxsim(query_vectors, vectors)
        missing = [passage for passage, vectors in zip(passages, stored) if vectors is None]
        left_ms = (ends_at - time.perf_counter()) * 1000
        if not missing or left_ms <= 0:
            return scores
        fresh = (self.model.encode_documents(missing) if math.isinf(left_ms)
                 else self.model.encode_documents_until(missing, left_ms))
        scores.update((passage, maxsim(query_vectors, vectors))
                      for passage, vectors in zip(missing, fresh) if vectors is not None)
        logger.debug("%d of %d passages had no stored vectors; %d were encoded in time",
                     len(missing), len(passages), sum(vectors is not None for vectors in fresh))
        return scores
