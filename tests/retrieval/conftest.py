"""Fixtures of the retrieval tests (the builders live in retrieval_fixtures.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from retrieval_fixtures import CORPUS, write_jsonl, write_model_dir

from onnxrank.retrieval import Embedder, build_index


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
