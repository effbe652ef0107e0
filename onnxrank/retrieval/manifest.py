"""The index manifest: which embedder and settings built an index, and what it holds.

Stored inside the database (meta key ``manifest``, so it commits with the data) and mirrored to
``manifest.json`` in the index directory for people and tools.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from onnxrank.errors import IndexMismatchError, RetrievalError

logger = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
INDEX_FORMAT = 1


@dataclass(frozen=True, slots=True)
class EmbedderRecord:
    """The embedder an index was built with."""

    name: str
    manifest_hash: str  # ModelSpec.manifest_hash() of the embedder
    variant: str  # the manifest variant that ran (fp32 / opt / int8 / fp16 / ov_int8)
    path: str  # where it was loaded from, to reload it for queries
    dim: int
    # What queries pass to Embedder.from_dir to run the same arithmetic (indexes written before
    # these fields existed hold "" and reload with precision=variant on the default backend).
    backend: str = ""
    precision: str = ""

    def load_options(self) -> dict[str, Any]:
        """The EngineConfig overrides that reload the embedder the index was built with."""
        if not self.precision:
            return {"precision": self.variant}
        return {"backend": self.backend, "precision": self.precision}


def embedder_record_options(backend: str, variant: str, precision: str) -> tuple[str, str]:
    """(backend, precision) to request so that a reload runs what ran: the variant's name on
    onnxruntime (fp32, opt, int8, fp16), the arithmetic on OpenVINO (its variants are ov_*)."""
    return backend, precision if backend == "openvino" else variant


@dataclass(frozen=True, slots=True)
class IndexManifest:
    """What built an index: embedder, chunking and HNSW settings, stored document vectors, and
    its current counts."""

    embedder: EmbedderRecord
    chunk_words: int
    overlap_words: int
    hnsw: dict[str, int]
    documents: int = 0
    chunks: int = 0
    source: str = ""
    updated_at: str = ""
    format_version: int = INDEX_FORMAT
    # The late-interaction model whose token vectors the index stores (DocumentVectorsRecord's
    # dict), None when it stores none.
    document_vectors: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> IndexManifest:
        """Parse a stored manifest.

        Raises:
            RetrievalError: Malformed or from an unknown format version.
        """
        try:
            fields = dict(data)
            fields["embedder"] = EmbedderRecord(**fields["embedder"])
            manifest = cls(**fields)
        except (KeyError, TypeError) as err:
            raise RetrievalError(f"malformed index manifest: {err}; rebuild the index") from err
        if manifest.format_version != INDEX_FORMAT:
            raise RetrievalError(
                f"index format {manifest.format_version} is not supported (this onnxrank reads "
                f"format {INDEX_FORMAT}); rebuild the index with `onnxrank index`"
            )
        return manifest

    def check_embedder(self, manifest_hash: str, name: str) -> None:
        """Refuse an embedder other than the one that built the index.

        Raises:
            IndexMismatchError: The hashes differ.
        """
        if manifest_hash != self.embedder.manifest_hash:
            raise IndexMismatchError(
                f"this index was built with embedder {self.embedder.name!r} (manifest hash "
                f"{self.embedder.manifest_hash[:12]}…) but embedder {name!r} (manifest hash "
                f"{manifest_hash[:12]}…) was given; query with the same embedder "
                f"(--embedder {self.embedder.path}) or rebuild the index into a new directory"
            )


def write_manifest_mirror(manifest: IndexManifest, index_dir: Path) -> None:
    """Write manifest.json atomically (temporary file, then rename)."""
    temporary = index_dir / (MANIFEST_NAME + ".tmp")
    temporary.write_text(json.dumps(manifest.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(temporary, index_dir / MANIFEST_NAME)
