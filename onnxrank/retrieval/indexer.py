"""Building and incrementally updating an index directory from a source."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxrank.engine.embedder import Embedder
from onnxrank.errors import IndexMismatchError
from onnxrank.retrieval.chunking import Chunk, SourceDocument, chunk_document, read_source
from onnxrank.retrieval.dense import DenseIndex, HnswSettings
from onnxrank.retrieval.document_vectors import (
    DEFAULT_VECTOR_PRECISION,
    DocumentVectorsRecord,
    DocumentVectorStore,
    VectorPrecision,
    fill_document_vectors,
)
from onnxrank.retrieval.manifest import (
    EmbedderRecord,
    IndexManifest,
    embedder_record_options,
    write_manifest_mirror,
)
from onnxrank.retrieval.store import ChunkStore

if TYPE_CHECKING:
    from onnxrank.engine.late_interaction import LateInteractionReranker

logger = logging.getLogger(__name__)

DEFAULT_EMBEDDER = "minilm-embedder"
DEFAULT_CHUNK_WORDS = 400
DEFAULT_OVERLAP_WORDS = 80
# Chunks embedded and committed per transaction: large enough to keep the embedder's batches
# full, small enough that a killed run loses little work.
CHUNKS_PER_TRANSACTION = 256


@dataclass(frozen=True, slots=True)
class IndexReport:
    """What one indexing run did."""

    added: int  # new documents
    updated: int  # changed documents (replaced)
    unchanged: int  # skipped by content hash
    removed: int  # vanished from the source (reconcile)
    documents: int  # stored after the run
    chunks: int
    seconds: float
    vector_chunks: int = 0  # chunks whose token vectors are stored (after the run)
    vector_rows: int = 0  # token vectors stored
    vector_bytes: int = 0  # bytes of the stored token vectors and their scales


def build_index(
    source: str | Path,
    index_dir: str | Path,
    embedder: Embedder,
    *,
    chunk_words: int = DEFAULT_CHUNK_WORDS,
    overlap_words: int = DEFAULT_OVERLAP_WORDS,
    hnsw: HnswSettings | None = None,
    reconcile: bool | None = None,
    chunks_per_transaction: int = CHUNKS_PER_TRANSACTION,
    show_progress: bool = False,
    document_vectors: LateInteractionReranker | None = None,
    vector_precision: VectorPrecision = DEFAULT_VECTOR_PRECISION,
) -> IndexReport:
    """Create or update an index from a folder of .txt/.md files or a JSONL file.

    Incremental: a document whose content hash is stored already is skipped, a changed one is
    replaced, and with `reconcile` documents missing from the source are removed from both sides.
    Each group of `chunks_per_transaction` chunks is committed in one SQLite transaction, so a
    killed run leaves whole documents only; re-running completes it.

    Args:
        source: Folder or .jsonl file (see chunking.read_source).
        index_dir: Index directory (created when missing).
        embedder: The embedding model; an existing index only accepts the one that built it.
        chunk_words: Words per chunk, e.g. 400.
        overlap_words: Words shared by consecutive chunks, e.g. 80.
        hnsw: HNSW settings used when the index is created (stored in the manifest); None
            uses the measured defaults of HnswSettings.
        reconcile: Remove documents absent from the source; None means True for folders and
            False for JSONL files (a JSONL file is often a partial feed).
        chunks_per_transaction: Chunks per commit, e.g. 256.
        show_progress: Show a tqdm progress bar over documents.
        document_vectors: A late-interaction model whose token vectors of every chunk are
            stored (onnxrank.retrieval.document_vectors); an index that stores them accepts only
            that model afterwards.
        vector_precision: "fp16" or "int8" (fixed when the index first stores vectors).

    Returns:
        Counts of what changed.

    Raises:
        IndexMismatchError: The index was built with another embedder, chunking settings,
            document-vector model or vector precision.
        ValueError: Bad source or settings.
    """
    started = time.perf_counter()
    source_path = Path(source)
    if reconcile is None:
        reconcile = source_path.is_dir()
    if chunks_per_transaction < 1:
        raise ValueError(f"chunks_per_transaction must be >= 1, got {chunks_per_transaction}")
    chunk_document(SourceDocument("", "", ""), chunk_words=chunk_words, overlap_words=overlap_words)
    store = ChunkStore(index_dir, create=True)
    try:
        manifest = _prepare_manifest(
            store, embedder, chunk_words, overlap_words, hnsw or HnswSettings(), str(source_path)
        )
        vectors = _vector_store(store, manifest, document_vectors, vector_precision)
        if vectors is not None:
            manifest = IndexManifest(**{**asdict(manifest), "embedder": manifest.embedder,
                                        "document_vectors": vectors.record.to_dict()})
            # Recorded at once, as the embedder is: a killed run's vectors still name their model.
            store.set_meta("manifest", json.dumps(manifest.to_dict(), sort_keys=True))
        dense = DenseIndex.open(store, manifest.embedder.dim, HnswSettings(**manifest.hnsw))
        stored = store.document_hashes()
        seen: set[str] = set()
        pending: list[tuple[SourceDocument, list[Chunk]]] = []
        counts = {"added": 0, "updated": 0, "unchanged": 0}
        progress = _progress(show_progress)
        for document in read_source(source_path):
            if progress is not None:
                progress.update(1)
            if document.source_id in seen:
                logger.warning(
                    "source id %r appears twice in %s; keeping the first",
                    document.source_id,
                    source_path,
                )
                continue
            seen.add(document.source_id)
            if stored.get(document.source_id) == document.doc_id:
                counts["unchanged"] += 1
                continue
            counts["updated" if document.source_id in stored else "added"] += 1
            pending.append(
                (
                    document,
                    chunk_document(document, chunk_words=chunk_words, overlap_words=overlap_words),
                )
            )
            if sum(len(chunks) for _, chunks in pending) >= chunks_per_transaction:
                _commit(store, dense, embedder, pending)
                pending = []
        if pending:
            _commit(store, dense, embedder, pending)
        if progress is not None:
            progress.close()
        vanished = sorted(set(stored) - seen) if reconcile else []
        if vanished:
            change = store.apply(
                [], np.zeros((0, manifest.embedder.dim), dtype=np.float32), remove_sources=vanished
            )
            dense.apply(change)
        if vectors is not None and document_vectors is not None:
            fill_document_vectors(vectors, document_vectors)
        vector_sizes = (0, 0, 0) if vectors is None else vectors.sizes()
        final = IndexManifest(
            **{
                **asdict(manifest),
                "embedder": manifest.embedder,
                "documents": store.count_documents(),
                "chunks": store.count_chunks(),
                "source": str(source_path),
                "updated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            }
        )
        store.set_meta("manifest", json.dumps(final.to_dict(), sort_keys=True))
        dense.save(store.index_dir)
        write_manifest_mirror(final, store.index_dir)
        report = IndexReport(
            added=counts["added"],
            updated=counts["updated"],
            unchanged=counts["unchanged"],
            removed=len(vanished),
            documents=final.documents,
            chunks=final.chunks,
            seconds=time.perf_counter() - started,
            vector_chunks=vector_sizes[0],
            vector_rows=vector_sizes[1],
            vector_bytes=vector_sizes[2],
        )
    finally:
        store.close()
    logger.info("indexed %s into %s: %s", source_path, index_dir, report)
    return report


def _prepare_manifest(
    store: ChunkStore,
    embedder: Embedder,
    chunk_words: int,
    overlap_words: int,
    hnsw: HnswSettings,
    source: str,
) -> IndexManifest:
    """The stored manifest after checking it against this run, or a new one (committed at once,
    so that even a run killed before its first document records which embedder it used)."""
    raw = store.get_meta("manifest")
    spec = embedder.spec
    if raw is not None:
        manifest = IndexManifest.from_dict(json.loads(raw))
        manifest.check_embedder(spec.manifest_hash(), spec.name)
        if (manifest.chunk_words, manifest.overlap_words) != (chunk_words, overlap_words):
            raise IndexMismatchError(
                f"index {store.index_dir} was built with chunk_words={manifest.chunk_words}, "
                f"overlap_words={manifest.overlap_words}; got chunk_words={chunk_words}, "
                f"overlap_words={overlap_words}; use the index's settings or a new "
                "--index directory"
            )
        if asdict(hnsw) != manifest.hnsw:
            logger.warning(
                "index %s keeps its HNSW settings %s (given: %s)",
                store.index_dir,
                manifest.hnsw,
                asdict(hnsw),
            )
        return manifest
    info = embedder.device_info
    backend, precision = embedder_record_options(info.backend, info.variant, info.precision)
    manifest = IndexManifest(
        embedder=EmbedderRecord(
            name=spec.name,
            manifest_hash=spec.manifest_hash(),
            variant=info.variant,
            path=str(Path(embedder.model_dir).resolve()),
            dim=embedder.dim,
            backend=backend,
            precision=precision,
        ),
        chunk_words=chunk_words,
        overlap_words=overlap_words,
        hnsw=asdict(hnsw),
        source=source,
    )
    store.set_meta("manifest", json.dumps(manifest.to_dict(), sort_keys=True))
    return manifest


def _vector_store(
    store: ChunkStore,
    manifest: IndexManifest,
    model: LateInteractionReranker | None,
    precision: str,
) -> DocumentVectorStore | None:
    """The stored vectors' store after checking this run's model against the recorded one.

    1. No model and none recorded: None.
    2. No model but vectors recorded: the recorded store, with a warning (new chunks get no
       vectors until a run with the model fills them; a rerank encodes those afresh).
    3. A model: the store (created when missing), refusing another model or precision.
    """
    recorded = (None if manifest.document_vectors is None
                else DocumentVectorsRecord.from_dict(manifest.document_vectors))
    if model is None:
        if recorded is not None:
            logger.warning("index %s stores document vectors of %s; this run adds none (pass "
                           "--document-vectors %s to keep them in step)", store.index_dir,
                           recorded.name, recorded.path)
            return DocumentVectorStore(store, recorded)
        return None
    spec = model.spec
    if recorded is not None:
        recorded.check_model(spec.manifest_hash(), spec.name)
        if recorded.precision != precision:
            raise IndexMismatchError(
                f"index {store.index_dir} stores document vectors in {recorded.precision}; got "
                f"vector precision {precision}; use --vector-precision {recorded.precision} or a "
                "new --index directory")
    record = recorded or DocumentVectorsRecord(
        name=spec.name, manifest_hash=spec.manifest_hash(),
        path=str(Path(model.model_dir).resolve()), precision=precision, dim=model.settings.dim)
    vectors = DocumentVectorStore(store, record)
    vectors.create()
    return vectors


def _commit(
    store: ChunkStore,
    dense: DenseIndex,
    embedder: Embedder,
    pending: list[tuple[SourceDocument, list[Chunk]]],
) -> None:
    passages = [chunk.passage for _, chunks in pending for chunk in chunks]
    vectors = embedder.embed(passages)
    dense.apply(store.apply(pending, vectors))


def _progress(show_progress: bool) -> Any:
    if not show_progress:
        return None
    from onnxrank._optional import require

    return require("tqdm.auto", extra="dense").tqdm(desc="indexing", unit="doc")
