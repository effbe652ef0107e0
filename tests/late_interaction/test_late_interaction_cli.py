"""`onnxrank score`, `onnxrank query --rerank` and `onnxrank serve` run a late-interaction
export, each giving the engine's own scores."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from onnxrank.bench.serving import ServerProcess
from onnxrank.cli import main
from onnxrank.engine.reranker import Reranker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "decoder"))
from decoder_commands import index_with_reranker  # noqa: E402

pytestmark = pytest.mark.costly(15)

QUERY = "what is known about wing flutter at high speeds?"
DOCUMENTS = ["The flutter of aircraft wings at transonic speeds was studied in a wind tunnel.",
             "Boundary layer transition on a flat plate.", "wings", ""]
FP32 = ["--device", "cpu", "--backend", "onnxruntime", "--precision", "fp32"]


@pytest.fixture(scope="module")
def engine(bert_model_dir: Path) -> Reranker:
    return Reranker.from_dir(bert_model_dir, device="cpu", backend="onnxruntime",
                             precision="fp32")


def test_score_command(bert_model_dir: Path, engine: Reranker, tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"id": i, "query": QUERY, "document": document}) + "\n"
                             for i, document in enumerate(DOCUMENTS)))
    output = tmp_path / "scores.jsonl"
    assert main(["score", "--input", str(pairs), "--output", str(output), "--model",
                 str(bert_model_dir), "--no-progress", *FP32]) == 0
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    np.testing.assert_allclose([row["score"] for row in rows],
                               engine.score([(QUERY, document) for document in DOCUMENTS]),
                               atol=1e-5, rtol=0)


def test_query_with_rerank(bert_model_dir: Path, engine: Reranker, tmp_path: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    index, models = index_with_reranker(tmp_path, bert_model_dir, "colbert-tiny")
    capsys.readouterr()
    assert main(["query", "heat conduction", "--index", str(index), "--models-dir", str(models),
                 "--rerank", "--model", "colbert-tiny", "--k", "3", "--json", *FP32]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert len(results) == 3 and all(hit["reranked"] for hit in results)
    # what the index reranks is each chunk's passage: its title, then its text
    expected = engine.score([("heat conduction", f"{hit['title']} {hit['text']}".strip())
                             for hit in results])
    np.testing.assert_allclose([hit["rerank_score"] for hit in results], expected, atol=1e-5,
                               rtol=0)
    assert list(expected) == sorted(expected, reverse=True)


def test_served(bert_model_dir: Path, engine: Reranker) -> None:
    expected = engine.score([(QUERY, document) for document in DOCUMENTS])
    server = ServerProcess([bert_model_dir], threads=1, batching=True,
                           engine_options={"device": "cpu", "precision": "fp32"})
    try:
        with httpx.Client(base_url=server.base_url, timeout=30) as client:
            body = client.post("/v1/rerank", json={"query": QUERY,
                                                   "documents": DOCUMENTS}).json()
    finally:
        assert server.stop() == 0
    assert [item["index"] for item in body["results"]] == list(np.argsort(-expected,
                                                                          kind="stable"))
    np.testing.assert_allclose([item["relevance_score"] for item in body["results"]],
                               np.sort(expected)[::-1], atol=1e-5, rtol=0)
