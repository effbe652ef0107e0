"""Reading a source (folder of .txt/.md files or a JSONL file) and cutting documents into chunks."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

TEXT_SUFFIXES = (".txt", ".md")


def sha256_text(text: str) -> str:
    """Hex sha256 of a string's UTF-8 bytes."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class SourceDocument:
    """One document as read from the source, before chunking."""

    source_id: str  # relative file path for folders, the record's "id" for JSONL
    title: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def content_hash(self) -> str:
        """Hash of everything that ends up in the index (title, text, metadata)."""
        payload = json.dumps([self.title, self.text, self.metadata], sort_keys=True, ensure_ascii=False)
        return sha256_text(payload)

    @property
    def doc_id(self) -> str:
        """sha256 of source id + content hash: a changed document gets a new id."""
        return sha256_text(self.source_id + "\x00" + self.content_hash)


@dataclass(frozen=True, slots=True)
class Chunk:
    """A window of a document's words, the unit that is indexed and retrieved."""

    chunk_id: str
    doc_id: str
    chunk_index: int
    start_word: int  # inclusive
    end_word: int  # exclusive
    source: str
    title: str
    text: str
    metadata: dict[str, Any]

    @property
    def passage(self) -> str:
        """Text given to the embedder and the reranker: title and chunk text (titles carry meaning
        for short records such as CACM, where half the documents have no abstract)."""
        return f"{self.title} {self.text}".strip() if self.title else self.text


def chunk_document(document: SourceDocument, *, chunk_words: int, overlap_words: int) -> list[Chunk]:
    """Cut a document into windows of `chunk_words` words; neighbours share `overlap_words`.

    A document of at most `chunk_words` words is one chunk (so document-level judgments apply to
    short collections). An empty document is one empty chunk, so its title stays searchable.

    Args:
        document: The document to cut.
        chunk_words: Words per chunk, e.g. 400 (about 520 MiniLM tokens).
        overlap_words: Words shared by consecutive chunks, e.g. 80; must be < chunk_words.

    Returns:
        The chunks in document order.

    Raises:
        ValueError: chunk_words < 1 or overlap_words outside [0, chunk_words).
    """
    if chunk_words < 1:
        raise ValueError(f"chunk_words must be >= 1, got {chunk_words}")
    if not 0 <= overlap_words < chunk_words:
        raise ValueError(f"overlap_words must be >= 0 and < chunk_words ({chunk_words}), got {overlap_words}")
    words = document.text.split()
    doc_id = document.doc_id
    step = chunk_words - overlap_words
    starts = list(range(0, max(len(words) - overlap_words, 1), step))
    chunks = []
    for chunk_index, start in enumerate(starts):
        end = min(start + chunk_words, len(words))
        text = " ".join(words[start:end])
        chunk_id = sha256_text(f"{doc_id}\x00{chunk_index}\x00{sha256_text(text)}")
        chunks.append(
            Chunk(
                chunk_id=chunk_id,
                doc_id=doc_id,
                chunk_index=chunk_index,
                start_word=start,
                end_word=end,
                source=document.source_id,
                title=document.title,
                text=text,
                metadata=document.metadata,
            )
        )
    return chunks


def read_source(path: str | Path) -> Iterator[SourceDocument]:
    """Yield the documents of a folder of .txt/.md files or of a JSONL file.

    1. A folder: every .txt/.md file below it (sorted), source id = path relative to the folder,
       title = first Markdown heading or the file stem, metadata = {"path", "suffix"}.
    2. A .jsonl file: one {"id", "title", "text", "metadata"} record per line (title and metadata
       optional).

    Raises:
        ValueError: The path does not exist, is another kind of file, or a JSONL line is malformed.
    """
    source = Path(path)
    if source.is_dir():
        yield from _read_folder(source)
    elif source.is_file() and source.suffix == ".jsonl":
        yield from _read_jsonl(source)
    elif not source.exists():
        raise ValueError(f"source {source} does not exist; pass a folder of .txt/.md files or a .jsonl file")
    else:
        raise ValueError(
            f"source {source} is neither a folder nor a .jsonl file; "
            'pass a folder of .txt/.md files or a .jsonl file of {"id", "title", "text"} records'
        )


def _read_folder(folder: Path) -> Iterator[SourceDocument]:
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    for file in files:
        text = file.read_text(encoding="utf-8", errors="replace")
        relative = file.relative_to(folder).as_posix()
        yield SourceDocument(
            source_id=relative,
            title=_markdown_title(text) or file.stem,
            text=text,
            metadata={"path": relative, "suffix": file.suffix.lower()},
        )


def _markdown_title(text: str) -> str:
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            return stripped.lstrip("#").strip()
        if stripped:
            return ""
    return ""


def _read_jsonl(file: Path) -> Iterator[SourceDocument]:
    with open(file, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                yield SourceDocument(
                    source_id=str(record["id"]),
                    title=str(record.get("title") or ""),
                    text=str(record.get("text") or ""),
                    metadata=dict(record.get("metadata") or {}),
                )
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(
                    f'{file}:{line_number} is not a {{"id", "title", "text", "metadata"}} record: {err}'
                ) from err
