"""`onnxrank serve` with several models and an index, as a process (started by the bench's own
ServerProcess, so that the bench's way of starting servers is checked too), and the rules of
its --model entries and thread shares."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from onnxrank.bench.serving import ServerProcess
from onnxrank.cli.serve_cmd import split_model_entry, thread_shares
from onnxrank.engine.reranker import Reranker
from onnxrank.retrieval import Embedder


def test_two_models_and_an_index_from_the_command_line(bow_rerank_engine: Reranker,
                                                       bow_embed_engine: Embedder,
                                                       rag_index: Path) -> None:
    entries = ["--model", f"ranker={bow_rerank_engine.model_dir}",
               "--model", str(bow_embed_engine.model_dir)]
    server = ServerProcess([], threads=3, batching=True, index=rag_index,
                           engine_options={"device": "cpu"}, extra_args=entries)
    try:
        with httpx.Client(base_url=server.base_url, timeout=30) as client:
            models = client.get("/v1/models").json()["data"]
            # 3 threads between two models (the embedder built the index: no third engine).
            assert [(model["id"], model["task"], model["threads"]) for model in models] == [
                ("ranker", "rerank", 2), ("bow-embedder", "embedding", 1)]
            found = client.post("/v1/search", json={"query": "heat conduction", "k": 2,
                                                    "rerank": True}).json()
            assert found["reranker"] == "local" and len(found["results"]) == 2
            vectors = client.post("/embed", json={"inputs": ["heat"]}).json()
            assert vectors == bow_embed_engine.embed(["heat"]).tolist()
    finally:
        assert server.stop() == 0
    assert any("ranker (rerank), bow-embedder (embedding), search on http://127.0.0.1:" in line
               for line in server.tail)


def test_model_entries_and_thread_shares() -> None:
    assert split_model_entry("minilm-standin") == (None, "minilm-standin")
    assert split_model_entry("ranker=models/minilm-standin") == ("ranker", "models/minilm-standin")
    with pytest.raises(ValueError, match=re.escape(
            "--model must be MODEL or ID=MODEL with a non-empty ID and MODEL, got '=x'")):
        split_model_entry("=x")
    assert thread_shares(8, 3) == [3, 3, 2]
    assert thread_shares(2, 2) == [1, 1]
    assert thread_shares(1, 3) == [1, 1, 1]  # never 0: more engines than threads oversubscribe
