"""The commands run a decoder reranker of every built-in recipe: `onnxrank score`, `onnxrank query
--rerank` and the server, each with the instruction option."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from decoder_commands import index_with_reranker

from onnxrank.cli import main
from onnxrank.engine.reranker import Reranker
from onnxrank.serve import ServeConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "serve"))
from serve_helpers import running_server  # noqa: E402

pytestmark = pytest.mark.costly(10)

QUERY = "what is known about wing flutter at high speeds"
DOCUMENTS = ["The flutter of aircraft wings at transonic speeds was studied in a wind tunnel.",
             "Boundary layer transition on a flat plate.", "wings", ""]
INSTRUCTION = "Find reports on aircraft structures"
FP32 = ["--device", "cpu", "--backend", "onnxruntime", "--precision", "fp32"]


def test_score_command(recipe_model_dir: Path, recipe_fp32: Reranker, tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"id": i, "query": QUERY, "document": d}) + "\n"
                             for i, d in enumerate(DOCUMENTS)))
    output = tmp_path / "scores.jsonl"
    assert main(["score", "--input", str(pairs), "--output", str(output), "--model",
                 str(recipe_model_dir), "--instruction", INSTRUCTION, "--no-progress",
                 *FP32]) == 0
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    expected = recipe_fp32.score([(QUERY, d) for d in DOCUMENTS], instruction=INSTRUCTION)
    np.testing.assert_allclose([row["score"] for row in rows], expected, atol=1e-5, rtol=0)


def test_query_with_rerank(recipe_model_dir: Path, recipe_fp32: Reranker, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    index, models = index_with_reranker(tmp_path, recipe_model_dir, "qwen3-tiny")
    capsys.readouterr()
    assert main(["query", "heat conduction", "--index", str(index), "--models-dir", str(models),
                 "--rerank", "--model", "qwen3-tiny", "--k", "3", "--instruction", INSTRUCTION,
                 "--json", *FP32]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["reranker_model"] == recipe_fp32.spec.name
    results = payload["results"]
    assert len(results) == 3 and all(hit["reranked"] for hit in results)
    scores = [hit["rerank_score"] for hit in results]
    assert scores == sorted(scores, reverse=True)


def test_served(recipe_fp32: Reranker) -> None:
    expected = recipe_fp32.activate(recipe_fp32.score([(QUERY, d) for d in DOCUMENTS]))
    with running_server(recipe_fp32, ServeConfig(port=0)) as server:
        body = server.client.post("/v1/rerank", json={"query": QUERY,
                                                      "documents": DOCUMENTS}).json()
    assert [item["index"] for item in body["results"]] == list(np.argsort(-expected, kind="stable"))
    np.testing.assert_allclose([item["relevance_score"] for item in body["results"]],
                               np.sort(expected)[::-1], atol=1e-6, rtol=0)
