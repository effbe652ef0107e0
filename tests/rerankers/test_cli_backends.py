"""`onnxrank query` and `onnxrank eval` with the remote backends, against fake endpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_servers import FakeServer, overlap_score

from onnxrank.cli import main

QUERY = "heat transfer flow"


def test_query_with_the_cohere_backend(
    index_dir: Path, cohere_server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["query", QUERY, "--index", str(index_dir), "--k", "6", "--json"]
    assert main(base) == 0
    fused = json.loads(capsys.readouterr().out)["results"]
    argv = [*base, "--reranker", "cohere", "--reranker-url", cohere_server.url,
            "--reranker-model", "fake-rerank", "--reranker-api-key", "k"]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    scores = [overlap_score(QUERY, f"{hit['title']} {hit['text']}") for hit in fused]
    expected = sorted(range(len(fused)), key=lambda index: (-scores[index], index))
    assert [hit["chunk_id"] for hit in payload["results"]] == [fused[index]["chunk_id"] for index in expected]
    assert {hit["reranker"] for hit in payload["results"]} == {"cohere"}
    assert (payload["reranker"], payload["reranker_model"]) == ("cohere", "fake-rerank")
    assert cohere_server.requests[0]["model"] == "fake-rerank"


def test_backend_flags_have_global_twins(
    index_dir: Path, cohere_server: FakeServer, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("ONNXRANK_RERANKER", "cohere")
    monkeypatch.setenv("ONNXRANK_RERANKER_URL", cohere_server.url)
    monkeypatch.setenv("ONNXRANK_RERANKER_MODEL", "from-env")
    monkeypatch.setenv("COHERE_API_KEY", "k")
    assert main(["query", QUERY, "--index", str(index_dir), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["reranker"] == "cohere" and all(hit["reranked"] for hit in payload["results"])
    assert cohere_server.requests[0]["model"] == "from-env"


def test_query_with_the_llm_backend_at_a_closed_port(
    index_dir: Path, closed_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["query", QUERY, "--index", str(index_dir), "--k", "5", "--json"]
    assert main(base) == 0
    fused = json.loads(capsys.readouterr().out)["results"]
    argv = [*base, "--reranker", "llm", "--reranker-model", "m", "--reranker-timeout", "2",
            "--reranker-url", f"http://127.0.0.1:{closed_port}/v1"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    payload = json.loads(captured.out)
    assert [hit["chunk_id"] for hit in payload["results"]] == [hit["chunk_id"] for hit in fused]
    assert not any(hit["reranked"] for hit in payload["results"])
    assert "the llm reranker did not score any candidate" in payload["notes"][-1]
    assert main([*argv, "--on-error", "raise"]) == 2
    assert "llm reranker:" in capsys.readouterr().err


def test_eval_with_the_llm_backend(tmp_path: Path, chat_server: FakeServer) -> None:
    from retrieval_fixtures import write_dataset

    dataset = write_dataset(tmp_path / "tiny")
    out = tmp_path / "report"
    assert main(["eval", "--dataset", str(dataset), "--index", str(tmp_path / "i"), "--models-dir",
                 str(Path(__file__).parent), "--embedder", str(_embedder(tmp_path)), "--out", str(out),
                 "--modes", "hybrid+rerank", "--reranker", "llm", "--reranker-model", "m",
                 "--reranker-url", chat_server.url + "/v1"]) == 0
    report = json.loads((out / "eval.json").read_text())
    assert (report["reranker"], report["reranker_backend"]) == ("m", "llm")
    assert report["results"][0]["note"] == ""
    assert chat_server.requests  # the ratings were asked for


def _embedder(tmp_path: Path) -> Path:
    from retrieval_fixtures import write_model_dir

    return write_model_dir(tmp_path / "bow-embedder", task="embedding", name="bow-embedder")
