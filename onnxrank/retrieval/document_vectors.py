"""Stored document token vectors: each chunk's late-interaction vectors, kept in the index.

A document's token vectors do not depend on the query, so `onnxrank index --document-vectors`
computes them once; a late-interaction rerank of indexed candidates then encodes only the query
(onnxrank.rerankers.stored). The vectors live in the index database beside the chunks, one row
per chunk whose label references ``chunks``: the foreign key's ``ON DELETE CASCADE`` removes a
chunk's vectors in the same transaction as the chunk (update and reconcile delete chunks), and
`fill_document_vectors` encodes every chunk that has none, so the two sides stay in step even
after a killed run. Rows are looked up by the passage text's hash, which is what a rerank
backend receives.

Precisions (a stored row of `rows` vectors of `dim` values):
1. ``fp16``: 2 * rows * dim bytes; scores within ~1e-3 of their spread of the fp32 ones.
2. ``int8``: each vector scaled by its own max |value| / 127 and rounded; rows * dim bytes
   plus a float32 scale per vector (4 * rows).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray

from onnxrank.errors import IndexMismatchError, RetrievalError

if TYPE_CHECKING:
    from onnxrank.engine.late_interaction import LateInteractionReranker
    from onnxrank.retrieval.store import ChunkStore

logger = logging.getLogger(__name__)

VectorPrecision = Literal["fp16", "int8"]
VECTOR_PRECISIONS: tuple[str, ...] = ("fp16", "int8")
DEFAULT_VECTOR_PRECISION: VectorPrecision = "fp16"
# Chunks encoded per transaction when filling: a killed run loses at most this much work.
CHUNKS_PER_FILL = 256
SCHEMA = """
CREATE TABLE IF NOT EXISTS document_vectors (
    label INTEGER PRIMARY KEY REFERENCES chunks(label) ON DELETE CASCADE,
    passage_hash TEXT NOT NULL,
    rows INTEGER NOT NULL,
    vectors BLOB NOT NULL,
    scales BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS document_vectors_passage ON document_vectors (passage_hash);
"""


@dataclass(frozen=True, slots=True)
class DocumentVectorsRecord:
    """The late-interaction model whose vectors an index stores (the manifest's
    ``document_vectors``)."""

    name: str
    manifest_hash: str  # ModelSpec.manifest_hash() of the late-interaction model
    path: str  # where it was loaded from, to reload it for queries
    precision: str  # fp16 | int8
    dim: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DocumentVectorsRecord:
        """Parse the manifest's ``document_vectors``.

        Raises:
            RetrievalError: Malformed.
        """
        try:
            return cls(**data)
        except TypeError as err:
            raise RetrievalError(f"malformed document_vectors in the index manifest: {err}; "
                                 "rebuild the index") from err

    def check_model(self, manifest_hash: str, name: str) -> None:
        """Refuse a late-interaction model other than the one whose vectors are stored.

        Raises:
            IndexMismatchError: The hashes differ.
        """
        if manifest_hash != self.manifest_hash:
            raise IndexMismatchError(
                f"this index stores document vectors of {self.name!r} (manifest hash "
                f"{self.manifest_hash[:12]}…) but late-interaction model {name!r} (manifest hash "
                f"{manifest_hash[:12]}…) was given; use the same model "
                f"(--document-vectors {self.path}) or rebuild the index into a new directory"
            )


def passage_hash(passage: str) -> str:
    """The key a stored row is found by: sha256 of the passage text."""
    return hashlib.sha256(passage.encode("utf-8")).hexdigest()


def quantize(vectors: NDArray[np.float32], precision: str) -> tuple[bytes, bytes]:
    """(vectors, scales) bytes of one chunk's [rows, dim] vectors (scales empty for fp16).

    Raises:
        ValueError: Unknown precision.
    """
    if precision == "fp16":
        return vectors.astype(np.float16).tobytes(), b""
    if precision == "int8":
        scales = np.abs(vectors).max(axis=1, initial=0.0).astype(np.float32) / 127.0
        safe = np.where(scales > 0, scales, 1.0)[:, None]
        return np.rint(vectors / safe).astype(np.int8).tobytes(), scales.tobytes()
    raise ValueError(f"precision must be one of {', '.join(VECTOR_PRECISIONS)}, got {precision!r}")


def dequantize(data: bytes, scales: bytes, rows: int, dim: int, precision: str) -> NDArray[np.float32]:
    """The float32 [rows, dim] vectors `quantize` stored."""
    if precision == "fp16":
        return np.frombuffer(data, dtype=np.float16).reshape(rows, dim).astype(np.float32)
    values = np.frombuffer(data, dtype=np.int8).reshape(rows, dim).astype(np.float32)
    return values * np.frombuffer(scales, dtype=np.float32)[:, None]


class DocumentVectorStore:
    """Reads and writes the stored vectors of one index (its ChunkStore's database).

    Args:
        store: The index database.
        record: The model and precision of the stored vectors.
    """

    def __init__(self, store: ChunkStore, record: DocumentVectorsRecord) -> None:
        if record.precision not in VECTOR_PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(VECTOR_PRECISIONS)}, got "
                             f"{record.precision!r}")
        self.store = store
        self.record = record

    def create(self) -> None:
        """Create the table when missing (indexing runs only; readers never write)."""
        with self.store.transaction() as connection:
            for statement in SCHEMA.strip().split(";\n"):
                connection.execute(statement)

    def lookup(self, passages: Sequence[str]) -> list[NDArray[np.float32] | None]:
        """Each passage's stored vectors (float32 [rows, dim]), None where none are stored."""
        keys = [passage_hash(passage) for passage in passages]
        found: dict[str, NDArray[np.float32]] = {}
        unique = list(dict.fromkeys(keys))
        # SQLite caps bound parameters per statement; 500 stays under every build's limit.
        for start in range(0, len(unique), 500):
            part = unique[start:start + 500]
            for key, rows, data, scales in self.store.connection.execute(
                "SELECT passage_hash, rows, vectors, scales FROM document_vectors "
                f"WHERE passage_hash IN ({','.join('?' * len(part))})", part,
            ):
                found[key] = dequantize(data, scales, rows, self.record.dim, self.record.precision)
        return [found.get(key) for key in keys]

    def missing_labels(self) -> list[int]:
        """Labels of the chunks without stored vectors."""
        return [label for (label,) in self.store.connection.execute(
            "SELECT c.label FROM chunks c LEFT JOIN document_vectors v ON v.label = c.label "
            "WHERE v.label IS NULL ORDER BY c.label")]

    def write(self, labels: Sequence[int], passages: Sequence[str],
              vectors: Sequence[NDArray[np.float32]]) -> int:
        """Store each chunk's vectors in one transaction; returns the bytes written."""
        written = 0
        with self.store.transaction() as connection:
            for label, passage, chunk_vectors in zip(labels, passages, vectors):
                data, scales = quantize(chunk_vectors, self.record.precision)
                written += len(data) + len(scales)
                connection.execute(
                    "INSERT OR REPLACE INTO document_vectors (label, passage_hash, rows, vectors, "
                    "scales) VALUES (?, ?, ?, ?, ?)",
                    (label, passage_hash(passage), len(chunk_vectors), data, scales),
                )
        return written

    def sizes(self) -> tuple[int, int, int]:
        """(chunks, vectors, bytes) stored."""
        chunks, rows, size = self.store.connection.execute(
            "SELECT count(*), coalesce(sum(rows), 0), "
            "coalesce(sum(length(vectors) + length(scales)), 0) FROM document_vectors").fetchone()
        return int(chunks), int(rows), int(size)


def fill_document_vectors(vector_store: DocumentVectorStore, model: LateInteractionReranker, *,
                          chunks_per_fill: int = CHUNKS_PER_FILL) -> int:
    """Encode and store the vectors of every chunk that has none; returns how many.

    Raises:
        InferenceError: The model failed.
    """
    missing = vector_store.missing_labels()
    for start in range(0, len(missing), chunks_per_fill):
        labels = missing[start:start + chunks_per_fill]
        chunks = vector_store.store.chunks(labels)
        passages = [chunks[label].passage for label in labels]
        vector_store.write(labels, passages, model.encode_documents(passages))
    if missing:
        logger.info("stored document vectors of %d chunks", len(missing))
    return len(missing)


def open_document_vectors(store: ChunkStore) -> DocumentVectorStore | None:
    """The stored vectors of an index for reading, None when it stores none.

    Raises:
        RetrievalError: The index has no manifest or a malformed one.
    """
    from onnxrank.retrieval.hybrid import load_index_manifest

    record = load_index_manifest(store).document_vectors
    return None if record is None else DocumentVectorStore(store, DocumentVectorsRecord.from_dict(record))
