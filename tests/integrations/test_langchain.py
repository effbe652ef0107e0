"""The LangChain adapters against the real langchain-core and langchain-classic packages."""

from __future__ import annotations

import asyncio
import importlib
import re
import sys
from pathlib import Path

import pytest
from integration_fixtures import QUERY, TEXTS, best_first, sigmoid_scores
from langchain_classic.retrievers.document_compressors import CrossEncoderReranker
from langchain_classic.retrievers.document_compressors.cross_encoder import BaseCrossEncoder
from langchain_core.documents import BaseDocumentCompressor, Document
from pydantic import ValidationError

from onnxrank import Reranker
from onnxrank.errors import MissingDependencyError
from onnxrank.integrations.langchain import OnnxRankCrossEncoder, OnnxRankRerank


def documents() -> list[Document]:
    return [Document(page_content=text, metadata={"source": f"doc{index}"}, id=f"id{index}")
            for index, text in enumerate(TEXTS)]


def test_compressor_keeps_top_n_copies_with_relevance_scores(fp32: Reranker) -> None:
    compressor = OnnxRankRerank(reranker=fp32, top_n=3)
    assert isinstance(compressor, BaseDocumentCompressor)
    inputs = documents()
    compressed = compressor.compress_documents(inputs, QUERY)
    expected = sigmoid_scores(fp32, QUERY, TEXTS)
    order = best_first(expected)[:3]
    assert [doc.page_content for doc in compressed] == [TEXTS[index] for index in order]
    assert [doc.id for doc in compressed] == [f"id{index}" for index in order]
    assert [doc.metadata["source"] for doc in compressed] == [f"doc{index}" for index in order]
    for doc, index in zip(compressed, order):
        assert doc.metadata["relevance_score"] == pytest.approx(expected[index], abs=1e-6)
    # copies, as CohereRerank makes them: the caller's documents are unchanged
    assert all("relevance_score" not in doc.metadata for doc in inputs)
    assert compressed[0] is not inputs[order[0]]


def test_top_n_none_returns_all_and_empty_input_returns_empty(fp32: Reranker) -> None:
    everything = OnnxRankRerank(reranker=fp32, top_n=None).compress_documents(documents(), QUERY)
    assert [doc.page_content for doc in everything] == [
        TEXTS[index] for index in best_first(sigmoid_scores(fp32, QUERY, TEXTS))]
    assert OnnxRankRerank(reranker=fp32).compress_documents([], QUERY) == []


def test_async_variant_gives_the_same_documents(fp32: Reranker) -> None:
    compressor = OnnxRankRerank(reranker=fp32, top_n=4)
    synchronous = compressor.compress_documents(documents(), QUERY)
    asynchronous = asyncio.run(compressor.acompress_documents(documents(), QUERY))
    assert asynchronous == synchronous


def test_compressor_loads_a_model_by_name(tiny_model_dir: Path) -> None:
    compressor = OnnxRankRerank(model=tiny_model_dir.name, models_dir=str(tiny_model_dir.parent),
                                top_n=1)
    assert compressor.reranker is not None
    assert len(compressor.compress_documents(documents(), QUERY)) == 1


def test_compressor_arguments_are_checked(fp32: Reranker) -> None:
    with pytest.raises(ValidationError, match=re.escape(
            "pass exactly one of reranker=Reranker.from_pretrained(...) or "
            "model='<exported model name or directory>'")):
        OnnxRankRerank()
    with pytest.raises(ValidationError, match=re.escape("top_n must be >= 1 or None, got 0")):
        OnnxRankRerank(reranker=fp32, top_n=0)
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        OnnxRankRerank(reranker=fp32, top_k=3)


def test_cross_encoder_adapter_drives_langchains_own_cross_encoder_reranker(fp32: Reranker) -> None:
    cross_encoder = OnnxRankCrossEncoder(fp32)
    assert isinstance(cross_encoder, BaseCrossEncoder)
    pairs = [(QUERY, text) for text in TEXTS]
    scores = cross_encoder.score(pairs)
    assert isinstance(scores, list) and all(isinstance(score, float) for score in scores)
    assert scores == pytest.approx(list(sigmoid_scores(fp32, QUERY, TEXTS)), abs=1e-6)
    assert cross_encoder.score([]) == []
    reranked = CrossEncoderReranker(model=cross_encoder, top_n=3).compress_documents(
        documents(), QUERY)
    ours = OnnxRankRerank(reranker=fp32, top_n=3).compress_documents(documents(), QUERY)
    assert [doc.page_content for doc in reranked] == [doc.page_content for doc in ours]


def test_cross_encoder_adapter_rejects_other_objects() -> None:
    with pytest.raises(TypeError, match=re.escape("reranker must be an onnxrank Reranker, got str")):
        OnnxRankCrossEncoder("minilm-standin")  # type: ignore[arg-type]


def test_missing_langchain_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes `import langchain_core...` fail as if it were not installed
    for name in [name for name in sys.modules if name.startswith("langchain_core")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "langchain_core", None)
    monkeypatch.delitem(sys.modules, "onnxrank.integrations.langchain")
    with pytest.raises(MissingDependencyError, match=re.escape(
            "langchain_core.documents is required for this feature but is not installed; "
            'install it with: pip install "onnxrank[langchain]"')):
        importlib.import_module("onnxrank.integrations.langchain")
