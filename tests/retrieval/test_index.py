"""Indexing: incremental updates, reconcile, embedder mismatch, and crash safety."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from retrieval_fixtures import CORPUS, write_jsonl, write_model_dir

from onnxrank.errors import IndexMismatchError
from onnxrank.retrieval import Embedder, HybridRetriever, build_index
from onnxrank.retrieval.store import ChunkStore


def consistent_sides(index_dir: Path, embedder: Embedder) -> set[str]:
    """Check FTS5, chunk table and HNSW agree; return the stored source ids."""
    retriever = HybridRetriever.open(index_dir, embedder=embedder)
    store = retriever.store
    try:
        store.connection.execute("INSERT INTO chunks_fts (chunks_fts) VALUES ('integrity-check')")
        labels = set(store.labels().tolist())
        fts_rows = {row[0] for row in store.connection.execute("SELECT rowid FROM chunks_fts")}
        assert fts_rows == labels
        dense_labels = {
            label
            for label, _ in retriever.dense.search(
                embedder.embed(["anything"])[0], depth=len(labels) + 5, store=store
            )
        }
        assert dense_labels == labels
        assert retriever.dense.count == len(labels)
        per_doc = store.connection.execute(
            "SELECT d.chunk_count, count(c.label) FROM documents d "
            "LEFT JOIN chunks c ON c.doc_id = d.doc_id GROUP BY d.source_id"
        ).fetchall()
        assert all(expected == found for expected, found in per_doc)  # whole documents only
        return set(store.document_hashes())
    finally:
        retriever.close()


def test_rerun_is_incremental_and_reconciles(tmp_path: Path, bow_embedder: Embedder) -> None:
    source = write_jsonl(tmp_path / "c.jsonl", CORPUS)
    first = build_index(source, tmp_path / "i", bow_embedder)
    assert (first.added, first.unchanged, first.documents, first.chunks) == (6, 0, 6, 6)
    again = build_index(source, tmp_path / "i", bow_embedder)
    assert (again.added, again.updated, again.unchanged, again.removed) == (0, 0, 6, 0)

    changed = [dict(record) for record in CORPUS if record["id"] != "compiler"]
    changed[0]["text"] = "a rewritten abstract about rotor blades"
    changed.append({"id": "new", "title": "New", "text": "quantum annealing schedules"})
    write_jsonl(source, changed)
    # JSONL sources do not reconcile by default: "compiler" stays.
    report = build_index(source, tmp_path / "i", bow_embedder)
    assert (report.added, report.updated, report.unchanged, report.removed) == (1, 1, 4, 0)
    assert "compiler" in consistent_sides(tmp_path / "i", bow_embedder)
    report = build_index(source, tmp_path / "i", bow_embedder, reconcile=True)
    assert (report.added, report.updated, report.unchanged, report.removed) == (0, 0, 6, 1)
    assert consistent_sides(tmp_path / "i", bow_embedder) == {r["id"] for r in changed}

    retriever = HybridRetriever.open(tmp_path / "i", embedder=bow_embedder)
    try:
        for mode in ("lexical", "vector"):
            sources = [
                hit.source for hit in retriever.search("propeller slipstream compilers", k=10, mode=mode)
            ]
            assert "compiler" not in sources
        assert retriever.search("rotor blades", k=1, mode="lexical")[0].source == "wing"
    finally:
        retriever.close()
    manifest = json.loads((tmp_path / "i" / "manifest.json").read_text())
    assert (manifest["documents"], manifest["chunks"]) == (6, 6)
    assert manifest["embedder"]["manifest_hash"] == bow_embedder.spec.manifest_hash()


def test_folder_sources_reconcile_by_default(tmp_path: Path, bow_embedder: Embedder) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for record in CORPUS[:3]:
        (folder / f"{record['id']}.md").write_text(f"# {record['title']}\n{record['text']}\n")
    build_index(folder, tmp_path / "i", bow_embedder, chunk_words=8, overlap_words=2)
    (folder / "heat.md").unlink()
    report = build_index(folder, tmp_path / "i", bow_embedder, chunk_words=8, overlap_words=2)
    assert (report.removed, report.unchanged, report.documents) == (1, 2, 2)
    assert report.chunks > report.documents  # chunked: 8-word windows
    assert consistent_sides(tmp_path / "i", bow_embedder) == {"wing.md", "shear.md"}


def test_other_embedder_or_settings_are_refused(
    tmp_path: Path, bow_embedder: Embedder, index_dir: Path
) -> None:
    other_dir = write_model_dir(tmp_path / "other", task="embedding", name="other-embedder")
    other = Embedder.from_dir(other_dir, device="cpu")
    expected_hash = bow_embedder.spec.manifest_hash()[:12]
    message = (
        f"this index was built with embedder 'bow-embedder' (manifest hash {expected_hash}…) but "
        f"embedder 'other-embedder' (manifest hash {other.spec.manifest_hash()[:12]}…) was given; "
        "query with the same embedder"
    )
    with pytest.raises(IndexMismatchError, match=re.escape(message)):
        HybridRetriever.open(index_dir, embedder=other)
    with pytest.raises(IndexMismatchError, match=re.escape(message)):
        build_index(tmp_path / "corpus.jsonl", index_dir, other)
    with pytest.raises(
        IndexMismatchError,
        match=re.escape(
            f"index {index_dir} was built with chunk_words=400, overlap_words=80; got "
            "chunk_words=200, overlap_words=80; use the index's settings or a new --index directory"
        ),
    ):
        build_index(tmp_path / "corpus.jsonl", index_dir, bow_embedder, chunk_words=200)


def test_stale_hnsw_file_is_rebuilt_from_the_database(
    index_dir: Path, bow_embedder: Embedder, caplog: pytest.LogCaptureFixture
) -> None:
    store = ChunkStore(index_dir)
    store.apply([], np.zeros((0, 32), dtype=np.float32), remove_sources=["heat"])
    store.close()
    with caplog.at_level("WARNING"):
        assert "heat" not in consistent_sides(index_dir, bow_embedder)
    assert "rebuilding it from the 5 stored embeddings" in caplog.text


CRASH_SCRIPT = """
import sys, time
from onnxrank.retrieval import Embedder, build_index

