"""The LLM pointwise backend (httpx) against a fake OpenAI-compatible / Ollama chat endpoint."""

from __future__ import annotations

import logging
import math
import time

import pytest
from fake_servers import FakeServer, overlap_score

from onnxrank.rerankers import BackendUnavailableError, LLMReranker
from onnxrank.rerankers.llm import parse_score

QUERY = "heat transfer in a blunt body"
DOCUMENTS = [
    "compilers and intermediate languages",
    "heat transfer to a blunt body in hypersonic flow",
    "heat conduction in composite slabs",
    "a wing in a propeller slipstream",
    "blunt body heat",
]


def ratings(documents: list[str]) -> list[float]:
    return [float(round(10 * overlap_score(QUERY, document))) for document in documents]


def expected_order(documents: list[str]) -> list[int]:
    scores = ratings(documents)
    return sorted(range(len(documents)), key=lambda index: (-scores[index], index))


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.levelno == logging.WARNING]


def assert_retrieval_order(ranked: list, documents: list[str]) -> None:
    assert [document.index for document in ranked] == list(range(len(documents)))
    assert all(not document.reranked and math.isnan(document.score) for document in ranked)
    assert all(document.backend == "llm" for document in ranked)


@pytest.mark.parametrize(("api", "path"), [("openai", "/v1/chat/completions"), ("ollama", "/api/chat")])
def test_orders_by_the_ratings(chat_server: FakeServer, api: str, path: str) -> None:
    root = chat_server.url + ("/v1" if api == "openai" else "")
    backend = LLMReranker(model="fake-chat", base_url=root, api=api, max_concurrency=2)  # type: ignore[arg-type]
    ranked = backend.rerank(QUERY, DOCUMENTS)
    assert [document.index for document in ranked] == expected_order(DOCUMENTS)
    expected_scores = ratings(DOCUMENTS)
    assert [document.score for document in ranked] == [expected_scores[document.index] for document in ranked]
    assert all(document.reranked and document.backend == "llm" for document in ranked)
    assert len(chat_server.requests) == len(DOCUMENTS)
    assert {request["path"] for request in chat_server.requests} == {path}
    assert {request["model"] for request in chat_server.requests} == {"fake-chat"}
    assert backend.rerank(QUERY, DOCUMENTS, top_k=2) == ranked[:2]


def test_api_key_is_sent_as_bearer(chat_server: FakeServer) -> None:
    LLMReranker(model="m", base_url=chat_server.url + "/v1", api_key="k1").rerank(QUERY, DOCUMENTS[:1])
    assert chat_server.headers[0]["Authorization"] == "Bearer k1"


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("garbage", "failed: ValueError: the answer must be a number from 0 to 10, got 'I would say"),
        ("error500", "failed: RuntimeError: HTTP 500"),
        ("malformed", "failed: ValueError: not a openai chat answer"),
        ("not_json", "failed: ValueError: not a openai chat answer"),
    ],
)
def test_bad_answers_keep_the_order_with_one_warning(
    chat_server: FakeServer, caplog: pytest.LogCaptureFixture, mode: str, message: str
) -> None:
    chat_server.mode = mode
    backend = LLMReranker(model="fake-chat", base_url=chat_server.url + "/v1")
    with caplog.at_level(logging.INFO, logger="onnxrank.rerankers"):
        assert_retrieval_order(backend.rerank(QUERY, DOCUMENTS), DOCUMENTS)
        assert_retrieval_order(backend.rerank(QUERY, DOCUMENTS), DOCUMENTS)
    (warning,) = warnings_of(caplog)
    assert message in warning.getMessage()


def test_a_closed_port_keeps_the_order_within_the_timeout(
    closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    backend = LLMReranker(model="m", base_url=f"http://127.0.0.1:{closed_port}/v1", timeout_s=2)
    with caplog.at_level(logging.WARNING, logger="onnxrank.rerankers"):
        assert_retrieval_order(backend.rerank(QUERY, DOCUMENTS), DOCUMENTS)
    assert "ConnectError" in warnings_of(caplog)[0].getMessage()


def test_a_slow_endpoint_is_cut_at_the_total_budget(
    chat_server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    chat_server.mode = "slow"
    backend = LLMReranker(model="m", base_url=chat_server.url + "/v1", timeout_s=0.3, max_concurrency=2)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="onnxrank.rerankers"):
        assert_retrieval_order(backend.rerank(QUERY, DOCUMENTS), DOCUMENTS)
    # Five documents, two at a time, each held 10 s by the server: the call returns after its own
    # 0.3 s budget (a loose bound: it shows the backend did not wait for the server).
    assert time.monotonic() - started < 3.0
    assert "rated 0 of 5 documents within 0.3 s" in warnings_of(caplog)[0].getMessage()
    # Only the first two were sent: the queued three were dropped, not sent late.
    assert len(chat_server.requests) == 2


def test_on_error_raise_raises(chat_server: FakeServer) -> None:
    chat_server.mode = "garbage"
    backend = LLMReranker(model="m", base_url=chat_server.url + "/v1", on_error="raise")
    with pytest.raises(BackendUnavailableError, match="llm reranker: .* failed: ValueError"):
        backend.rerank(QUERY, DOCUMENTS)


@pytest.mark.parametrize("answer", ["7", " 7 ", "7.5", "0", "10", "10.0\n"])
def test_parse_score_accepts_a_bare_number(answer: str) -> None:
    assert parse_score(answer) == float(answer)


@pytest.mark.parametrize("answer", ["", "seven", "7/10", "Score: 7", "11", "-1", "7 8", '{"score": 7}', None])
def test_parse_score_rejects_everything_else(answer: object) -> None:
    with pytest.raises(ValueError, match="the answer must be"):
        parse_score(answer)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="api must be one of openai, ollama, got 'grpc'"):
        LLMReranker(model="m", api="grpc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_concurrency must be >= 1, got 0"):
        LLMReranker(model="m", max_concurrency=0)
    with pytest.raises(ValueError, match="model must be a non-empty chat model name, got ''"):
        LLMReranker(model="")
