"""Result types of retrieval, and the JSON payload of a search (shared by the CLI and servers)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onnxrank.retrieval.compression import CompressedDocument

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
    # The backend that produced rerank_score ("local", "cohere", "llm", ...); None when not
    # reranked. Scores of different backends are not comparable.
    reranker: str | None = None


@dataclass(frozen=True, slots=True)
class StageTimings:
    """Wall time per stage of one search, in milliseconds (0.0 for stages that did not run)."""

    lexical_ms: float = 0.0
    dense_ms: float = 0.0  # query embedding + HNSW search
    fusion_ms: float = 0.0
    rerank_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Hits, the per-stage timings, and what was asked (for the JSON payload).

    Attributes:
        hits: Best first.
        timings: Wall time per stage.
        query, k, mode, filters: The search's arguments.
        reranker: Name of the rerank backend asked for ("local", "cohere"...), None without.
        reranker_model: The model that backend ran, when it says.
        notes: Facts a reader of the hits must know (a stand-in model's scores are not relevance
            scores; reranking fell back to the fused order).
        compressed: Per hit, the segments kept by `compress` (same order as `hits`), or None.
    """

    hits: list[Hit]
    timings: StageTimings = field(default_factory=StageTimings)
    query: str = ""
    k: int = 0
    mode: str = "hybrid"
    filters: dict[str, Any] | None = None
    reranker: str | None = None
    reranker_model: str | None = None
    notes: tuple[str, ...] = ()
    compressed: tuple[CompressedDocument, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON payload of `onnxrank query --json` (NaN scores become null).

        Keys: query, k, mode, filters, rerank, reranker, reranker_model, notes, timings_ms,
        results (one object per hit with every Hit field, plus ``segments`` when compressed).
        """
        results = []
        for position, hit in enumerate(self.hits):
            record = {key: _json_number(value) for key, value in asdict(hit).items()}
            if self.compressed is not None:
                record["compression"] = self.compressed[position].to_dict()
            results.append(record)
        return {
            "query": self.query,
            "k": self.k,
            "mode": self.mode,
            "filters": self.filters,
            "rerank": self.reranker is not None,
            "reranker": self.reranker,
            "reranker_model": self.reranker_model,
            "notes": list(self.notes),
            "timings_ms": asdict(self.timings),
            "results": results,
        }


def _json_number(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value
