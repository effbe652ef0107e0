"""The Cohere backend through the real `cohere` SDK against a fake v2 rerank endpoint."""

from __future__ import annotations

import logging
import math
import sys
import time

import pytest
from fake_servers import FakeServer, overlap_score

from onnxrank.rerankers import BackendUnavailableError, CohereReranker

QUERY = "heat transfer in a blunt body"
DOCUMENTS = [
    "compilers and intermediate languages",
    "heat transfer to a blunt body in hypersonic flow",
    "heat conduction in composite slabs",
    "a wing in a propeller slipstream",
]


def expected_order(documents: list[str]) -> list[int]:
    scores = [overlap_score(QUERY, document) for document in documents]
    return sorted(range(len(documents)), key=lambda index: (-scores[index], index))


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.levelno == logging.WARNING]


def test_orders_by_the_endpoint_and_sends_what_the_v2_api_expects(cohere_server: FakeServer) -> None:
    backend = CohereReranker(model="fake-rerank", base_url=cohere_server.url, api_key="secret")
    ranked = backend.rerank(QUERY, DOCUMENTS)
    assert [document.index for document in ranked] == expected_order(DOCUMENTS)
    assert [document.score for document in ranked] == pytest.approx(
        [overlap_score(QUERY, DOCUMENTS[document.index]) for document in ranked]
    )
    assert all(document.reranked and document.backend == "cohere" for document in ranked)
    assert [document.text for document in ranked] == [DOCUMENTS[document.index] for document in ranked]
    request = cohere_server.requests[0]
    assert request["path"] == "/v2/rerank"
    assert (request["model"], request["query"], request["documents"]) == ("fake-rerank", QUERY, DOCUMENTS)
    assert "top_n" not in request
    assert cohere_server.headers[0]["Authorization"] == "Bearer secret"


def test_top_k_is_sent_as_top_n(cohere_server: FakeServer) -> None:
    backend = CohereReranker(model="fake-rerank", base_url=cohere_server.url, api_key="secret")
    ranked = backend.rerank(QUERY, DOCUMENTS, top_k=2)
    assert [document.index for document in ranked] == expected_order(DOCUMENTS)[:2]
    assert cohere_server.requests[0]["top_n"] == 2
    assert backend.rerank(QUERY, []) == []


def test_the_key_comes_from_the_environment(
    cohere_server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CO_API_KEY", "from-co")
    CohereReranker(base_url=cohere_server.url).rerank(QUERY, DOCUMENTS)
    monkeypatch.setenv("COHERE_API_KEY", "from-cohere")
    CohereReranker(base_url=cohere_server.url).rerank(QUERY, DOCUMENTS)
    assert [headers["Authorization"] for headers in cohere_server.headers] == [
        "Bearer from-co",
        "Bearer from-cohere",
    ]


def assert_retrieval_order(ranked: list, documents: list[str], top_k: int | None = None) -> None:
    kept = documents if top_k is None else documents[:top_k]
    assert [document.index for document in ranked] == list(range(len(kept)))
    assert all(not document.reranked and math.isnan(document.score) for document in ranked)
    assert all(document.backend == "cohere" for document in ranked)


def test_missing_key_keeps_the_order_with_one_warning(
    cohere_server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    backend = CohereReranker(base_url=cohere_server.url)
    with caplog.at_level(logging.INFO, logger="onnxrank.rerankers"):
        for _ in range(3):
            assert_retrieval_order(backend.rerank(QUERY, DOCUMENTS, top_k=3), DOCUMENTS, top_k=3)
    assert cohere_server.requests == []
    (warning,) = warnings_of(caplog)
    assert warning.getMessage() == (
        "cohere reranker: no API key: pass api_key=..., or set COHERE_API_KEY or CO_API_KEY (any "
        "value for a server started without --api-key); keeping the retrieval order (reranked=False)"
    )


def test_missing_package_keeps_the_order(
    cohere_server: FakeServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "cohere", None)  # import cohere now raises ImportError
    backend = CohereReranker(base_url=cohere_server.url, api_key="secret")
    with caplog.at_level(logging.WARNING, logger="onnxrank.rerankers"):
        assert_retrieval_order(backend.rerank(QUERY, DOCUMENTS), DOCUMENTS)
    assert 'pip install "onnxrank[cohere]"' in warnings_of(caplog)[0].getMessage()


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("error500", "failed: HTTP 500"),
        ("malformed", "answered a malformed body"),
        ("bad_index", "answered a malformed body: results[0].index must be an int in [0, 4), got 7"),
        ("not_json", "failed:"),
    ],
)
def test_server_failures_keep_the_order_with_one_warning(
    cohere_server: FakeServer, caplog: pytest.LogCaptureFixture, mode: str, message: str
) -> None:
    cohere_server.mode = mode
    backend = CohereReranker(model="fake-rerank", base_url=cohere_server.url, api_key="secret")
    with caplog.at_level(logging.INFO, logger="onnxrank.rerankers"):
        assert_retrieval_order(backend.rerank(QUERY, DOCUMENTS), DOCUMENTS)
        assert_retrieval_order(backend.rerank(QUERY, DOCUMENTS), DOCUMENTS)
    (warning,) = warnings_of(caplog)
    assert message in warning.getMessage()
    assert len(cohere_server.requests) == 2  # no retries


def test_a_slow_server_times_out_within_the_budget(
    cohere_server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    cohere_server.mode = "slow"
    backend = CohereReranker(base_url=cohere_server.url, api_key="secret", timeout_s=0.3)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="onnxrank.rerankers"):
        assert_retrieval_order(backend.rerank(QUERY, DOCUMENTS), DOCUMENTS)
    # The server would hold the answer for 10 s; the call gives up after its 0.3 s budget (the
    # bound is loose: it only shows the backend did not wait for the server).
    assert time.monotonic() - started < 3.0
    assert "within 0.3 s" in warnings_of(caplog)[0].getMessage()


def test_a_closed_port_keeps_the_order(closed_port: int) -> None:
    backend = CohereReranker(base_url=f"http://127.0.0.1:{closed_port}", api_key="secret", timeout_s=2)
    assert_retrieval_order(backend.rerank(QUERY, DOCUMENTS), DOCUMENTS)


def test_on_error_raise_raises(cohere_server: FakeServer) -> None:
    cohere_server.mode = "error500"
    backend = CohereReranker(base_url=cohere_server.url, api_key="secret", on_error="raise")
    with pytest.raises(BackendUnavailableError, match="cohere reranker: .* failed: HTTP 500"):
        backend.rerank(QUERY, DOCUMENTS)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="timeout_s must be > 0, got 0"):
        CohereReranker(timeout_s=0)
    backend = CohereReranker(api_key="secret")
    with pytest.raises(ValueError, match="query must be a non-empty string, got ' '"):
        backend.rerank(" ", DOCUMENTS)
    with pytest.raises(ValueError, match="top_k must be a positive int or None, got 0"):
        backend.rerank(QUERY, DOCUMENTS, top_k=0)
    with pytest.raises(TypeError, match="documents\\[1\\] must be a str, got int"):
        backend.rerank(QUERY, ["a", 1])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="on_error must be one of fallback, raise, got 'ignore'"):
        CohereReranker(on_error="ignore")  # type: ignore[arg-type]
