"""Embedded hybrid retrieval: SQLite FTS5 + hnswlib, fused (reciprocal rank or convex), then reranked."""

from __future__ import annotations

from onnxrank.retrieval.compression import CompressedDocument, Segment, compress
from onnxrank.retrieval.filters import Filters
from onnxrank.retrieval.fusion import FusionConfig
from onnxrank.retrieval.hybrid import HybridRetriever
from onnxrank.retrieval.indexer import IndexReport, build_index
from onnxrank.retrieval.results import Hit, LoadTimings, SearchResult, StageTimings

__all__ = [
    "CompressedDocument",
    "Filters",
    "FusionConfig",
    "Hit",
    "HybridRetriever",
    "IndexReport",
    "LoadTimings",
    "SearchResult",
    "Segment",
    "StageTimings",
    "build_index",
    "compress",
]
