"""Stored document token vectors: written by build_index beside the chunks, kept in step on add /
update / remove, and a rerank from them equals encoding the documents fresh."""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from retrieval_fixtures import CORPUS, write_jsonl

from onnxrank.engine.embedder import Embedder
from onnxrank.engine.late_interaction import LateInteractionReranker
from onnxrank.engine.reranker import Reranker
from onnxrank.errors import IndexMismatchError
from onnxrank.rerankers.stored import StoredVectorReranker
from onnxrank.retrieval import HybridRetriever, build_index
from onnxrank.retrieval.document_vectors import (
    DocumentVectorsRecord,
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


class CountingModel(LateInteractionReranker):
    """The real late-interaction model, loaded as a user's subclass, that records every list of
    documents it is asked to encode."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.encoded: list[list[str]] = []

    def encode_documents(self, documents: Sequence[str]) -> list[NDArray[np.float32]]:
        self.encoded.append(list(documents))
        return super().encode_documents(documents)

    def encode_documents_until(self, documents: Sequence[str],
                               deadline_ms: float) -> list[NDArray[np.float32] | None]:
        self.encoded.append(list(documents))
        return super().encode_documents_until(documents, deadline_ms)


class CountingVectors(DocumentVectorStore):
    """The real stored vectors, recording every lookup."""

    def __init__(self, store: ChunkStore, record: DocumentVectorsRecord) -> None:
        super().__init__(store, record)
        self.asked: list[list[str]] = []

    def lookup(self, passages: Sequence[str]) -> list[NDArray[np.float32] | None]:
        self.asked.append(list(passages))
        return super().lookup(passages)


class RunClock:
    """A model runner and a fake time.perf_counter in one: time moves only while the model runs,
    1e-4 s per padded input token, so a deadline's cut is exact."""

    SECONDS_PER_TOKEN = 1e-4

    def __init__(self, runner: Any) -> None:
        self.runner, self.now, self.rows = runner, 0.0, 0
        self.costs: list[float] = []

    def perf_counter(self) -> float:
        return self.now

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        self.rows += feeds["input_ids"].shape[0]
        self.costs.append(self.SECONDS_PER_TOKEN * feeds["input_ids"].size)
        self.now += self.costs[-1]
        return self.runner.run(feeds)

    @property
    def info(self) -> Any:
        return self.runner.info

    @property
    def cpu_run_overhead_tokens(self) -> int:
        return int(self.runner.cpu_run_overhead_tokens)


NEW = ["a swept wing in transonic flutter", "laminar flow on a heated flat plate",
       "shock waves ahead of a blunt nose"]  # passages the index does not hold


def test_a_repeated_passage_is_scored_once(
    tmp_path: Path, corpus_file: Path, bow_embedder: Embedder, late_model_dir: Path,
    late_model: LateInteractionReranker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = CountingModel.from_dir(late_model_dir, device="cpu", threads=1)
    assert type(model) is CountingModel  # a user's subclass of the kind's class runs as itself
    build_index(corpus_file, tmp_path / "index", bow_embedder, document_vectors=late_model)
    store, vectors = stored_store(tmp_path / "index")
    indexed = list(passages(store).values())
    distinct = [indexed[0], NEW[0], indexed[1]]
    documents = [indexed[0], NEW[0], indexed[1], indexed[0], NEW[0]]
    lookups = CountingVectors(store, vectors.record)
    ranked = StoredVectorReranker(model, lookups).rerank(QUERY, documents)
    assert (lookups.asked, model.encoded) == ([distinct], [[NEW[0]]])
    scores = {item.index: item.score for item in ranked}
    alone = {item.index: item.score
             for item in StoredVectorReranker(late_model, vectors).rerank(QUERY, distinct)}
    assert [scores[index] for index in range(5)] == [alone[0], alone[1], alone[2], alone[0],
                                                      alone[1]]
    # without stored vectors, and through the engine's own deadline path, the same: each
    # distinct passage encoded once
    model.encoded.clear()
    fresh = StoredVectorReranker(model).rerank(QUERY, documents, deadline_ms=60_000)
    assert model.encoded == [distinct] and all(item.reranked for item in fresh)
    clock = RunClock(model._runner)  # counts the rows the model runs
    monkeypatch.setattr(model, "_runner", clock)
    engine = model.rerank(QUERY, documents, deadline_ms=60_000)
    assert clock.rows == 1 + len(distinct), "the engine ran a repeated document again"
    expected = late_model.score([(QUERY, document) for document in documents])
    for ranking in (fresh, engine):
        got = sorted((item.index, item.score) for item in ranking)
        np.testing.assert_allclose([score for _, score in got], expected, rtol=0, atol=1e-5)
        assert got[0][1] == got[3][1] and got[1][1] == got[4][1]
    store.close()


def test_stored_reranking_keeps_to_its_deadline(
    tmp_path: Path, corpus_file: Path, bow_embedder: Embedder, late_model_dir: Path,
    late_model: LateInteractionReranker, monkeypatch: pytest.MonkeyPatch,
) -> None:
    build_index(corpus_file, tmp_path / "index", bow_embedder, document_vectors=late_model)
    store, vectors = stored_store(tmp_path / "index")
    indexed = list(passages(store).values())
    # one document per run and no padding rounding: a run costs exactly its row's tokens
    model = Reranker.from_dir(late_model_dir, device="cpu", threads=1, max_batch_size=1,
                              pad_to_multiple=1)
    assert isinstance(model, LateInteractionReranker)
    clock = RunClock(model._runner)
    monkeypatch.setattr(model, "_runner", clock)
    monkeypatch.setattr("onnxrank.engine.deadline.time", clock)
    monkeypatch.setattr("onnxrank.rerankers.stored.time", clock)
    model.encode_queries([QUERY])
    model.encode_documents_until(NEW, 1e9)  # input order, one run each
    query_cost, *document_costs = clock.costs
    documents = [indexed[0], NEW[0], indexed[1], NEW[1], NEW[2], NEW[0]]
    reranker = StoredVectorReranker(model, vectors)
    full = {item.index: item.score for item in reranker.rerank(QUERY, documents)}
    # time for the query, the first two new passages and half of the third: the stored ones
    # and those two are scored, the third is not, and the repeat takes its first's score
    deadline_ms = (query_cost + sum(document_costs[:2]) + document_costs[2] / 2) * 1000
    ranked = reranker.rerank(QUERY, documents, deadline_ms=deadline_ms)
    scored = [item for item in ranked if item.reranked]
    assert sorted(item.index for item in scored) == [0, 1, 2, 3, 5]
    assert [item.score for item in scored] == sorted((full[item.index] for item in scored),
                                                     reverse=True)
    assert [(item.index, item.reranked) for item in ranked[5:]] == [(4, False)]
    assert math.isnan(ranked[5].score)
    # spent on the query alone: nothing is scored, everything keeps the input order
    late = reranker.rerank(QUERY, documents, deadline_ms=query_cost * 1000 / 2)
    assert [(item.index, item.reranked) for item in late] == [(index, False) for index in range(6)]
    store.close()


def test_late_interaction_scores_come_from_the_cache(late_model_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cached = Reranker.from_dir(late_model_dir, device="cpu", threads=1, cache_size=16)
    clock = RunClock(cached._runner)
    monkeypatch.setattr(cached, "_runner", clock)
    pairs = [(QUERY, text) for text in NEW[:2]]
    first = cached.score_detailed(pairs)
    runs = len(clock.costs)
    again = cached.score_detailed(pairs)
    assert len(clock.costs) == runs, "a cached pair ran the model again"
    np.testing.assert_array_equal(again.scores, first.scores)
    assert again.token_counts.tolist() == [0, 0] and first.token_counts.min() > 0
    # a new pair beside a cached one runs only what it needs: its query and its document
    mixed = cached.score([(QUERY, NEW[2]), pairs[1]])
    assert len(clock.costs) == runs + 2 and mixed[1] == first.scores[1]
    uncached = Reranker.from_dir(late_model_dir, device="cpu", threads=1)
    np.testing.assert_allclose(mixed, uncached.score([(QUERY, NEW[2]), pairs[1]]), rtol=0,
                               atol=1e-5)
