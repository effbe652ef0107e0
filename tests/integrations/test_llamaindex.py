"""The LlamaIndex node postprocessor against the real llama-index-core package."""

from __future__ import annotations

import asyncio
import importlib
import re
import sys
from pathlib import Path

import pytest
from integration_fixtures import QUERY, TEXTS, best_first, sigmoid_scores
from llama_index.core.callbacks import CallbackManager, CBEventType, LlamaDebugHandler
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from onnxrank import Reranker
from onnxrank.errors import MissingDependencyError
from onnxrank.integrations.llamaindex import OnnxRankRerank


def nodes() -> list[NodeWithScore]:
    return [NodeWithScore(node=TextNode(text=text, id_=f"n{index}"), score=1.0 - index / 10)
            for index, text in enumerate(TEXTS)]


def test_top_n_nodes_best_first_with_activated_scores(fp32: Reranker) -> None:
    postprocessor = OnnxRankRerank(top_n=3, reranker=fp32)
    assert isinstance(postprocessor, BaseNodePostprocessor)
    inputs = nodes()
    result = postprocessor.postprocess_nodes(inputs, query_str=QUERY)
    expected = sigmoid_scores(fp32, QUERY, TEXTS)
    order = best_first(expected)[:3]
    assert [item.node.node_id for item in result] == [f"n{index}" for index in order]
    assert [item.score for item in result] == pytest.approx([expected[i] for i in order], abs=1e-6)
    # the caller's NodeWithScore objects keep their retrieval scores
    assert [item.score for item in inputs] == [1.0 - index / 10 for index in range(len(TEXTS))]


def test_keep_retrieval_score_copies_it_into_metadata(fp32: Reranker) -> None:
    inputs = nodes()
    result = OnnxRankRerank(top_n=2, reranker=fp32, keep_retrieval_score=True).postprocess_nodes(
        inputs, QueryBundle(QUERY))
    for item in result:
        index = int(item.node.node_id[1:])
        assert item.node.metadata["retrieval_score"] == pytest.approx(1.0 - index / 10)
    assert all("retrieval_score" not in item.node.metadata for item in inputs)


def test_edge_cases_follow_llamaindex_rerankers(fp32: Reranker) -> None:
    postprocessor = OnnxRankRerank(reranker=fp32)
    assert postprocessor.top_n == 2  # SentenceTransformerRerank's default
    assert postprocessor.postprocess_nodes([], query_str=QUERY) == []
    with pytest.raises(ValueError, match=re.escape("Missing query bundle in extra info.")):
        postprocessor.postprocess_nodes(nodes())
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        OnnxRankRerank(top_n=0, reranker=fp32)
    with pytest.raises(ValueError, match=re.escape(
            "pass model='<exported model name or directory>' or reranker=Reranker.from_pretrained(...)")):
        OnnxRankRerank()


def test_reranking_event_reaches_the_callback_manager(fp32: Reranker) -> None:
    debug = LlamaDebugHandler()
    postprocessor = OnnxRankRerank(top_n=2, reranker=fp32)
    postprocessor.callback_manager = CallbackManager([debug])
    postprocessor.postprocess_nodes(nodes(), query_str=QUERY)
    events = debug.get_event_pairs(CBEventType.RERANKING)
    assert len(events) == 1
    assert events[0][0].payload["query_str"] == QUERY


def test_async_and_loading_by_name(tiny_model_dir: Path, fp32: Reranker) -> None:
    by_name = OnnxRankRerank(top_n=3, model=tiny_model_dir.name, models_dir=tiny_model_dir.parent)
    synchronous = by_name.postprocess_nodes(nodes(), query_str=QUERY)
    asynchronous = asyncio.run(by_name.apostprocess_nodes(nodes(), query_str=QUERY))
    assert [(item.node.node_id, item.score) for item in asynchronous] == [
        (item.node.node_id, item.score) for item in synchronous]
    assert by_name.model == tiny_model_dir.name


def test_missing_llama_index_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in sys.modules if name.startswith("llama_index")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "llama_index", None)
    monkeypatch.delitem(sys.modules, "onnxrank.integrations.llamaindex")
    with pytest.raises(MissingDependencyError, match=re.escape(
            "llama_index.core.postprocessor.types is required for this feature but is not "
            'installed; install it with: pip install "onnxrank[llamaindex]"')):
        importlib.import_module("onnxrank.integrations.llamaindex")
