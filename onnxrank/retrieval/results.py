"""Result types of retrieval, and the JSON payload of a search (shared by the CLI and servers)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from onnxrank.retrieval.fusion import FusionConfig

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
    # The score the fused order sorts by (SearchResult.fusion says which fusion), and each side's
    # term in it before weighting: 1 / (rrf_k + rank) for rrf, the per-query z-score for convex
    # (see FusedCandidate for candidates a side did not return); None when that side did not run.
    fused_score: float
    lexical_normalized: float | None
    dense_normalized: float | None
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
class LoadTimings:
    """Wall time of the one-off loads before the first search, in milliseconds (0.0: nothing was
    loaded, or it was loaded before). Kept apart from StageTimings: a stage time never includes a
    model load."""

    embedder_ms: float = 0.0  # the query embedder's model (session build, OpenVINO compile)
    dense_index_ms: float = 0.0  # the HNSW file (rebuilt from the database when stale)
    reranker_ms: float = 0.0  # the local rerank model

    @property
    def total_ms(self) -> float:
        """All loads together."""
        return self.embedder_ms + self.dense_index_ms + self.reranker_ms

    def summary(self) -> str:
        """One line for reports and the console, e.g. ``model load 950.2 ms, not in the stage
        times (embedder 301.0 ms, dense index 2.1 ms, reranker 647.1 ms)``."""
        return (
            f"model load {self.total_ms:.1f} ms, not in the stage times (embedder "
            f"{self.embedder_ms:.1f} ms, dense index {self.dense_index_ms:.1f} ms, reranker "
            f"{self.reranker_ms:.1f} ms)"
        )

    def to_dict(self) -> dict[str, float]:
        """The fields and ``total_ms``, for JSON payloads."""
        return {**asdict(self), "total_ms": self.total_ms}


@dataclass(frozen=True, slots=True)
class SearchResult:
    """Hits, the per-stage timings, and what was asked (for the JSON payload).

    Attributes:
        hits: Best first.
        timings: Wall time per stage.
        query, k, mode, filters: The search's arguments.
        fusion: How the two lists were fused (method, rrf_k, fusion_weight).
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
    fusion: FusionConfig = field(default_factory=FusionConfig)
    reranker: str | None = None
    reranker_model: str | None = None
    notes: tuple[str, ...] = ()
    compressed: tuple[CompressedDocument, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON payload of `onnxrank query --json` (NaN scores become null).

        Keys: query, k, mode, filters, fusion ({fusion, rrf_k, fusion_weight}), rerank, reranker,
        reranker_model, notes, timings_ms, results (one object per hit with every Hit field, plus
        ``segments`` when compressed).
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
            "fusion": self.fusion.to_dict(),
            "rerank": self.reranker is not None,
            "reranker": self.reranker,
            "reranker_model": self.reranker_model,
            "notes": list(self.notes),
            "timings_ms": asdict(self.timings),
            "results": results,
        }


def _json_number(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value
