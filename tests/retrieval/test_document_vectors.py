"""Stored document token vectors: written by build_index beside the chunks, kept in step on add /
update / remove, and a rerank from them equals encoding the documents fresh."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from retrieval_fixtures import CORPUS, write_jsonl

from onnxrank.engine.embedder import Embedder
from onnxrank.engine.late_interaction import LateInteractionReranker
from onnxrank.engine.reranker import Reranker
from onnxrank.errors import IndexMismatchError
from onnxrank.rerankers.stored import StoredVectorReranker
from onnxrank.retrieval import HybridRetriever, build_index
from onnxrank.retrieval.document_vectors import (
    DocumentVectorStore,
    dequantize,
    open_document_vectors,
    quantize,
)
from onnxrank.retrieval.store import ChunkStore

pytestmark = pytest.mark.costly(20)

QUERY = "heat transfer in a hypersonic flow"


def error_bound(precision: str, query_rows: int, dim: int) -> float:
    """The most a score can move when unit document vectors are stored in `precision`: each
    query row's best dot product moves by at most the norm of a vector's rounding error, 2**-11
    for fp16 (a relative half-ulp per value) and sqrt(dim) / 254 for int8 (half a step of
    max|x| / 127 per value)."""
    per_row = {"fp16": 2.0 ** -11, "int8": dim ** 0.5 / 254}[precision]
    return query_rows * per_row


def stored_store(index_dir: Path) -> tuple[ChunkStore, DocumentVectorStore]:
    store = ChunkStore(index_dir)
    vectors = open_document_vectors(store)
    assert vectors is not None, f"{index_dir} records no document vectors"
    return store, vectors


def passages(store: ChunkStore) -> dict[int, str]:
    labels = [int(label) for label in store.labels()]
    return {label: chunk.passage for label, chunk in store.chunks(labels).items()}


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_stored_vectors_score_like_fresh_ones(
    precision: str, tmp_path: Path, corpus_file: Path, bow_embedder: Embedder,
    late_model: LateInteractionReranker,
) -> None:
    report = build_index(corpus_file, tmp_path / "index", bow_embedder, document_vectors=late_model,
                         vector_precision=precision)  # type: ignore[arg-type]
    store, vectors = stored_store(tmp_path / "index")
    texts = list(passages(store).values())
    stored = vectors.lookup(texts)
    fresh = late_model.encode_documents(texts)
    assert all(item is not None for item in stored), "a chunk has no stored vectors"
    # bytes: what the precision says per vector (int8: one byte a value and a float32 scale)
    rows = sum(len(item) for item in fresh)
    per_vector = {"fp16": 2 * late_model.settings.dim, "int8": late_model.settings.dim + 4}[precision]
    assert (report.vector_chunks, report.vector_rows, report.vector_bytes) == (
        len(texts), rows, rows * per_vector)
    expected = late_model.score([(QUERY, text) for text in texts])
    ranked = StoredVectorReranker(late_model, vectors).rerank(QUERY, texts)
    got = np.asarray([item.score for item in sorted(ranked, key=lambda item: item.index)])
    # exactly the fresh vectors through the precision's round trip...
    rounded = [dequantize(*quantize(item, precision), len(item), late_model.settings.dim, precision)
               for item in fresh]
    np.testing.assert_allclose(got, late_model.score_vectors(QUERY, rounded), rtol=0, atol=1e-5)
    # ...which moves a score by no more than the precision's bound
    query_rows = len(late_model.encode_queries([QUERY])[0])
    bound = error_bound(precision, query_rows, late_model.settings.dim)
    assert np.abs(got - expected).max() <= bound, (
        f"{precision}: stored {got} against fresh {expected}, bound {bound}")
    store.close()


def test_search_reranks_from_the_index(
    index_dir: Path, tmp_path: Path, corpus_file: Path, bow_embedder: Embedder,
    late_model: LateInteractionReranker,
) -> None:
    build_index(corpus_file, tmp_path / "vectors", bow_embedder, document_vectors=late_model)
    retriever = HybridRetriever.open(tmp_path / "vectors", embedder=bow_embedder)
    vectors = open_document_vectors(retriever.store)
    result = retriever.search_detailed(QUERY, k=4, rerank=True,
                                       reranker=StoredVectorReranker(late_model, vectors))
    assert [hit.reranker for hit in result.hits] == ["stored_vectors"] * 4
    fresh = late_model.score([(QUERY, f"{hit.title} {hit.text}") for hit in result.hits])
    query_rows = len(late_model.encode_queries([QUERY])[0])
    np.testing.assert_allclose([hit.rerank_score for hit in result.hits], fresh, rtol=0,
                               atol=error_bound("fp16", query_rows, late_model.settings.dim))
    retriever.close()


def test_vectors_follow_add_update_and_remove(
    tmp_path: Path, bow_embedder: Embedder, late_model: LateInteractionReranker,
) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for record in CORPUS[:4]:
        (folder / f"{record['id']}.md").write_text(f"# {record['title']}\n{record['text']}\n")
    index_dir = tmp_path / "index"
    build_index(folder, index_dir, bow_embedder, document_vectors=late_model)
    (folder / "heat.md").unlink()  # removed
    (folder / "wing.md").write_text("# Wing in a slipstream\nflutter of a swept wing at high speed\n")
    for record in CORPUS[4:]:  # added
        (folder / f"{record['id']}.md").write_text(f"# {record['title']}\n{record['text']}\n")
    report = build_index(folder, index_dir, bow_embedder, document_vectors=late_model)
    assert (report.added, report.updated, report.removed) == (2, 1, 1)
    store, vectors = stored_store(index_dir)
    chunks = passages(store)
    stored_labels = [label for (label,) in store.connection.execute(
        "SELECT label FROM document_vectors ORDER BY label")]
    assert stored_labels == sorted(chunks), "stored vectors and chunks are out of step"
    assert vectors.missing_labels() == []
    texts = list(chunks.values())
    for text, stored, fresh in zip(texts, vectors.lookup(texts), late_model.encode_documents(texts)):
        assert stored is not None and stored.shape == fresh.shape, text
        np.testing.assert_allclose(stored, fresh, rtol=0, atol=2e-3, err_msg=text)
    old = "Wing in a slipstream experimental study of a wing in a propeller slipstream and the lift increase"
    assert vectors.lookup([old]) == [None], "the replaced chunk's vectors were kept"
    store.close()


def test_other_model_or_precision_is_refused(
    tmp_path: Path, corpus_file: Path, bow_embedder: Embedder, late_model_dir: Path,
    late_model: LateInteractionReranker,
) -> None:
    index_dir = tmp_path / "index"
    build_index(corpus_file, index_dir, bow_embedder, document_vectors=late_model)
    other_dir = tmp_path / "other-colbert"
    shutil.copytree(late_model_dir, other_dir)
    manifest = json.loads((other_dir / "manifest.json").read_text())
    manifest["name"] = "other-colbert"
    (other_dir / "manifest.json").write_text(json.dumps(manifest))
    other = Reranker.from_dir(other_dir, device="cpu", threads=1)
    assert isinstance(other, LateInteractionReranker)
    stored = late_model.spec.manifest_hash()[:12]
    given = other.spec.manifest_hash()[:12]
    message = (
        f"this index stores document vectors of {late_model.spec.name!r} (manifest hash {stored}…) "
        f"but late-interaction model 'other-colbert' (manifest hash {given}…) was given; use the "
        f"same model (--document-vectors {late_model_dir.resolve()}) or rebuild the index into a "
        "new directory")
    with pytest.raises(IndexMismatchError, match=re.escape(message)):
        build_index(corpus_file, index_dir, bow_embedder, document_vectors=other)
    store, vectors = stored_store(index_dir)
    with pytest.raises(IndexMismatchError, match=re.escape(message)):
        StoredVectorReranker(other, vectors)
    store.close()
    with pytest.raises(IndexMismatchError, match=re.escape(
            f"index {index_dir} stores document vectors in fp16; got vector precision int8; use "
            "--vector-precision fp16 or a new --index directory")):
        build_index(corpus_file, index_dir, bow_embedder, document_vectors=late_model,
                    vector_precision="int8")


def test_vectors_added_to_an_existing_index_cover_every_chunk(
    index_dir: Path, corpus_file: Path, bow_embedder: Embedder, late_model: LateInteractionReranker,
) -> None:
    report = build_index(corpus_file, index_dir, bow_embedder, document_vectors=late_model)
    assert report.unchanged == len(CORPUS) and report.vector_chunks == report.chunks
    write_jsonl(corpus_file, CORPUS + [{"id": "new", "title": "New", "text": "a swept wing"}])
    report = build_index(corpus_file, index_dir, bow_embedder)  # without the model: no vectors
    store, vectors = stored_store(index_dir)
    assert (report.vector_chunks, len(vectors.missing_labels())) == (report.chunks - 1, 1)
    store.close()
