"""The stored-vectors backend: late-interaction reranking of indexed passages without running the
document encoder.

Passages found in the index's stored vectors (onnxrank.retrieval.document_vectors, looked up by
their text's hash) are scored from them: one query encoding and MaxSim. A passage without stored
vectors (indexed before the vectors were, or not from this index) is encoded on the spot, so
the answer is the same either way, within the stored precision.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

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
    from onnxrank.retrieval.document_vectors import DocumentVectorStore

logger = logging.getLogger(__name__)


class StoredVectorReranker:
    """Reranks with a late-interaction model, reading document vectors from an index.

    The whole list is scored whatever `deadline_ms` says: after the one query encoding, MaxSim
    over stored vectors is the cheap step a cascade puts first.

    Args:
        model: The late-interaction model the index's vectors were stored with.
        vectors: The index's stored vectors; None encodes every document (the same scores,
            without the saving).
        on_error: "fallback" (retrieval order, one warning) or "raise" when inference fails.

    Raises:
        IndexMismatchError: `model` is not the one whose vectors `vectors` holds.
    """

    name = "stored_vectors"

    def __init__(self, model: LateInteractionReranker, vectors: DocumentVectorStore | None = None,
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
        stored: list[NDArray[np.float32] | None] = (
            self.vectors.lookup(documents) if self.vectors is not None else [None] * len(documents))
        missing = [index for index, vectors in enumerate(stored) if vectors is None]
        try:
            fresh = self.model.encode_documents([documents[index] for index in missing])
            for index, vectors in zip(missing, fresh):
                stored[index] = vectors
            scores = self.model.activate(self.model.score_vectors(
                query, [vectors for vectors in stored if vectors is not None]))
        except InferenceError as err:
            return self._degradation.fallback(
                documents, top_k=top_k, reason=f"inference failed ({err})", error=err)
        if missing:
            logger.debug("%d of %d documents had no stored vectors and were encoded",
                         len(missing), len(documents))
        return ranked_by_score(documents, {index: float(score) for index, score in enumerate(scores)},
                               top_k=top_k, backend=self.name)
