"""onnxrank: fast, honest cross-encoder reranking on ONNX Runtime."""

from __future__ import annotations

from onnxrank.engine.ranking import RankedDocument
from onnxrank.engine.reranker import Reranker
from onnxrank.retrieval.hybrid import HybridRetriever
from onnxrank.types import Device

__version__ = "0.1.0"

__all__ = ["Device", "HybridRetriever", "RankedDocument", "Reranker", "__version__"]
