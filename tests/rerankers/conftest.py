"""Fixtures of the reranker backend tests: fake endpoints on 127.0.0.1, stopped after each test."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_servers import FakeServer

# The tiny bag-of-words models and corpus of the retrieval tests (tests/retrieval/retrieval_fixtures.py).
sys.path.insert(0, str(Path(__file__).parents[1] / "retrieval"))


@pytest.fixture()
def cohere_server() -> Iterator[FakeServer]:
    server = FakeServer("cohere").start()
    yield server
    server.stop()


@pytest.fixture()
def chat_server() -> Iterator[FakeServer]:
    server = FakeServer("chat").start()
    yield server
    server.stop()


@pytest.fixture()
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(autouse=True)
def no_cohere_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("COHERE_API_KEY", "CO_API_KEY", "CO_API_URL"):
        monkeypatch.delenv(variable, raising=False)


@pytest.fixture(scope="session")
def bow_reranker_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from retrieval_fixtures import write_model_dir

    directory = tmp_path_factory.mktemp("models") / "bow-reranker"
    return write_model_dir(directory, task="rerank", name="bow-reranker")


@pytest.fixture(scope="session")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from retrieval_fixtures import CORPUS, write_jsonl, write_model_dir

    from onnxrank.engine.embedder import Embedder
    from onnxrank.retrieval import build_index

    root = tmp_path_factory.mktemp("search")
    embedder_dir = write_model_dir(root / "bow-embedder", task="embedding", name="bow-embedder")
    build_index(write_jsonl(root / "corpus.jsonl", CORPUS), root / "index",
                Embedder.from_dir(embedder_dir, device="cpu", threads=1))
    return root / "index"
