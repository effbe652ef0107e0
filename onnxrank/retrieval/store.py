"""The index database (SQLite): documents, chunks, their embeddings and the FTS5 table.

The database is the index's source of truth. Every change happens in one transaction that also
bumps ``generation``; the hnswlib file (dense.py) records the generation it was saved at and is
rebuilt from the embeddings stored here when the two disagree (e.g. after a killed indexing run).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from onnxrank.errors import RetrievalError
from onnxrank.retrieval.chunking import Chunk, SourceDocument

logger = logging.getLogger(__name__)

DATABASE_NAME = "index.sqlite"
SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS documents (
    source_id TEXT PRIMARY KEY,
    doc_id TEXT NOT NULL UNIQUE,
    content_hash TEXT NOT NULL,
    title TEXT NOT NULL,
    chunk_count INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS chunks (
    label INTEGER PRIMARY KEY AUTOINCREMENT,  -- the hnswlib label; AUTOINCREMENT never reuses one
    chunk_id TEXT NOT NULL UNIQUE,
    doc_id TEXT NOT NULL REFERENCES documents(doc_id) ON DELETE CASCADE,
    chunk_index INTEGER NOT NULL,
    start_word INTEGER NOT NULL,
    end_word INTEGER NOT NULL,
    source TEXT NOT NULL,
    title TEXT NOT NULL,
    text TEXT NOT NULL,
    metadata TEXT NOT NULL,
    embedding BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS chunks_doc_id ON chunks (doc_id);
CREATE VIRTUAL TABLE IF NOT EXISTS chunks_fts USING fts5 (
    title, text, content='chunks', content_rowid='label', tokenize='porter unicode61'
);
CREATE TRIGGER IF NOT EXISTS chunks_fts_insert AFTER INSERT ON chunks BEGIN
    INSERT INTO chunks_fts (rowid, title, text) VALUES (new.label, new.title, new.text);
END;
CREATE TRIGGER IF NOT EXISTS chunks_fts_delete AFTER DELETE ON chunks BEGIN
    INSERT INTO chunks_fts (chunks_fts, rowid, title, text)
    VALUES ('delete', old.label, old.title, old.text);
END;
"""


@dataclass(frozen=True, slots=True)
class StoredChunk:
    """A chunk row as read back from the database."""

    label: int
    chunk_id: str
    doc_id: str
    chunk_index: int
    start_word: int
    end_word: int
    source: str
    title: str
    text: str
    metadata: dict[str, Any]

    @property
    def passage(self) -> str:
        """Title and text, as embedded and reranked (see chunking.Chunk.passage)."""
        return f"{self.title} {self.text}".strip() if self.title else self.text


@dataclass(frozen=True, slots=True)
class ChangeSet:
    """What one write transaction did, for the dense side to mirror."""

    added_labels: list[int]
    added_vectors: NDArray[np.float32]
    removed_labels: list[int]
    generation: int


