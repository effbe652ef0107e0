"""Rerank backends behind one protocol: local engine, Cohere-compatible HTTP, LLM, none, stored
late-interaction vectors, and a cascade of any of them."""

from __future__ import annotations

from onnxrank.rerankers.base import (
    BackendRankedDocument,
    BackendUnavailableError,
    RerankBackend,
)
from onnxrank.rerankers.cascade import CascadeReranker, CascadeStage, build_cascade
from onnxrank.rerankers.cohere import CohereReranker
from onnxrank.rerankers.llm import LLMReranker
from onnxrank.rerankers.local import LocalReranker
from onnxrank.rerankers.none import NoReranker
from onnxrank.rerankers.registry import BACKEND_NAMES, as_backend, make_reranker
from onnxrank.rerankers.stored import StoredVectorReranker

__all__ = [
    "BACKEND_NAMES",
    "BackendRankedDocument",
    "BackendUnavailableError",
    "CascadeReranker",
    "CascadeStage",
    "CohereReranker",
    "LLMReranker",
    "LocalReranker",
    "NoReranker",
    "RerankBackend",
    "StoredVectorReranker",
    "as_backend",
    "build_cascade",
    "make_reranker",
]
