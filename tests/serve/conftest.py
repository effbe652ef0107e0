"""Fixtures of the server tests: the tiny model's fp32 engine and a default server over it; a
reranker, an embedder and an index served by one process."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from child_process import in_child_process
from serve_helpers import RunningServer, running_server

from onnxrank.engine.embedder import Embedder
from onnxrank.engine.reranker import Reranker
from onnxrank.retrieval import HybridRetriever, build_index
from onnxrank.serve import ServeConfig


@pytest.fixture(scope="session")
def fp32_reranker(tiny_model_dir: Path) -> Reranker:
    """The tiny model's fp32 variant: batch mates change its scores by float rounding only."""
    return Reranker.from_dir(tiny_model_dir, device="cpu", precision="fp32", threads=1)


@pytest.fixture(scope="module")
def server(fp32_reranker: Reranker) -> Iterator[RunningServer]:
    """A default server over the fp32 engine."""
    with running_server(fp32_reranker, ServeConfig(port=0)) as running:
        yield running


# --- the RAG server: a bag-of-words reranker and embedder, and an index built with the embedder --
# (tests/retrieval's builders: real ONNX model directories, built without torch in a second)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "retrieval"))
from retrieval_fixtures import CORPUS, write_jsonl, write_model_dir  # noqa: E402

RERANK_ID, EMBED_ID = "ranker", "embedder"


@pytest.fixture(scope="session")
def bow_rerank_engine(tmp_path_factory: pytest.TempPathFactory) -> Reranker:
    directory = write_model_dir(tmp_path_factory.mktemp("serve-models") / "bow-reranker",
                                task="rerank", name="bow-reranker")
    return Reranker.from_dir(directory, device="cpu", threads=1)


@pytest.fixture(scope="session")
def bow_embed_engine(tmp_path_factory: pytest.TempPathFactory) -> Embedder:
    directory = write_model_dir(tmp_path_factory.mktemp("serve-models") / "bow-embedder",
                                task="embedding", name="bow-embedder")
    return Embedder.from_dir(directory, device="cpu", threads=1)


@pytest.fixture(scope="session")
def rag_index(tmp_path_factory: pytest.TempPathFactory, bow_embed_engine: Embedder) -> Path:
    """An index of the retrieval tests' corpus, built with the served embedder."""
    root = tmp_path_factory.mktemp("serve-index")
    build_index(write_jsonl(root / "corpus.jsonl", CORPUS), root / "index", bow_embed_engine)
    return root / "index"


@pytest.fixture(scope="module")
def retriever(rag_index: Path, bow_embed_engine: Embedder) -> Iterator[HybridRetriever]:
    opened = HybridRetriever.open(rag_index, embedder=bow_embed_engine)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture(scope="module")
def rag_server(bow_rerank_engine: Reranker, bow_embed_engine: Embedder,
               retriever: HybridRetriever) -> Iterator[RunningServer]:
    """One process serving a reranker and an embedder, and search over the index."""
    engines = {RERANK_ID: bow_rerank_engine, EMBED_ID: bow_embed_engine}
    with running_server(engines, ServeConfig(port=0), retriever=retriever) as running:
        yield running


# --- a decoder reranker (tests/decoder's tiny Qwen3 checkpoint), exported with its fp32 variant only --
DECODER_MAX_LENGTH = 320  # the tiny tokenizer spends about 180 tokens on the recipe's fixed text


@pytest.fixture(scope="session")
def decoder_reranker(tmp_path_factory: pytest.TempPathFactory) -> Reranker:
    """`onnxrank export --model DIR --recipe qwen3-reranker --variants fp32`, loaded in fp32."""
    import os

    from onnxrank.cli import main
    from onnxrank.export.decoder_standin import build_decoder_checkpoint

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    checkpoint = tmp_path_factory.mktemp("serve-checkpoints") / "qwen3-tiny"
    build_decoder_checkpoint(checkpoint, size="tiny", seed=0)
    out = tmp_path_factory.mktemp("serve-models") / "qwen3-tiny-reranker"
    code = in_child_process(main, ["export", "--model", str(checkpoint), "--recipe",
                                   "qwen3-reranker", "--out", str(out), "--max-length",
                                   str(DECODER_MAX_LENGTH), "--variants", "fp32",
                                   "--validation-pairs", "16", "--quiet"])
    assert code == 0, "the decoder export failed (see the captured stderr)"
    return Reranker.from_dir(out, device="cpu", backend="onnxruntime", precision="fp32",
                             threads=1)