class ChunkStore:
    """The SQLite database of one index directory (single writer, any number of readers).

    Each thread gets its own connection (WAL mode lets readers run beside the writer), so
    concurrent searches never share a cursor or a transaction.
    """

    def __init__(self, index_dir: str | Path, *, create: bool = False) -> None:
        self.index_dir = Path(index_dir)
        self.path = self.index_dir / DATABASE_NAME
        if not self.path.exists() and not create:
            raise RetrievalError(
                f"no index at {self.index_dir} (missing {DATABASE_NAME}); build one with "
                f"`onnxrank index --source PATH --index {self.index_dir}`"
            )
        self.index_dir.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        self._closed = False
        connection = self.connection
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.executescript(SCHEMA)
        except sqlite3.DatabaseError as err:
            raise RetrievalError(f"could not open index database {self.path}: {err}") from err
        if self.get_meta("schema_version") is None:
            with self.transaction():
                self._set_meta("schema_version", str(SCHEMA_VERSION))
                self._set_meta("generation", "0")

    @property
    def connection(self) -> sqlite3.Connection:
        """This thread's connection to the database (opened on the thread's first use).

        Raises:
            RetrievalError: The store is closed or the database cannot be opened.
        """
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is not None:
            return connection
        with self._connections_lock:
            if self._closed:
                raise RetrievalError(f"the index database {self.path} is closed")
            try:
                # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE in `transaction`).
                connection = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
                connection.execute("PRAGMA foreign_keys=ON")
            except sqlite3.DatabaseError as err:
                raise RetrievalError(f"could not open index database {self.path}: {err}") from err
            self._connections.append(connection)
        self._local.connection = connection
        return connection

    def close(self) -> None:
        """Close every thread's connection; later use raises RetrievalError."""
        with self._connections_lock:
            self._closed = True
            connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
        self._local = threading.local()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception."""
        self.connection.execute("BEGIN IMMEDIATE")
        try:
            yield self.connection
        except BaseException:
            self.connection.execute("ROLLBACK")
            raise
        self.connection.execute("COMMIT")

    def get_meta(self, key: str) -> str | None:
        """A value of the meta table, None when unset."""
        row = self.connection.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _set_meta(self, key: str, value: str) -> None:
        self.connection.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    def set_meta(self, key: str, value: str) -> None:
        """Set a meta value in its own transaction."""
        with self.transaction():
            self._set_meta(key, value)

    @property
    def generation(self) -> int:
        """Counter bumped by every committed change to the chunks."""
        return int(self.get_meta("generation") or 0)

    def document_hashes(self) -> dict[str, str]:
        """source_id -> doc_id of every stored document."""
        return dict(self.connection.execute("SELECT source_id, doc_id FROM documents"))

    def apply(
        self,
        documents: Sequence[tuple[SourceDocument, list[Chunk]]],
        vectors: NDArray[np.float32],
        *,
        remove_sources: Iterable[str] = (),
    ) -> ChangeSet:
        """Replace/insert documents with their chunks and remove others, in one transaction.

        Args:
            documents: Each new or changed document with its chunks (a document whose source id
                is stored already replaces the stored version).
            vectors: One embedding per chunk, in the order of the chunks of `documents`.
            remove_sources: Source ids to delete.

        Returns:
            The labels added (with their vectors) and removed, and the new generation.
        """
        added: list[int] = []
        removed: list[int] = []
        sources = [document.source_id for document, _ in documents] + list(remove_sources)
        with self.transaction() as connection:
            for source_id in sources:
                removed.extend(
                    label
                    for (label,) in connection.execute(
                        "SELECT c.label FROM chunks c JOIN documents d ON c.doc_id = d.doc_id "
                        "WHERE d.source_id = ?",
                        (source_id,),
                    )
                )
                connection.execute(
                    "DELETE FROM chunks WHERE doc_id IN (SELECT doc_id FROM documents WHERE source_id = ?)",
                    (source_id,),
                )
                connection.execute("DELETE FROM documents WHERE source_id = ?", (source_id,))
            position = 0
            for document, chunks in documents:
                connection.execute(
                    "INSERT INTO documents (source_id, doc_id, content_hash, title, chunk_count) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (
                        document.source_id,
                        document.doc_id,
                        document.content_hash,
                        document.title,
                        len(chunks),
                    ),
                )
                for chunk in chunks:
                    cursor = connection.execute(
                        "INSERT INTO chunks (chunk_id, doc_id, chunk_index, start_word, end_word, "
                        "source, title, text, metadata, embedding) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            chunk.chunk_id,
                            chunk.doc_id,
                            chunk.chunk_index,
                            chunk.start_word,
                            chunk.end_word,
                            chunk.source,
                            chunk.title,
                            chunk.text,
                            json.dumps(chunk.metadata, sort_keys=True, ensure_ascii=False),
                            np.ascontiguousarray(vectors[position], dtype=np.float32).tobytes(),
                        ),
                    )
                    added.append(int(cursor.lastrowid or 0))
                    position += 1
            generation = self.generation + 1
            self._set_meta("generation", str(generation))
        return ChangeSet(added, vectors[: len(added)], removed, generation)

    def count_documents(self) -> int:
        """Number of stored documents."""
        return int(self.connection.execute("SELECT count(*) FROM documents").fetchone()[0])

    def count_chunks(self) -> int:
        """Number of stored chunks."""
        return int(self.connection.execute("SELECT count(*) FROM chunks").fetchone()[0])

    def labels(self, condition: str = "1", parameters: Sequence[Any] = ()) -> NDArray[np.int64]:
        """Labels of the chunks matching a SQL condition on ``chunks c`` (all by default)."""
        rows = self.connection.execute(
            f"SELECT c.label FROM chunks c WHERE {condition} ORDER BY c.label", list(parameters)
        ).fetchall()
        return np.asarray([row[0] for row in rows], dtype=np.int64)

    def vectors(self, labels: Sequence[int] | None = None) -> tuple[NDArray[np.int64], NDArray[np.float32]]:
        """(labels, embeddings) of the given labels, or of every chunk when None."""
        if labels is None:
            rows = self.connection.execute("SELECT label, embedding FROM chunks ORDER BY label")
            pairs = list(rows)
        else:
            pairs = []
            wanted = list(labels)
            # SQLite caps bound parameters per statement; 500 stays under every build's limit.
            for start in range(0, len(wanted), 500):
                part = wanted[start : start + 500]
                pairs.extend(
                    self.connection.execute(
                        f"SELECT label, embedding FROM chunks WHERE label IN ({','.join('?' * len(part))})",
                        part,
                    )
                )
        if not pairs:
            return np.zeros(0, dtype=np.int64), np.zeros((0, 0), dtype=np.float32)
        found = np.asarray([label for label, _ in pairs], dtype=np.int64)
        matrix = np.stack([np.frombuffer(blob, dtype=np.float32) for _, blob in pairs])
        return found, matrix

    def chunks(self, labels: Sequence[int]) -> dict[int, StoredChunk]:
        """label -> StoredChunk for the given labels (missing labels are absent)."""
        result: dict[int, StoredChunk] = {}
        wanted = list(labels)
        for start in range(0, len(wanted), 500):
            part = wanted[start : start + 500]
            for row in self.connection.execute(
                "SELECT label, chunk_id, doc_id, chunk_index, start_word, end_word, source, title, "
                f"text, metadata FROM chunks WHERE label IN ({','.join('?' * len(part))})",
                part,
            ):
                result[int(row[0])] = StoredChunk(
                    label=int(row[0]),
                    chunk_id=row[1],
                    doc_id=row[2],
                    chunk_index=row[3],
                    start_word=row[4],
                    end_word=row[5],
                    source=row[6],
                    title=row[7],
                    text=row[8],
                    metadata=json.loads(row[9]),
                )
        return result
