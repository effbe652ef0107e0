"""`onnxrank serve` with several models and an index, as a process (started by the bench's own
ServerProcess, so that the bench's way of starting servers is checked too), and the rules of
its --model entries and thread shares."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import httpx
import numpy as np
import pytest

from onnxrank.bench.serving import ServerProcess
from onnxrank.cli.serve_cmd import (
    ModelEntry,
    engine_threads,
    model_entries,
    read_models_file,
    split_model_entry,
    thread_shares,
)
from onnxrank.engine.embedder import Embedder
from onnxrank.engine.reranker import Reranker


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
            # float32 as its shortest decimal: reads back to the same float32, bit for bit
            np.testing.assert_array_equal(np.asarray(vectors, dtype=np.float32),
                                          bow_embed_engine.embed(["heat"]))
            assert any("ranker (rerank), bow-embedder (embedding), search on "
                       "http://127.0.0.1:" in line for line in server.tail)
            # SIGUSR1: every thread's stack (what a start that hangs reports), and it serves on
            stacks = server.stacks()
            assert any(re.match(r"(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\)",
                                line) for line in stacks), stacks
            assert any("uvicorn" in line for line in stacks), stacks
            assert client.get("/health").status_code == 200
    finally:
        assert server.stop() == 0


def test_models_file_with_fixed_threads(bow_rerank_engine: Reranker, bow_embed_engine: Embedder,
                                        tmp_path: Path) -> None:
    models_file = tmp_path / "models.toml"
    models_file.write_text(f"""
[[model]]
model = "{bow_embed_engine.model_dir}"
threads = 1

[[model]]
id = "ranker"
model = "{bow_rerank_engine.model_dir}"
""", encoding="utf-8")
    server = ServerProcess([], threads=4, batching=True, engine_options={"device": "cpu"},
                           extra_args=["--models-file", str(models_file)])
    try:
        models = httpx.get(f"{server.base_url}/v1/models", timeout=30).json()["data"]
        # The embedder keeps its 1 thread; the reranker gets what is left of --threads 4.
        assert [(model["id"], model["threads"]) for model in models] == [
            ("bow-embedder", 1), ("ranker", 3)]
    finally:
        assert server.stop() == 0


def test_models_file_errors_name_the_file_and_the_table(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    cases = [
        ("[[model]]\nmodel = \"a\"\ncores = 2\n",
         f"--models-file {path}, [[model]] number 1: unknown keys cores; allowed: id, model, "
         "threads"),
        ("[[model]]\nmodel = \"a\"\n[[model]]\nthreads = 2\n",
         f"--models-file {path}, [[model]] number 2: `model` must be a model name or directory, "
         "got None"),
        ("[[model]]\nmodel = \"a\"\nthreads = 0\n",
         f"--models-file {path}, [[model]] number 1: `threads` must be a positive integer, got 0"),
        ("model = \"a\"\n",
         f"--models-file {path} has no [[model]] table; write one per model with "
         '`model = "NAME_OR_DIR"`'),
    ]
    for text, message in cases:
        path.write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=re.escape(message)):
            read_models_file(path)
    path.write_text('[[model]]\nid = "r"\nmodel = "dir"\nthreads = 2\n', encoding="utf-8")
    assert read_models_file(path) == [ModelEntry("r", "dir", 2)]
    both = argparse.Namespace(models_file=path, model=["minilm-standin"])
    with pytest.raises(ValueError, match=re.escape(
            "give the models either with --model or in --models-file, not both")):
        model_entries(both)
    # The default --model (a string, not a command-line list) gives way to the file.
    assert model_entries(argparse.Namespace(models_file=path, model="minilm-standin")) == [
        ModelEntry("r", "dir", 2)]


def test_model_entries_and_thread_shares() -> None:
    assert split_model_entry("minilm-standin") == (None, "minilm-standin")
    assert split_model_entry("ranker=models/minilm-standin") == ("ranker", "models/minilm-standin")
    with pytest.raises(ValueError, match=re.escape(
            "--model must be MODEL or ID=MODEL with a non-empty ID and MODEL, got '=x'")):
        split_model_entry("=x")
    assert thread_shares(8, 3) == [3, 3, 2]
    assert thread_shares(2, 2) == [1, 1]
    assert thread_shares(1, 3) == [1, 1, 1]  # never 0: more engines than threads oversubscribe
    assert engine_threads([None], None, 8) == [None]  # one engine: the engine's own default
    assert engine_threads([None, None], None, 8) == [4, 4]
    assert engine_threads([1, None, None], 6, 8) == [1, 3, 2]
    assert engine_threads([4, None], 4, 8) == [4, 1]
