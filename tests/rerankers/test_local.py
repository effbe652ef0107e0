"""The local backend: lazy load (once, under a lock), agreement with the engine, degradation."""

from __future__ import annotations

import logging
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from onnxrank import Reranker
from onnxrank.rerankers import LocalReranker, as_backend, make_reranker

QUERY = "heat conduction"
DOCUMENTS = ["heat conduction in slabs", "compilers", "conduction of heat in rods", "wing lift"]


def test_agrees_with_the_engine_and_names_itself(bow_reranker_dir: Path) -> None:
    engine = Reranker.from_dir(bow_reranker_dir, device="cpu", threads=1)
    backend = LocalReranker(bow_reranker_dir)
    assert backend.relevance_trained is None  # not loaded yet
    ranked = backend.rerank(QUERY, DOCUMENTS, top_k=3)
    expected = engine.rerank(QUERY, DOCUMENTS, top_k=3)
    assert [(d.index, d.score, d.text, d.reranked) for d in ranked] == [
        (d.index, d.score, d.text, d.reranked) for d in expected
    ]
    assert {document.backend for document in ranked} == {"local"}
    assert backend.relevance_trained is False and backend.model == "bow-reranker"
    assert list(backend.score([(QUERY, DOCUMENTS[0])])) == list(engine.score([(QUERY, DOCUMENTS[0])]))


def test_concurrent_first_calls_load_once(bow_reranker_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loads = []
    original = Reranker.from_dir.__func__  # type: ignore[attr-defined]

    def counting(cls: type, *args: object, **kwargs: object) -> Reranker:
        loads.append(1)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(Reranker, "from_dir", classmethod(counting))
    backend = LocalReranker(bow_reranker_dir)
    barrier = threading.Barrier(8)

    def call() -> list[int]:
        barrier.wait(timeout=30)
        return [document.index for document in backend.rerank(QUERY, DOCUMENTS)]

    with ThreadPoolExecutor(max_workers=8) as pool:
        orders = [future.result(timeout=60) for future in [pool.submit(call) for _ in range(8)]]
    assert len(loads) == 1
    assert len({tuple(order) for order in orders}) == 1


def test_a_missing_model_degrades_with_one_warning_and_is_not_reloaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = LocalReranker("absent", models_dir=tmp_path)
    with caplog.at_level(logging.INFO, logger="onnxrank.rerankers"):
        first = backend.rerank(QUERY, DOCUMENTS, top_k=2)
        (tmp_path / "absent").mkdir()  # a later call does not retry the load
        second = backend.rerank(QUERY, DOCUMENTS)
    assert [d.index for d in first] == [0, 1] and [d.index for d in second] == [0, 1, 2, 3]
    assert all(not d.reranked and math.isnan(d.score) and d.backend == "local" for d in first + second)
    assert [record.levelname for record in caplog.records].count("WARNING") == 1


def test_names_and_wrapping(bow_reranker_dir: Path) -> None:
    assert make_reranker("none").name == "none"
    assert isinstance(make_reranker("local", model=bow_reranker_dir), LocalReranker)
    engine = Reranker.from_dir(bow_reranker_dir, device="cpu", threads=1)
    wrapped = as_backend(engine)
    assert isinstance(wrapped, LocalReranker) and wrapped.load() is engine
    backend = make_reranker("none")
    assert as_backend(backend) is backend
    with pytest.raises(ValueError, match="reranker must be one of local, cohere, llm, none, got 'bm25'"):
        make_reranker("bm25")
    with pytest.raises(ValueError, match="the llm reranker needs a chat model name"):
        make_reranker("llm")
