"""Fixtures of the retrieval tests (the builders live in retrieval_fixtures.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from built_once import built_once
from retrieval_fixtures import CORPUS, write_jsonl, write_model_dir

import onnxrank.retrieval.hybrid as hybrid_module
from onnxrank.engine.embedder import Embedder
from onnxrank.engine.late_interaction import LateInteractionReranker
from onnxrank.engine.reranker import Reranker
from onnxrank.retrieval import HybridRetriever, build_index


@pytest.fixture(scope="session")
def bow_embedder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(
        tmp_path_factory.mktemp("models") / "bow-embedder", task="embedding", name="bow-embedder"
    )


@pytest.fixture(scope="session")
def bow_reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(
        tmp_path_factory.mktemp("models") / "bow-reranker", task="rerank", name="bow-reranker"
    )


@pytest.fixture(scope="session")
def bow_embedder(bow_embedder_dir: Path) -> Embedder:
    return Embedder.from_dir(bow_embedder_dir, device="cpu", threads=1)


@pytest.fixture()
def corpus_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", CORPUS)


@pytest.fixture()
def index_dir(tmp_path: Path, corpus_file: Path, bow_embedder: Embedder) -> Path:
    directory = tmp_path / "index"
    build_index(corpus_file, directory, bow_embedder)
    return directory


@pytest.fixture()
def load_events(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records, in order, every model load and every timed search stage (the real functions run)."""
    events: list[str] = []

    def spy(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            events.append(name)
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(Embedder, "from_dir", classmethod(spy("load embedder", Embedder.from_dir.__func__)))
    monkeypatch.setattr(
        Reranker, "from_pretrained", classmethod(spy("load reranker", Reranker.from_pretrained.__func__))
    )
    monkeypatch.setattr(hybrid_module, "search_lexical", spy("lexical stage", hybrid_module.search_lexical))
    monkeypatch.setattr(HybridRetriever, "_search_dense", spy("dense stage", HybridRetriever._search_dense))
    monkeypatch.setattr(HybridRetriever, "_rerank", spy("rerank stage", HybridRetriever._rerank))
    return events



@pytest.fixture(scope="session")
def late_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny PyLate-layout BERT ColBERT ([unused0]/[unused1] markers, punctuation skiplist),
    fp32 only, exported with the real CLI once per run."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "late_interaction"))
    from colbert_checkpoints import build_pylate_bert

    from onnxrank.cli import main

    source = built_once(tmp_path_factory, "colbert-checkpoints/pylate_bert", build_pylate_bert)

    def export(out_dir: Path) -> None:
        code = main(["export", "--model", str(source), "--out", str(out_dir), "--variants", "fp32",
                     "--validation-pairs", "16", "--quiet"])
        if code != 0:
            raise RuntimeError(f"onnxrank export of {source} exited with {code}")

    return built_once(tmp_path_factory, "colbert-models/pylate_bert-fp32", export)


@pytest.fixture(scope="session")
def late_model(late_model_dir: Path) -> LateInteractionReranker:
    model = Reranker.from_dir(late_model_dir, device="cpu", threads=1)
    assert isinstance(model, LateInteractionReranker)
    return model
