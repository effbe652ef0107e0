"""Chunk windows, ids and source reading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from onnxrank.retrieval.chunking import SourceDocument, chunk_document, read_source, sha256_text


def words(count: int) -> str:
    return " ".join(f"w{index}" for index in range(count))


@pytest.mark.parametrize(
    ("count", "chunk_words", "overlap", "expected"),
    [
        (10, 4, 1, [(0, 4), (3, 7), (6, 10)]),
        (4, 4, 1, [(0, 4)]),
        (5, 4, 1, [(0, 4), (3, 5)]),
        (0, 4, 1, [(0, 0)]),
        (9, 3, 0, [(0, 3), (3, 6), (6, 9)]),
    ],
)
def test_windows_cover_the_document_with_overlap(
    count: int, chunk_words: int, overlap: int, expected: list[tuple[int, int]]
) -> None:
    document = SourceDocument("doc", "Title", words(count))
    chunks = chunk_document(document, chunk_words=chunk_words, overlap_words=overlap)
    assert [(chunk.start_word, chunk.end_word) for chunk in chunks] == expected
    assert [chunk.chunk_index for chunk in chunks] == list(range(len(expected)))
    all_words = document.text.split()
    for chunk in chunks:
        assert chunk.text == " ".join(all_words[chunk.start_word : chunk.end_word])


def test_ids_follow_the_documented_hashes() -> None:
    document = SourceDocument("a.md", "T", "one two three", {"lang": "en"})
    chunk = chunk_document(document, chunk_words=400, overlap_words=80)[0]
    assert document.doc_id == sha256_text("a.md\x00" + document.content_hash)
    assert chunk.chunk_id == sha256_text(f"{document.doc_id}\x000\x00{sha256_text('one two three')}")
    changed = SourceDocument("a.md", "T", "one two three", {"lang": "de"})
    assert changed.doc_id != document.doc_id  # metadata is content too
    assert chunk.passage == "T one two three"


def test_bad_chunk_settings_are_rejected() -> None:
    document = SourceDocument("a", "", "x")
    with pytest.raises(
        ValueError, match=re.escape("overlap_words must be >= 0 and < chunk_words (4), got 4")
    ):
        chunk_document(document, chunk_words=4, overlap_words=4)
    with pytest.raises(ValueError, match=re.escape("chunk_words must be >= 1, got 0")):
        chunk_document(document, chunk_words=0, overlap_words=0)


def test_folder_source_reads_txt_and_md_with_titles(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("\n# Heading B\nbody", encoding="utf-8")
    (tmp_path / "a.txt").write_text("plain text", encoding="utf-8")
    (tmp_path / "ignored.py").write_text("x = 1", encoding="utf-8")
    documents = list(read_source(tmp_path))
    assert [(d.source_id, d.title) for d in documents] == [
        ("a.txt", "a"),
        ("sub/b.md", "Heading B"),
    ]
    assert documents[1].metadata == {"path": "sub/b.md", "suffix": ".md"}


def test_jsonl_source_and_its_errors(tmp_path: Path) -> None:
    good = tmp_path / "c.jsonl"
    good.write_text('{"id": 7, "title": "T", "text": "x", "metadata": {"k": 1}}\n\n', encoding="utf-8")
    assert list(read_source(good)) == [SourceDocument("7", "T", "x", {"k": 1})]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "no id"}\n', encoding="utf-8")
    with pytest.raises(
        ValueError,
        match=re.escape(f'{bad}:1 is not a {{"id", "title", "text", "metadata"}} record: \'id\''),
    ):
        list(read_source(bad))
    with pytest.raises(ValueError, match=re.escape(f"source {tmp_path / 'nope'} does not exist")):
        list(read_source(tmp_path / "nope"))