class SlowEmbedder(Embedder):
    # Slows each commit so the parent can kill the run between transactions or inside one.
    def embed(self, texts, *, show_progress=False):
        time.sleep(0.15)
        return super().embed(texts, show_progress=show_progress)

embedder = SlowEmbedder.from_dir(sys.argv[1], device="cpu", threads=1)
build_index(sys.argv[2], sys.argv[3], embedder, chunks_per_transaction=4)
"""


def test_killed_indexing_run_leaves_a_consistent_index_and_resumes(
    tmp_path: Path, bow_embedder_dir: Path, bow_embedder: Embedder
) -> None:
    records = [
        {"id": f"d{i}", "title": f"Doc {i}", "text": f"topic{i} shared words number {i}"} for i in range(60)
    ]
    source = write_jsonl(tmp_path / "big.jsonl", records)
    index = tmp_path / "crash-index"
    script = tmp_path / "crash.py"
    script.write_text(CRASH_SCRIPT)
    process = subprocess.Popen(
        [sys.executable, str(script), str(bow_embedder_dir), str(source), str(index)],
        cwd=Path(__file__).parents[2],
    )
    try:
        deadline = time.monotonic() + 60
        generation = 0
        while generation < 4 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.02)
            try:
                connection = sqlite3.connect(f"file:{index / 'index.sqlite'}?mode=ro", uri=True)
                row = connection.execute("SELECT value FROM meta WHERE key='generation'").fetchone()
                connection.close()
                generation = int(row[0]) if row else 0
            except sqlite3.Error:
                generation = 0
        assert process.poll() is None, "the indexing run finished before it could be killed"
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    assert not (index / "manifest.json").exists()  # the run never reached its end

    partial = consistent_sides(index, bow_embedder)
    assert 4 <= len(partial) < 60

    report = build_index(source, index, bow_embedder)
    assert report.unchanged == len(partial)
    assert report.added == 60 - len(partial)
    assert consistent_sides(index, bow_embedder) == {record["id"] for record in records}
