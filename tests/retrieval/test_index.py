"""Indexing: incremental updates, reconcile, embedder mismatch, and crash safety."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from retrieval_fixtures import CORPUS, write_jsonl, write_model_dir

from onnxrank.engine.embedder import Embedder
from onnxrank.errors import IndexMismatchError
from onnxrank.retrieval import HybridRetriever, build_index
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
import sys
import numpy as np
from onnxrank.engine.embedder import Embedder
from onnxrank.retrieval import build_index

KILL_POINT = sys.argv[4]  # "between": before the 5th transaction; "inside": within it
COMMITTED_BEFORE_KILL = 4


class BlockingVectors(np.ndarray):
    # store.apply reads one row per chunk inside its transaction; the third read blocks.
    def __getitem__(self, key):
        if isinstance(key, int) and key == 2:
            pause()
        return super().__getitem__(key)


def pause():
    # Tell the parent where we are, then wait to be killed (the parent never answers).
    sys.stdout.write("paused\\n")
    sys.stdout.flush()
    sys.stdin.read()
    raise SystemExit("the parent closed stdin instead of killing this run")


class PausingEmbedder(Embedder):
    calls = 0

    def embed(self, texts, *, show_progress=False):
        PausingEmbedder.calls += 1
        vectors = super().embed(texts, show_progress=show_progress)
        if PausingEmbedder.calls == COMMITTED_BEFORE_KILL + 1:
            if KILL_POINT == "between":
                pause()
            return vectors.view(BlockingVectors)
        return vectors


embedder = PausingEmbedder.from_dir(sys.argv[1], device="cpu", threads=1)
build_index(sys.argv[2], sys.argv[3], embedder, chunks_per_transaction=4)
"""


@pytest.mark.parametrize("kill_point", ["between", "inside"])
def test_killed_indexing_run_leaves_a_consistent_index_and_resumes(
    tmp_path: Path, bow_embedder_dir: Path, bow_embedder: Embedder, kill_point: str
) -> None:
    records = [
        {"id": f"d{i}", "title": f"Doc {i}", "text": f"topic{i} shared words number {i}"} for i in range(60)
    ]
    source = write_jsonl(tmp_path / "big.jsonl", records)
    index = tmp_path / "crash-index"
    script = tmp_path / "crash.py"
    script.write_text(CRASH_SCRIPT)
    process = subprocess.Popen(
        [sys.executable, str(script), str(bow_embedder_dir), str(source), str(index), kill_point],
        cwd=Path(__file__).parents[2],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # The child writes one line when it reaches the kill point, then blocks on stdin; EOF
        # here means it exited first (the assertion below then shows how).
        assert process.stdout is not None
        signal_line = process.stdout.readline()
        assert signal_line == "paused\n", f"the indexing run exited early ({process.wait(timeout=30)})"
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait(timeout=30)
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()
    assert process.returncode == -signal.SIGKILL
    assert not (index / "manifest.json").exists()  # the run never reached its end

    # Four transactions of four documents committed; the fifth never did, killed before it began
    # or inside it.
    partial = consistent_sides(index, bow_embedder)
    assert partial == {f"d{i}" for i in range(16)}

    report = build_index(source, index, bow_embedder)
    assert report.unchanged == len(partial)
    assert report.added == 60 - len(partial)
    assert consistent_sides(index, bow_embedder) == {record["id"] for record in records}
