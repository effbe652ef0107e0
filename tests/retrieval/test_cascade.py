"""The cascade backend: stages of real tiny models (late interaction, then a cross-encoder), each
keeping its top-n, under one latency budget; through the API, HybridRetriever and the CLI."""

from __future__ import annotations

import json
import math
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from retrieval_fixtures import CORPUS

from onnxrank.cli import main
from onnxrank.engine.embedder import Embedder
from onnxrank.engine.late_interaction import LateInteractionReranker
from onnxrank.engine.ranking import RankedDocument
from onnxrank.engine.reranker import Reranker
from onnxrank.rerankers import LocalReranker, NoReranker
from onnxrank.rerankers.cascade import (
    CascadeRankedDocument,
    CascadeReranker,
    CascadeStage,
    build_cascade,
    parse_stages,
)
from onnxrank.rerankers.stored import StoredVectorReranker
from onnxrank.retrieval import HybridRetriever
from onnxrank.retrieval.document_vectors import open_document_vectors

pytestmark = pytest.mark.costly(15)

QUERY = "heat transfer in a hypersonic flow"
DOCUMENTS = [f"{record['title']} {record['text']}" for record in CORPUS]


class SlowStage:
    """A real backend that first spends `sleep_ms` of the budget (a stage slower than it)."""

    def __init__(self, backend: LocalReranker, sleep_ms: float) -> None:
        self.backend = backend
        self.sleep_ms = sleep_ms
        self.name = backend.name

    def rerank(self, query: str, documents: Sequence[str], *, top_k: int | None = None,
               deadline_ms: float | None = None) -> list[RankedDocument]:
        time.sleep(self.sleep_ms / 1000)
        return self.backend.rerank(query, documents, top_k=top_k)


@pytest.fixture(scope="module")
def cross(bow_reranker_dir: Path) -> Reranker:
    return Reranker.from_dir(bow_reranker_dir, device="cpu", threads=1)


def test_each_stage_reranks_what_the_last_one_kept(
    late_model: LateInteractionReranker, cross: Reranker,
) -> None:
    late_scores = late_model.score([(QUERY, document) for document in DOCUMENTS])
    late_order = list(np.argsort(-late_scores, kind="stable"))
    kept = late_order[:3]
    cross_scores = cross.activate(cross.score([(QUERY, DOCUMENTS[index]) for index in kept]))
    expected = [kept[position] for position in np.argsort(-cross_scores, kind="stable")] + late_order[3:]
    cascade = CascadeReranker([CascadeStage(StoredVectorReranker(late_model), keep=3),
                               CascadeStage(LocalReranker(cross))])
    result = cascade.rerank_detailed(QUERY, DOCUMENTS)
    assert [item.index for item in result.documents] == expected
    assert [(run.backend, run.candidates, run.scored, run.skipped) for run in result.stages] == [
        ("stored_vectors", 6, 6, False), ("local", 3, 3, False)]
    documents = result.documents
    assert all(isinstance(item, CascadeRankedDocument) and item.reranked for item in documents)
    assert [item.stage for item in documents] == [1, 1, 1, 0, 0, 0]  # type: ignore[attr-defined]
    np.testing.assert_allclose([item.score for item in documents[:3]], np.sort(cross_scores)[::-1],
                               rtol=0, atol=1e-6)
    np.testing.assert_allclose([item.score for item in documents[3:]],
                               late_scores[late_order[3:]], rtol=0, atol=1e-5)
    assert [item.index for item in cascade.rerank(QUERY, DOCUMENTS, top_k=2)] == expected[:2]


def test_one_stage_without_keep_is_that_backend(cross: Reranker) -> None:
    alone = LocalReranker(cross).rerank(QUERY, DOCUMENTS)
    cascaded = CascadeReranker([CascadeStage(LocalReranker(cross), keep=2)]).rerank(QUERY, DOCUMENTS)
    assert [(item.index, item.score) for item in cascaded] == [(item.index, item.score) for item in alone]


def test_a_zero_budget_keeps_the_input_order_flagged(late_model: LateInteractionReranker,
                                                    cross: Reranker) -> None:
    cascade = CascadeReranker([CascadeStage(StoredVectorReranker(late_model), keep=3),
                               CascadeStage(LocalReranker(cross))], budget_ms=0)
    result = cascade.rerank_detailed(QUERY, DOCUMENTS)
    assert [item.index for item in result.documents] == list(range(len(DOCUMENTS)))
    assert not any(item.reranked for item in result.documents)
    assert all(math.isnan(item.score) for item in result.documents)
    assert [run.skipped for run in result.stages] == [True, True]


def test_a_spent_budget_keeps_the_earlier_stage_order(cross: Reranker,
                                                      late_model: LateInteractionReranker) -> None:
    first = SlowStage(LocalReranker(cross), sleep_ms=60)
    cascade = CascadeReranker([CascadeStage(first, keep=3),
                               CascadeStage(StoredVectorReranker(late_model))], budget_ms=30)
    result = cascade.rerank_detailed(QUERY, DOCUMENTS)
    alone = LocalReranker(cross).rerank(QUERY, DOCUMENTS)
    assert [item.index for item in result.documents] == [item.index for item in alone]
    assert [(run.candidates, run.skipped) for run in result.stages] == [(6, False), (0, True)]
    assert {item.stage for item in result.documents} == {0}  # type: ignore[attr-defined]
    # the caller's deadline caps the cascade's budget the same way
    unbounded = CascadeReranker(cascade.stages)
    assert [run.skipped for run in unbounded.rerank_detailed(
        QUERY, DOCUMENTS, deadline_ms=30).stages] == [False, True]


