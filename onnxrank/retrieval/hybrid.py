"""HybridRetriever: lexical and dense candidates, fused (reciprocal rank or convex), optionally reranked."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from onnxrank.engine.embedder import Embedder
from onnxrank.engine.runtime import DEFAULT_MODELS_DIR, resolve_model_dir
from onnxrank.errors import MissingDependencyError, ModelLoadError, RetrievalError
from onnxrank.rerankers.base import RerankBackend
from onnxrank.rerankers.local import LocalReranker
from onnxrank.rerankers.registry import as_backend
from onnxrank.retrieval.dense import DenseIndex, HnswSettings
from onnxrank.retrieval.filters import Filters, compile_filters
from onnxrank.retrieval.fusion import (
    DEFAULT_FUSION,
    DEFAULT_FUSION_WEIGHT,
    DEFAULT_RRF_K,
    FusedCandidate,
    FusionConfig,
    fuse,
)
from onnxrank.retrieval.lexical import LexicalSettings, search_lexical
from onnxrank.retrieval.manifest import IndexManifest
from onnxrank.retrieval.results import MODES, Hit, LoadTimings, SearchResult, StageTimings
from onnxrank.retrieval.store import ChunkStore, StoredChunk
from onnxrank.types import Device

if TYPE_CHECKING:
    from onnxrank.engine.reranker import Reranker

logger = logging.getLogger(__name__)

DEFAULT_DEPTH = 100
DEFAULT_K = 10
STANDIN_NOTE = (
    "note: reranker {name!r} is not relevance-trained (manifest relevance_trained=false); "
    "its scores are not relevance scores and the reranked order is not a quality result"
)


def default_rerank_top_n(k: int) -> int:
    """Fused candidates the reranker sees by default: max(5 * k, 50)."""
    return max(5 * k, 50)


def backend_model(backend: RerankBackend) -> str | None:
    """The model a backend runs, when it has a `model` attribute (all shipped backends but none)."""
    model = getattr(backend, "model", None)
    return None if model is None else str(model)


def rerank_notes(
    backend: RerankBackend, candidates: int, scored: int, deadline_ms: float | None
) -> list[str]:
    """What a reader of reranked hits must know, one sentence each.

    1. The local model is not relevance-trained: its scores are not relevance scores.
    2. A deadline was set and not every candidate was scored: the rest keep the fused order.
    3. Otherwise nothing was scored (backend unavailable or failed): hits are in fused order.
    """
    notes = []
    if isinstance(backend, LocalReranker) and backend.relevance_trained is False:
        notes.append(STANDIN_NOTE.format(name=backend.model))
    if scored < candidates and deadline_ms is not None:
        notes.append(
            f"note: {scored} of {candidates} candidates were reranked within the deadline "
            f"({deadline_ms:g} ms); the rest keep the fused order (reranked=false)"
        )
    elif candidates and scored == 0 and backend.name != "none":
        notes.append(
            f"note: the {backend.name} reranker did not score any candidate (see the warning "
            "in the log); hits are in fused order (reranked=false)"
        )
    return notes


def load_index_manifest(store: ChunkStore) -> IndexManifest:
    """The manifest stored in an index database.

    Raises:
        RetrievalError: The index has no manifest (it was never written by `onnxrank index`).
    """
    raw = store.get_meta("manifest")
    if raw is None:
        raise RetrievalError(f"index {store.index_dir} has no manifest; rebuild it with `onnxrank index`")
    return IndexManifest.from_dict(json.loads(raw))


class HybridRetriever:
    """Searches one index directory in vector, lexical or hybrid mode, optionally reranking.

    The embedder and the HNSW file are loaded on the first search that needs them (once, under a
    lock), so lexical search works without them (and without hnswlib installed). One retriever
    serves many threads: each thread reads through its own SQLite connection and the HNSW beam
    is fixed when the index is opened.

    Example:
        >>> retriever = HybridRetriever.open("indexes/docs")  # doctest: +SKIP
        >>> [hit.source for hit in retriever.search("int8 validation", k=3)]  # doctest: +SKIP
        ['engine.md', 'export.md', 'README.md']
    """

    def __init__(
        self,
        store: ChunkStore,
        manifest: IndexManifest,
        *,
        embedder: Embedder | None = None,
        models_dir: str | Path = DEFAULT_MODELS_DIR,
        device: Device | str = Device.AUTO,
        threads: int | None = None,
        ef_search: int | None = None,
        lexical_settings: LexicalSettings | None = None,
    ) -> None:
        self.store = store
        self.manifest = manifest
        self.lexical_settings = lexical_settings or LexicalSettings()
        self._models_dir = models_dir
        self._device = device
        self._threads = threads
        settings = dict(manifest.hnsw)
        if ef_search is not None:
            settings["ef_search"] = ef_search
        self.hnsw_settings = HnswSettings(**settings)
        if embedder is not None:
            manifest.check_embedder(embedder.spec.manifest_hash(), embedder.spec.name)
        self._embedder = embedder
        self._dense: DenseIndex | None = None
        self._load_lock = threading.Lock()

    @classmethod
    def open(
        cls,
        index_dir: str | Path,
        *,
        embedder: Embedder | str | Path | None = None,
        models_dir: str | Path = DEFAULT_MODELS_DIR,
        device: Device | str = Device.AUTO,
        threads: int | None = None,
        ef_search: int | None = None,
        lexical_settings: LexicalSettings | None = None,
    ) -> HybridRetriever:
        """Open an index built by `onnxrank index` / `build_index`.

        Args:
            index_dir: The index directory.
            embedder: An Embedder, a model name under `models_dir` or a path; None reloads the
                embedder recorded in the index manifest when a dense search first needs it.
            models_dir: Where model names are looked up.
            device: Device for the embedder when this call loads it.
            threads: Intra-op threads for the embedder when this call loads it.
            ef_search: HNSW query beam, fixed for this retriever; None keeps the index's setting.
            lexical_settings: BM25 column weights and stopwords; None uses the defaults.

        Returns:
            The retriever.

        Raises:
            RetrievalError: No index at `index_dir`, or it is malformed.
            IndexMismatchError: `embedder` is not the embedder that built the index.
        """
        store = ChunkStore(index_dir)
        manifest = load_index_manifest(store)
        if isinstance(embedder, (str, Path)):
            options: dict[str, Any] = {"device": device, "threads": threads,
                                       **manifest.embedder.load_options()}
            embedder = Embedder.from_dir(resolve_model_dir(embedder, models_dir), **options)
        return cls(
            store,
            manifest,
            embedder=embedder,
            models_dir=models_dir,
            device=device,
            threads=threads,
            ef_search=ef_search,
            lexical_settings=lexical_settings,
        )

    def close(self) -> None:
        """Close the database."""
        self.store.close()

    @property
    def embedder(self) -> Embedder:
        """The query embedder (loaded on first use from the manifest's path, else by name)."""
        if self._embedder is None:
            # Double-checked: concurrent first searches load the model once.
            with self._load_lock:
                if self._embedder is None:
                    self._embedder = self._load_embedder()
        return self._embedder

    def _load_embedder(self) -> Embedder:
        record = self.manifest.embedder
        # The recorded absolute path first; a moved index finds the model by name instead.
        path = Path(record.path)
        if not path.is_dir():
            path = resolve_model_dir(record.name, self._models_dir)
        options: dict[str, Any] = {"device": self._device, "threads": self._threads,
                                   **record.load_options()}
        embedder = Embedder.from_dir(path, **options)
        self.manifest.check_embedder(embedder.spec.manifest_hash(), embedder.spec.name)
        return embedder

    @property
    def dense(self) -> DenseIndex:
        """The HNSW index (opened, or rebuilt from the database if stale, on first use)."""
        if self._dense is None:
            with self._load_lock:
                if self._dense is None:
                    self._dense = DenseIndex.open(self.store, self.manifest.embedder.dim, self.hnsw_settings)
        return self._dense

    def preload(self, *, mode: str = "hybrid", reranker: RerankBackend | None = None) -> LoadTimings:
        """Load now what the first search in `mode` would load inside its timed stages.

        The embedder and the HNSW file load for vector and hybrid modes; a local rerank backend
        loads its model. What is already loaded costs nothing, so calling this before timing
        searches keeps every stage time free of model loading.

        Args:
            mode: "vector", "lexical" or "hybrid".
            reranker: The backend the searches will use; only a local one has a model to load.

        Returns:
            Milliseconds per part loaded. A local model that fails to load counts its attempt
            and is left for the search to report (fallback or raise, per its on_error).

        Raises:
            ValueError: Unknown mode.
            IndexMismatchError: The embedder is not the one that built the index.
        """
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        embedder_ms = dense_index_ms = reranker_ms = 0.0
        if mode in ("vector", "hybrid"):
            started = time.perf_counter()
            _ = self.embedder
            embedder_ms = (time.perf_counter() - started) * 1000
            started = time.perf_counter()
            _ = self.dense
            dense_index_ms = (time.perf_counter() - started) * 1000
        if isinstance(reranker, LocalReranker):
            started = time.perf_counter()
            try:
                reranker.load()
            except (ModelLoadError, MissingDependencyError):
                logger.debug("local reranker did not load; the search reports it")
            reranker_ms = (time.perf_counter() - started) * 1000
        return LoadTimings(embedder_ms, dense_index_ms, reranker_ms)

    def search(
        self,
        query: str,
        k: int = DEFAULT_K,
        *,
        mode: Literal["vector", "lexical", "hybrid"] = "hybrid",
        filters: Filters | None = None,
        depth: int | None = None,
        fusion: str = DEFAULT_FUSION,
        rrf_k: int = DEFAULT_RRF_K,
        fusion_weight: float = DEFAULT_FUSION_WEIGHT,
        rerank: bool = False,
        reranker: RerankBackend | Reranker | str | None = None,
        rerank_top_n: int | None = None,
        rerank_deadline_ms: float | None = None,
    ) -> list[Hit]:
        """The `k` best chunks for `query`; see `search_detailed` for the arguments."""
        return self.search_detailed(
            query,
            k,
            mode=mode,
            filters=filters,
            depth=depth,
            fusion=fusion,
            rrf_k=rrf_k,
            fusion_weight=fusion_weight,
            rerank=rerank,
            reranker=reranker,
            rerank_top_n=rerank_top_n,
            rerank_deadline_ms=rerank_deadline_ms,
        ).hits

    def search_detailed(
        self,
        query: str,
        k: int = DEFAULT_K,
        *,
        mode: Literal["vector", "lexical", "hybrid"] = "hybrid",
        filters: Filters | None = None,
        depth: int | None = None,
        fusion: str = DEFAULT_FUSION,
        rrf_k: int = DEFAULT_RRF_K,
        fusion_weight: float = DEFAULT_FUSION_WEIGHT,
        rerank: bool = False,
        reranker: RerankBackend | Reranker | str | None = None,
        rerank_top_n: int | None = None,
        rerank_deadline_ms: float | None = None,
    ) -> SearchResult:
        """Search and report how long each stage took.

        1. ``lexical``: FTS5 BM25 over title and text (query words OR-ed).
        2. ``vector``: cosine similarity of the query embedding (HNSW).
        3. ``hybrid``: both lists, `depth` deep each, fused by `fusion` (see retrieval.fusion):
           ``"rrf"`` (reciprocal rank, the default) or ``"convex"`` (z-scores of bm25 and cosine,
           weighed by `fusion_weight`).
        Filters restrict both sides inside their searches, before any truncation. With
        ``rerank=True`` the top `rerank_top_n` fused candidates are reranked by `reranker`.
        Safe to call from many threads at once.

        Args:
            query: User text (any characters; it never changes the FTS5 query's structure).
            k: Hits to return.
            mode: "vector", "lexical" or "hybrid".
            filters: Metadata filters (equality, membership, ranges); see retrieval.filters.
            depth: Candidates per side; default max(100, k, rerank_top_n).
            fusion: "rrf" or "convex".
            rrf_k: Reciprocal rank fusion offset (60: the value of Cormack et al.); rrf only.
            fusion_weight: Weight of the vector side, 0 to 1; convex only.
            rerank: Rerank the fused candidates with `reranker`.
            reranker: A backend from onnxrank.rerankers (local, cohere, llm, none), an engine
                Reranker (wrapped in LocalReranker), or a backend name. A backend that cannot
                rerank (model missing, no API key, endpoint down) leaves the fused order with
                ``reranked=False`` and logs one warning; the search does not fail.
            rerank_top_n: Fused candidates to rerank; default max(5 * k, 50).
            rerank_deadline_ms: Time budget of the rerank stage, passed to the backend: the local
                engine scores in fused order until it is spent (the rest keep the fused order,
                ``reranked=False``); remote backends give up and keep the fused order.

        Returns:
            Hits best first with their stage ranks, the stage timings, and notes.

        Raises:
            ValueError: Empty query, k < 1, unknown mode, bad filters, bad fusion settings, or
                rerank without reranker.
            TypeError: `reranker` is none of the accepted kinds.
            IndexMismatchError: The embedder is not the one that built the index.
        """
        if not query or not query.strip():
            raise ValueError("query must be a non-empty string, got an empty one")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        fusion_config = FusionConfig(fusion=fusion, rrf_k=rrf_k, fusion_weight=fusion_weight)
        if rerank and reranker is None:
            raise ValueError(
                "rerank=True needs a reranker: a backend (onnxrank.rerankers.make_reranker), a "
                "Reranker, or a backend name (local, cohere, llm, none)"
            )
        backend = as_backend(reranker) if rerank else None
        top_n = rerank_top_n if rerank_top_n is not None else default_rerank_top_n(k)
        if top_n < 1:
            raise ValueError(f"rerank_top_n must be >= 1, got {top_n}")
        per_side = depth if depth is not None else max(DEFAULT_DEPTH, k, top_n if rerank else 0)
        lexical: list[tuple[int, float]] | None = None
        dense: list[tuple[int, float]] | None = None
        lexical_ms = dense_ms = 0.0
        if mode in ("lexical", "hybrid"):
            started = time.perf_counter()
            lexical = search_lexical(
                self.store, query, depth=per_side, filters=filters, settings=self.lexical_settings
            )
            lexical_ms = (time.perf_counter() - started) * 1000
        if mode in ("vector", "hybrid"):
            started = time.perf_counter()
            dense = self._search_dense(query, per_side, filters)
            dense_ms = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        fused = fuse(lexical, dense, fusion_config)
        lexical_at = {label: (rank, score) for rank, (label, score) in enumerate(lexical or [], 1)}
        dense_at = {label: (rank, score) for rank, (label, score) in enumerate(dense or [], 1)}
        fusion_ms = (time.perf_counter() - started) * 1000
        rerank_ms = 0.0
        reranked_order: list[tuple[int, float | None, bool]]
        notes: list[str] = []
        if backend is not None:
            started = time.perf_counter()
            reranked_order, candidates, scored = self._rerank(
                query, fused, top_n, k, backend, rerank_deadline_ms
            )
            rerank_ms = (time.perf_counter() - started) * 1000
            notes = rerank_notes(backend, candidates, scored, rerank_deadline_ms)
        else:
            reranked_order = [(candidate.label, None, False) for candidate in fused[:k]]
        fused_at = {candidate.label: candidate for candidate in fused}
        chunks = self.store.chunks([label for label, _, _ in reranked_order])
        hits = []
        for final_rank, (label, rerank_score, was_reranked) in enumerate(reranked_order, 1):
            hits.append(
                self._hit(
                    chunks[label],
                    final_rank,
                    lexical_at.get(label),
                    dense_at.get(label),
                    fused_at[label],
                    rerank_score,
                    was_reranked,
                    backend.name if backend is not None and was_reranked else None,
                )
            )
        return SearchResult(
            hits,
            StageTimings(lexical_ms, dense_ms, fusion_ms, rerank_ms),
            query=query,
            k=k,
            mode=mode,
            filters=None if filters is None else dict(filters),
            fusion=fusion_config,
            reranker=None if backend is None else backend.name,
            reranker_model=None if backend is None else backend_model(backend),
            notes=tuple(notes),
        )

    def _search_dense(self, query: str, depth: int, filters: Filters | None) -> list[tuple[int, float]]:
        vector = self.embedder.embed([query])[0]
        allowed = None
        if filters:
            condition, parameters = compile_filters(filters)
            allowed = self.store.labels(condition, parameters)
        return self.dense.search(vector, depth=depth, store=self.store, allowed=allowed)

    def _rerank(
        self,
        query: str,
        fused: list[FusedCandidate],
        top_n: int,
        k: int,
        backend: RerankBackend,
        deadline_ms: float | None,
    ) -> tuple[list[tuple[int, float | None, bool]], int, int]:
        """(label, score, reranked) best first, k of them; and how many candidates were scored."""
        candidates = [candidate.label for candidate in fused[:top_n]]
        passages = [chunk.passage for chunk in self._ordered_chunks(candidates)]
        ranked = backend.rerank(query, passages, deadline_ms=deadline_ms) if passages else []
        order = [
            (
                candidates[document.index],
                document.score if document.reranked else None,
                bool(document.reranked),
            )
            for document in ranked
        ]
        scored = sum(1 for _, _, was_reranked in order if was_reranked)
        order.extend((candidate.label, None, False) for candidate in fused[top_n:])
        return order[:k], len(candidates), scored

    def _ordered_chunks(self, labels: Sequence[int]) -> list[StoredChunk]:
        chunks = self.store.chunks(labels)
        return [chunks[label] for label in labels]

    @staticmethod
    def _hit(
        chunk: StoredChunk,
        final_rank: int,
        lexical: tuple[int, float] | None,
        dense: tuple[int, float] | None,
        fused: FusedCandidate,
        rerank_score: float | None,
        reranked: bool,
        reranker: str | None,
    ) -> Hit:
        return Hit(
            chunk_id=chunk.chunk_id,
            doc_id=chunk.doc_id,
            source=chunk.source,
            title=chunk.title,
            text=chunk.text,
            metadata=chunk.metadata,
            chunk_index=chunk.chunk_index,
            start_word=chunk.start_word,
            end_word=chunk.end_word,
            final_rank=final_rank,
            lexical_rank=None if lexical is None else lexical[0],
            dense_rank=None if dense is None else dense[0],
            lexical_score=None if lexical is None else lexical[1],
            dense_score=None if dense is None else dense[1],
            fused_score=fused.score,
            lexical_normalized=fused.lexical_normalized,
            dense_normalized=fused.dense_normalized,
            rerank_score=rerank_score,
            reranked=reranked,
            reranker=reranker,
        )
