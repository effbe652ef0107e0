"""Dense retrieval: an hnswlib cosine index over the chunk embeddings, stored next to the database.

The file is a cache of the embeddings stored in the database: it is written to a temporary file
and renamed into place, together with a small JSON sidecar naming the database generation it
reflects. When the generation differs (a killed run, a hand-edited database) the index is rebuilt
from the database on open.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from onnxrank._optional import require
from onnxrank.retrieval.store import ChangeSet, ChunkStore

if TYPE_CHECKING:
    import hnswlib

logger = logging.getLogger(__name__)

HNSW_NAME = "dense.hnsw"
SIDECAR_NAME = "dense.json"
# Below this many allowed chunks a filtered query scores them all exactly (a matrix product over
# a few thousand rows costs well under a millisecond and never misses), instead of steering HNSW
# with a filter callable that has to visit many rejected nodes.
BRUTE_FORCE_MAX_ALLOWED = 4096


@dataclass(frozen=True, slots=True)
class HnswSettings:
    """hnswlib parameters. Defaults measured with MiniLM embeddings on Cranfield (1,400 chunks) and
    CACM (3,204), as recall of the exact top 100 (docs/retrieval.md, "HNSW settings").

    M: links per node, fixed at creation; 16 links cost 16 x 2 x 4 = 128 bytes per chunk on top
        of the 1,536-byte vector (384 dims). M=8 loses 0.8-1.3 points of recall at ef_search 200.
    ef_construction: build beam, fixed at creation; 200 builds 3,204 chunks in 0.36 s (100: 0.22 s)
        for +0.1 point of recall.
    ef_search: query beam, set once when the index is opened (hnswlib searches with
        max(ef_search, k), so a deeper query widens its own beam); 200 finds 99.9 % of the
        exact top 100 in 0.14-0.25 ms, against 99.4-99.6 % in 0.10-0.18 ms for 128. Embedding
        the query (10-15 ms) dominates either way.
    """

    M: int = 16
    ef_construction: int = 200
    ef_search: int = 200

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"hnsw {name} must be a positive int, got {value!r}")


class DenseIndex:
    """hnswlib index whose labels are the database's chunk labels."""

    def __init__(
        self, index: hnswlib.Index, dim: int, settings: HnswSettings, generation: int, count: int
    ) -> None:
        self._index = index
        # Fixed here and never changed per query: set_ef on a shared index races with searches
        # in other threads (hnswlib widens the beam to k by itself: it searches with max(ef, k)).
        self._index.set_ef(settings.ef_search)
        self.dim = dim
        self.settings = settings
        self.generation = generation
        # Live elements; hnswlib's own count includes deleted slots.
        self.count = count

    @classmethod
    def build(cls, store: ChunkStore, dim: int, settings: HnswSettings) -> DenseIndex:
        """A fresh index holding every embedding in the database."""
        hnswlib_module = require("hnswlib", extra="dense")
        labels, vectors = store.vectors()
        index = hnswlib_module.Index(space="cosine", dim=dim)
        index.init_index(
            max_elements=max(len(labels), 1024),
            M=settings.M,
            ef_construction=settings.ef_construction,
            random_seed=100,
            allow_replace_deleted=True,
        )
        dense = cls(index, dim, settings, store.generation, 0)
        if len(labels):
            dense.add(labels, vectors)
        return dense

    @classmethod
    def open(cls, store: ChunkStore, dim: int, settings: HnswSettings) -> DenseIndex:
        """Load the index file, or rebuild it from the database when missing or stale.

        1. File and sidecar present, sidecar generation == database generation: load it.
        2. Otherwise: rebuild from the embeddings in the database and save it (logged as a warning
           when a file existed, since that means an interrupted run or an outside edit).
        """
        path = store.index_dir / HNSW_NAME
        sidecar = _read_sidecar(store.index_dir / SIDECAR_NAME)
        generation = store.generation
        if (
            path.exists()
            and sidecar.get("generation") == generation
            and sidecar.get("dim") == dim
            and isinstance(sidecar.get("count"), int)
        ):
            hnswlib_module = require("hnswlib", extra="dense")
            index = hnswlib_module.Index(space="cosine", dim=dim)
            index.load_index(str(path), allow_replace_deleted=True)
            return cls(index, dim, settings, generation, sidecar["count"])
        if path.exists() or sidecar:
            logger.warning(
                "dense index in %s reflects database generation %s but the database is at %s; "
                "rebuilding it from the %d stored embeddings",
                store.index_dir,
                sidecar.get("generation"),
                generation,
                store.count_chunks(),
            )
        dense = cls.build(store, dim, settings)
        dense.save(store.index_dir)
        return dense

    def add(self, labels: NDArray[np.int64] | list[int], vectors: NDArray[np.float32]) -> None:
        """Insert vectors under the given labels (reusing the slots of deleted elements)."""
        if len(labels) == 0:
            return
        needed = int(self._index.get_current_count()) + len(labels)
        if needed > self._index.get_max_elements():
            self._index.resize_index(max(needed, 2 * self._index.get_max_elements()))
        # One thread: the graph then depends only on insertion order, so builds are repeatable.
        self._index.add_items(
            np.asarray(vectors, dtype=np.float32),
            np.asarray(labels, dtype=np.int64),
            num_threads=1,
            replace_deleted=True,
        )
        self.count += len(labels)

    def remove(self, labels: list[int]) -> None:
        """Mark labels deleted (their slots are reused by later inserts)."""
        for label in labels:
            self._index.mark_deleted(int(label))
        self.count -= len(labels)

    def apply(self, change: ChangeSet) -> None:
        """Mirror one committed database transaction (removals first, then additions)."""
        self.remove(change.removed_labels)
        self.add(change.added_labels, change.added_vectors)
        self.generation = change.generation

    def search(
        self,
        vector: NDArray[np.float32],
        *,
        depth: int,
        store: ChunkStore,
        allowed: NDArray[np.int64] | None = None,
    ) -> list[tuple[int, float]]:
        """Nearest chunks by cosine similarity: ``(label, similarity)`` best first.

        1. No filter: HNSW search (hnswlib's beam: max(ef_search, depth)).
        2. A filter allowing at most BRUTE_FORCE_MAX_ALLOWED chunks: exact scoring of those
           chunks' embeddings from `store`.
        3. A larger allowed set: HNSW search with a label filter callable.
        4. When hnswlib cannot return `depth` live neighbours (it raises), exact scoring.
        """
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if allowed is not None and len(allowed) <= BRUTE_FORCE_MAX_ALLOWED:
            return exact_search(store, query, depth=depth, labels=allowed)
        limit = min(depth, self.count if allowed is None else min(self.count, len(allowed)))
        if limit < 1:
            return []
        keywords: dict[str, Any] = {"k": limit, "num_threads": 1}
        if allowed is not None:
            keywords["filter"] = set(allowed.tolist()).__contains__
        try:
            labels, distances = self._index.knn_query(query.reshape(1, -1), **keywords)
        except RuntimeError:
            logger.info("hnswlib returned fewer than %d neighbours; scoring exactly", limit)
            return exact_search(store, query, depth=depth, labels=allowed)
        return [
            (int(label), 1.0 - float(distance))
            for label, distance in zip(labels[0], distances[0], strict=True)
        ]

    def save(self, index_dir: Path) -> None:
        """Write the index and its sidecar atomically (temporary file, fsync, rename)."""
        path = index_dir / HNSW_NAME
        temporary = index_dir / (HNSW_NAME + ".tmp")
        self._index.save_index(str(temporary))
        _fsync(temporary)
        os.replace(temporary, path)
        sidecar = {
            "generation": self.generation,
            "dim": self.dim,
            "count": self.count,
            **asdict(self.settings),
        }
        temporary_sidecar = index_dir / (SIDECAR_NAME + ".tmp")
        temporary_sidecar.write_text(json.dumps(sidecar, indent=2) + "\n", encoding="utf-8")
        _fsync(temporary_sidecar)
        os.replace(temporary_sidecar, index_dir / SIDECAR_NAME)


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def _read_sidecar(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def exact_search(
    store: ChunkStore,
    query: NDArray[np.float32],
    *,
    depth: int,
    labels: NDArray[np.int64] | None = None,
) -> list[tuple[int, float]]:
    """Exact cosine search over stored embeddings (all chunks, or only `labels`), best first."""
    found, matrix = store.vectors(None if labels is None else labels.tolist())
    if len(found) == 0 or depth < 1:
        return []
    similarities = matrix @ query
    top = min(depth, len(found))
    # argpartition then sort only the top: O(n + k log k) instead of a full sort.
    best = np.argpartition(-similarities, top - 1)[:top]
    best = best[np.lexsort((found[best], -similarities[best]))]
    return [(int(found[i]), float(similarities[i])) for i in best]