def test_an_unscoring_stage_passes_the_order_on(cross: Reranker) -> None:
    result = CascadeReranker([CascadeStage(NoReranker(), keep=2), CascadeStage(LocalReranker(cross))]
                             ).rerank_detailed(QUERY, DOCUMENTS)
    # `none` scores nothing, so nothing goes on: every document keeps the input order
    assert [item.index for item in result.documents] == list(range(len(DOCUMENTS)))
    assert [(run.scored, run.candidates) for run in result.stages] == [(0, 6), (0, 0)]


def test_bad_settings_are_refused(cross: Reranker) -> None:
    with pytest.raises(ValueError, match=re.escape("a cascade needs at least one stage, got none")):
        CascadeReranker([])
    with pytest.raises(TypeError, match=re.escape("stages[0] must be a CascadeStage, got LocalReranker")):
        CascadeReranker([LocalReranker(cross)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=re.escape(
            "a cascade stage's keep must be a positive int or None, got 0")):
        CascadeStage(LocalReranker(cross), keep=0)
    with pytest.raises(TypeError, match=re.escape("a cascade stage needs a RerankBackend, got str")):
        CascadeStage("local")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("budget_ms must be >= 0 or None, got -1")):
        CascadeReranker([CascadeStage(LocalReranker(cross))], budget_ms=-1)
    with pytest.raises(ValueError, match=re.escape(
            "a cascade stage's KEEP must be a positive integer, got 'x' in 'colbert:x,minilm'")):
        parse_stages("colbert:x,minilm")
    with pytest.raises(ValueError, match=re.escape(
            "--cascade needs MODEL[:KEEP] stages separated by commas, got 'colbert:5,'")):
        parse_stages("colbert:5,")
    assert parse_stages("models/colbert:50, minilm") == [("models/colbert", 50), ("minilm", None)]


def test_search_and_cli_use_the_stored_vectors(
    tmp_path: Path, corpus_file: Path, bow_embedder: Embedder, bow_embedder_dir: Path,
    bow_reranker_dir: Path, late_model_dir: Path, late_model: LateInteractionReranker,
    capsys: pytest.CaptureFixture[str],
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name, target in [("minilm-embedder", bow_embedder_dir), ("minilm-standin", bow_reranker_dir),
                         ("colbert", late_model_dir)]:
        (models / name).symlink_to(target)
    index = tmp_path / "index"
    assert main(["index", "--source", str(corpus_file), "--index", str(index), "--models-dir",
                 str(models), "--document-vectors", "colbert", "--vector-precision", "int8",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"stored document vectors: 6 chunks, \d+ vectors, \d+ bytes", out), out
    retriever = HybridRetriever.open(index, embedder=bow_embedder)
    cascade = build_cascade(parse_stages("colbert:3,minilm-standin"), models_dir=models,
                            document_vectors=open_document_vectors(retriever.store))
    assert isinstance(cascade.stages[0].backend, StoredVectorReranker)
    assert cascade.stages[0].backend.vectors is not None
    result = retriever.search_detailed(QUERY, k=6, rerank=True, reranker=cascade, rerank_top_n=6)
    expected = cascade.rerank(QUERY, [f"{hit.title} {hit.text}" for hit in result.hits])
    retriever.close()
    assert result.reranker == "cascade"
    assert [item.index for item in expected] == list(range(6))  # the search kept the cascade order
    assert main(["query", QUERY, "--index", str(index), "--models-dir", str(models), "--cascade",
                 "colbert:3,minilm-standin", "--rerank-top-n", "6", "--k", "6", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["reranker"] == "cascade"
    assert [hit["chunk_id"] for hit in payload["results"]] == [hit.chunk_id for hit in result.hits]


def test_server_search_runs_the_cascade(
    tmp_path: Path, corpus_file: Path, bow_embedder: Embedder, late_model: LateInteractionReranker,
    cross: Reranker,
) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
    from serve_helpers import running_server

    from onnxrank.retrieval import build_index
    from onnxrank.serve import ServeConfig

    build_index(corpus_file, tmp_path / "index", bow_embedder, document_vectors=late_model)
    retriever = HybridRetriever.open(tmp_path / "index", embedder=bow_embedder)
    library = CascadeReranker([
        CascadeStage(StoredVectorReranker(late_model, open_document_vectors(retriever.store)), keep=3),
        CascadeStage(LocalReranker(cross))])
    expected = retriever.search_detailed(QUERY, k=5, rerank=True, reranker=library, rerank_top_n=6)
    body = {"query": QUERY, "k": 5, "rerank": True, "rerank_top_n": 6,
            "cascade": [{"model": "colbert", "keep": 3}, {"model": "ranker"}]}
    models = {"colbert": late_model, "ranker": cross, "embedder": bow_embedder}
    try:
        with running_server(models, ServeConfig(), retriever=retriever) as server:
            answer = server.client.post("/v1/search", json=body)
            bad = server.client.post("/v1/search", json={**body, "cascade": [{"model": "ranker",
                                                                              "keep": 0}]})
            alone = server.client.post("/v1/search", json={**body, "cascade": None, "model": "ranker"})
    finally:
        retriever.close()
    assert answer.status_code == 200, answer.text
    payload = answer.json()
    assert payload["reranker"] == "cascade"
    assert [hit["chunk_id"] for hit in payload["results"]] == [hit.chunk_id for hit in expected.hits]
    np.testing.assert_allclose([hit["rerank_score"] for hit in payload["results"]],
                               [hit.rerank_score for hit in expected.hits], rtol=0, atol=1e-5)
    assert bad.status_code == 422 and "each stage of field `cascade` must be" in bad.text
    assert alone.status_code == 200 and alone.json()["reranker"] != "cascade"
