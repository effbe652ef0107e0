"""The local backend: onnxrank's own engine (Reranker), loaded on first use."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from onnxrank.engine.runtime import DEFAULT_MODELS_DIR
from onnxrank.errors import InferenceError, MissingDependencyError, ModelLoadError
from onnxrank.rerankers.base import (
    DEFAULT_ON_ERROR,
    BackendRankedDocument,
    Degradation,
    OnError,
    check_rerank_arguments,
)
from onnxrank.types import Pair, Scores

if TYPE_CHECKING:
    from onnxrank.engine.config import EngineConfig
    from onnxrank.engine.ranking import RankedDocument
    from onnxrank.engine.reranker import Reranker

logger = logging.getLogger(__name__)

DEFAULT_LOCAL_MODEL = "minilm-standin"


class LocalReranker:
    """Reranks with an exported cross-encoder in this process.

    The model is loaded by the first `rerank` (under a lock, so concurrent first calls load it
    once). When it cannot be loaded (missing directory, bad hash, missing dependency) or a batch
    fails, `rerank` logs one warning and returns the retrieval order flagged ``reranked=False``;
    with ``on_error="raise"`` it raises BackendUnavailableError instead.

    Args:
        model: A loaded Reranker, a model name under `models_dir`, or a model directory.
        models_dir: Where model names are looked up.
        config: Engine settings for the lazy load; None uses the engine's defaults.
        on_error: "fallback" (retrieval order, one warning) or "raise".

    Example:
        >>> backend = LocalReranker("minilm-standin", models_dir="models")  # doctest: +SKIP
        >>> backend.rerank("wing flutter", ["doc one", "doc two"], top_k=1)[0].backend  # doctest: +SKIP
        'local'
    """

    name = "local"

    def __init__(
        self,
        model: str | Path | Reranker = DEFAULT_LOCAL_MODEL,
        *,
        models_dir: str | Path = DEFAULT_MODELS_DIR,
        config: EngineConfig | None = None,
        on_error: OnError = DEFAULT_ON_ERROR,
    ) -> None:
        self._degradation = Degradation(self.name, on_error)
        self._lock = threading.Lock()
        self._models_dir = models_dir
        self._config = config
        self._load_error: BaseException | None = None
        self._reranker: Reranker | None = None
        self._model_name: str
        if isinstance(model, (str, Path)):
            self._model_name = str(model)
        else:
            self._reranker = model
            self._model_name = model.spec.name

    @property
    def model(self) -> str:
        """The model name or path this backend loads (the manifest's name once loaded)."""
        return self._model_name if self._reranker is None else self._reranker.spec.name

    @property
    def relevance_trained(self) -> bool | None:
        """The manifest's relevance_trained once the model is loaded; None before."""
        return None if self._reranker is None else self._reranker.spec.relevance_trained

    def load(self) -> Reranker:
        """The engine Reranker, loading it on the first call.

        Raises:
            ModelLoadError: The model cannot be loaded (also on every later call: a failed load
                is not retried).
            MissingDependencyError: A dependency of the configured backend is missing.
        """
        if self._reranker is not None:
            return self._reranker
        with self._lock:
            if self._reranker is None:
                if self._load_error is not None:
                    raise self._load_error
                from onnxrank.engine.reranker import Reranker

                try:
                    self._reranker = Reranker.from_pretrained(
                        self._model_name, models_dir=self._models_dir, config=self._config
                    )
                except (ModelLoadError, MissingDependencyError) as err:
                    self._load_error = err
                    raise
                logger.info("local reranker loaded %s", self._reranker.model_dir)
            return self._reranker

    def score(self, pairs: Sequence[Pair]) -> Scores:
        """Raw logits of the engine for (query, document) pairs, in input order.

        Raises:
            ModelLoadError: The model cannot be loaded.
            InferenceError: The model failed.
        """
        return self.load().score(pairs)

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_k: int | None = None,
        deadline_ms: float | None = None,
    ) -> list[RankedDocument]:
        """Documents best first, scored by the engine (its manifest's activation).

        With `deadline_ms`, documents are scored in input order batch by batch until the budget
        is spent; the rest follow in input order with ``reranked=False``.

        Raises:
            ValueError, TypeError: Bad arguments.
            BackendUnavailableError: Only with ``on_error="raise"``.
        """
        documents = check_rerank_arguments(query, documents, top_k, deadline_ms)
        if not documents:
            return []
        try:
            reranker = self.load()
        except (ModelLoadError, MissingDependencyError) as err:
            return self._degradation.fallback(
                documents, top_k=top_k, reason=f"the model could not be loaded ({err})", error=err
            )
        try:
            ranked = reranker.rerank(query, documents, top_k=top_k, deadline_ms=deadline_ms)
        except InferenceError as err:
            return self._degradation.fallback(
                documents, top_k=top_k, reason=f"inference failed ({err})", error=err
            )
        return [
            BackendRankedDocument(
                index=document.index,
                score=document.score,
                text=document.text,
                reranked=document.reranked,
                span=document.span,
                backend=self.name,
            )
            for document in ranked
        ]
