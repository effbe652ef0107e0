"""Rerank backends behind one protocol: local engine, Cohere-compatible HTTP, LLM, none."""

from __future__ import annotations

from onnxrank.rerankers.base import (
    BackendRankedDocument,
    BackendUnavailableError,
    RerankBackend,
)
from onnxrank.rerankers.cohere import CohereReranker
from onnxrank.rerankers.llm import LLMReranker
from onnxrank.rerankers.local import LocalReranker
from onnxrank.rerankers.none import NoReranker
from onnxrank.rerankers.registry import BACKEND_NAMES, as_backend, make_reranker

__all__ = [
    "BACKEND_NAMES",
    "BackendRankedDocument",
    "BackendUnavailableError",
    "CohereReranker",
    "LLMReranker",
    "LocalReranker",
    "NoReranker",
    "RerankBackend",
    "as_backend",
    "make_reranker",
]
