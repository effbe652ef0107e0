"""Result types of retrieval and the `Retriever` protocol."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

Mode = Literal["vector", "lexical", "hybrid"]
MODES: tuple[str, ...] = ("vector", "lexical", "hybrid")


@dataclass(frozen=True, slots=True)
class Hit:
    """One retrieved chunk and how each stage ranked it (ranks from 1; None = not retrieved)."""

    chunk_id: str
    doc_id: str
    source: str  # file path (folders) or record id (JSONL)
    title: str
    text: str
    metadata: dict[str, Any]
    chunk_index: int
    start_word: int
    end_word: int
    final_rank: int
    lexical_rank: int | None
    dense_rank: int | None
    lexical_score: float | None  # -bm25, higher is better
    dense_score: float | None  # cosine similarity
    rrf_score: float
    rerank_score: float | None  # None when not reranked
    reranked: bool


@dataclass(frozen=True, slots=True)
class StageTimings:
    """Wall time per stage of one search, in milliseconds (0.0 for stages that did not run)."""

    lexical_ms: float = 0.0
    dense_ms: float = 0.0  # query embedding + HNSW search
    fusion_ms: float = 0.0
    rerank_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Hits plus the per-stage timings of the search that produced them."""

    hits: list[Hit]
    timings: StageTimings = field(default_factory=StageTimings)


@runtime_checkable
class Retriever(Protocol):
    """Anything that returns ranked hits for a query (HybridRetriever is one)."""

    def search(self, query: str, k: int = 10) -> list[Hit]:
        """The `k` best hits for `query`, best first."""
        ...
