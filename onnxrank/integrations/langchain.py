"""LangChain adapters (extra ``langchain``).

* OnnxRankRerank: a ``BaseDocumentCompressor`` (e.g. for ``ContextualCompressionRetriever``). Like
  LangChain's CohereRerank it returns copies of the best `top_n` documents, best first, with the
  score in ``metadata["relevance_score"]``; the caller's documents are not changed. The score is
  the model's activated score (sigmoid for cross-encoders). ``acompress_documents`` is
  BaseDocumentCompressor's own: it runs ``compress_documents`` in an executor.
* OnnxRankCrossEncoder: a ``BaseCrossEncoder`` (``langchain_core.cross_encoders``, the class that
  ``langchain_classic``'s CrossEncoderReranker takes) whose ``score(text_pairs)`` returns activated
  scores, as HuggingFaceCrossEncoder does through sentence-transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from copy import deepcopy
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from onnxrank._optional import require
from onnxrank.engine.reranker import Reranker
from onnxrank.engine.runtime import DEFAULT_MODELS_DIR

_documents = require("langchain_core.documents", extra="langchain")
_cross_encoders = require("langchain_core.cross_encoders", extra="langchain")
_pydantic = require("pydantic", extra="langchain")
if TYPE_CHECKING:
    from langchain_core.cross_encoders import BaseCrossEncoder
    from langchain_core.documents import BaseDocumentCompressor
else:
    BaseCrossEncoder = _cross_encoders.BaseCrossEncoder
    BaseDocumentCompressor = _documents.BaseDocumentCompressor

RELEVANCE_SCORE_KEY = "relevance_score"


class OnnxRankRerank(BaseDocumentCompressor):
    """Document compressor that reranks with an onnxrank model.

    Pass a loaded `reranker` (for engine options), or a `model` name under `models_dir`.

    Example:
        >>> compressor = OnnxRankRerank(model="minilm-standin", top_n=2)  # doctest: +SKIP
        >>> compressor.compress_documents(documents, "wing flutter")  # doctest: +SKIP
    """

    reranker: Reranker | None = None
    """A loaded onnxrank Reranker; built from `model` when None."""
    model: str | None = None
    """An exported model name under `models_dir`, or a model directory."""
    models_dir: str = DEFAULT_MODELS_DIR
    """Where model names are looked up."""
    top_n: int | None = 3
    """Number of documents to return; None returns all, reranked."""

    model_config = _pydantic.ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    @_pydantic.field_validator("top_n")
    @classmethod
    def _check_top_n(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"top_n must be >= 1 or None, got {value}")
        return value

    @_pydantic.model_validator(mode="after")
    def _load_reranker(self) -> OnnxRankRerank:
        if (self.reranker is None) == (self.model is None):
            raise ValueError("pass exactly one of reranker=Reranker.from_pretrained(...) or "
                             "model='<exported model name or directory>'")
        if self.reranker is None:
            self.reranker = Reranker.from_pretrained(str(self.model), models_dir=self.models_dir)
        return self

    def compress_documents(
        self,
        documents: Sequence[Any],
        query: str,
        callbacks: Any = None,
    ) -> Sequence[Any]:
        """Rerank `documents` for `query`; return copies of the best `top_n` with their scores.

        Args:
            documents: LangChain Documents (their ``page_content`` is scored).
            query: The query.
            callbacks: Accepted for the interface; not used (as in LangChain's rerankers).

        Returns:
            New Documents, best first, ``metadata["relevance_score"]`` set.

        Raises:
            ValueError: An empty query.
            InferenceError: The model failed.
        """
        if not documents:
            return []
        reranker = cast(Reranker, self.reranker)  # never None after _load_reranker
        ranked = reranker.rerank(query, [document.page_content for document in documents],
                                      top_k=self.top_n)
        compressed = []
        for result in ranked:
            original = documents[result.index]
            metadata = deepcopy(original.metadata)
            metadata[RELEVANCE_SCORE_KEY] = result.score
            compressed.append(_documents.Document(page_content=original.page_content,
                                                  metadata=metadata, id=original.id))
        return compressed


class OnnxRankCrossEncoder(BaseCrossEncoder):
    """LangChain BaseCrossEncoder on an onnxrank model, for ``CrossEncoderReranker(model=...)``.

    Args:
        reranker: A loaded onnxrank Reranker.
    """

    def __init__(self, reranker: Reranker) -> None:
        if not isinstance(reranker, Reranker):
            raise TypeError(f"reranker must be an onnxrank Reranker, got {type(reranker).__name__}")
        self.reranker = reranker

    @classmethod
    def from_pretrained(cls, name: str | Path, *, models_dir: str | Path = DEFAULT_MODELS_DIR,
                        **overrides: Any) -> OnnxRankCrossEncoder:
        """Load an exported model by name or directory (engine options as Reranker.from_pretrained)."""
        return cls(Reranker.from_pretrained(name, models_dir=models_dir, **overrides))

    def score(self, text_pairs: list[tuple[str, str]]) -> list[float]:
        """Activated scores (sigmoid for cross-encoders) of (query, document) pairs, in input order."""
        if not text_pairs:
            return []
        logits = self.reranker.score([(pair[0], pair[1]) for pair in text_pairs])
        return [float(value) for value in self.reranker.activate(logits)]
