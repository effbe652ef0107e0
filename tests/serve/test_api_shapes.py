"""The three API dialects against their real clients: the cohere SDK (/v1, /v2) and plain HTTP
(TEI's /rerank), checked against the engine's own scores for the same pairs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import cohere
import httpx
import numpy as np
import openai
import pytest
from serve_helpers import DOCUMENTS, MODEL, QUERY, RunningServer, running_server

from onnxrank.engine.reranker import Reranker
from onnxrank.serve import ServeConfig

TEI_TIMING_HEADERS = ("x-compute-type", "x-compute-time", "x-compute-characters",
                      "x-compute-tokens", "x-total-time", "x-tokenization-time", "x-queue-time",
                      "x-inference-time")


def engine_view(reranker: Reranker, query: str, documents: list[str]) -> tuple[np.ndarray, list[int]]:
    """The engine's own activated scores and best-first order (ties by index)."""
    logits = reranker.score([(query, document) for document in documents])
    scores = reranker.activate(logits)
    order = sorted(range(len(documents)), key=lambda index: (-scores[index], index))
    return scores, order


@contextmanager
def cohere_sdk(server: RunningServer, version: int = 1,
               api_key: str = "unused") -> Iterator[cohere.Client]:
    """The official SDK pointed at the server (its HTTP client closed afterwards)."""
    with httpx.Client(timeout=30) as http:
        kind = cohere.Client if version == 1 else cohere.ClientV2
        yield kind(api_key=api_key, base_url=server.base_url, httpx_client=http)


def test_cohere_v1_sdk_scores_order_top_n_documents(server: RunningServer,
                                                    fp32_reranker: Reranker) -> None:
    scores, order = engine_view(fp32_reranker, QUERY, DOCUMENTS)
    with cohere_sdk(server) as client:
        response = client.rerank(query=QUERY, documents=DOCUMENTS, top_n=4,
                                 return_documents=True, model=MODEL)
    assert [result.index for result in response.results] == order[:4]
    np.testing.assert_allclose([result.relevance_score for result in response.results],
                               scores[order[:4]], atol=1e-6, rtol=0)
    assert [result.document.text for result in response.results] == [DOCUMENTS[i] for i in order[:4]]
    assert response.meta.api_version.version == "1"
    assert response.meta.billed_units.search_units == 1
    assert response.meta.tokens.input_tokens > 0
    # The tiny model is not relevance-trained: every answer says so.
    assert any("NOT relevance scores" in warning for warning in response.meta.warnings)


def test_cohere_v1_object_documents_and_jina_fields(server: RunningServer,
                                                    fp32_reranker: Reranker) -> None:
    documents = [{"text": text, "id": f"doc-{index}"} for index, text in enumerate(DOCUMENTS)]
    scores, order = engine_view(fp32_reranker, QUERY, DOCUMENTS)
    with cohere_sdk(server) as client:
        response = client.rerank(query=QUERY, documents=documents, return_documents=True)
    assert [result.index for result in response.results] == order
    # Cohere v1 keeps every field of an object document.
    assert [result.document.text for result in response.results] == [DOCUMENTS[i] for i in order]
    assert response.results[0].document.id == f"doc-{order[0]}"
    # Jina's shape in the same answer: model and usage.total_tokens; no document unless asked.
    body = server.client.post("/v1/rerank", json={
        "model": MODEL, "query": QUERY, "documents": DOCUMENTS,
        "top_n": 2}).json()
    assert body["model"] == fp32_reranker.spec.name
    assert body["usage"]["total_tokens"] == body["meta"]["tokens"]["input_tokens"] > 0
    assert [item["index"] for item in body["results"]] == order[:2]
    assert all(set(item) == {"index", "relevance_score"} for item in body["results"])


def test_cohere_v1_rank_fields(server: RunningServer, fp32_reranker: Reranker) -> None:
    documents = [{"title": f"title {index}", "text": text} for index, text in enumerate(DOCUMENTS)]
    scored = [f"title: title {index}\ntext: {text}" for index, text in enumerate(DOCUMENTS)]
    scores, order = engine_view(fp32_reranker, QUERY, scored)
    body = server.client.post("/v1/rerank", json={"query": QUERY, "documents": documents,
                                                  "rank_fields": ["title", "text"]}).json()
    assert [item["index"] for item in body["results"]] == order
    np.testing.assert_allclose([item["relevance_score"] for item in body["results"]],
                               scores[order], atol=1e-6, rtol=0)


def test_cohere_v2_sdk(server: RunningServer, fp32_reranker: Reranker) -> None:
    scores, order = engine_view(fp32_reranker, QUERY, DOCUMENTS)
    with cohere_sdk(server, version=2) as client:
        response = client.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS, top_n=3)
    assert [result.index for result in response.results] == order[:3]
    np.testing.assert_allclose([result.relevance_score for result in response.results],
                               scores[order[:3]], atol=1e-6, rtol=0)
    assert response.meta.api_version.version == "2"


def test_cohere_v2_max_tokens_per_doc_cuts_documents(server: RunningServer,
                                                     fp32_reranker: Reranker) -> None:
    limit = 3
    tokenizer = fp32_reranker.tokenizer
    cut = []
    for document in DOCUMENTS:
        encoding = tokenizer.encode(document, add_special_tokens=False)
        cut.append(document if len(encoding.ids) <= limit
                   else document[: encoding.offsets[limit - 1][1]])
    scores, order = engine_view(fp32_reranker, QUERY, cut)
    with cohere_sdk(server, version=2) as client:
        response = client.rerank(model=MODEL, query=QUERY, documents=DOCUMENTS,
                                 max_tokens_per_doc=limit)
    assert [result.index for result in response.results] == order
    np.testing.assert_allclose([result.relevance_score for result in response.results],
                               scores[order], atol=1e-6, rtol=0)


def test_tei_rerank_shape_scores_and_headers(server: RunningServer,
                                             fp32_reranker: Reranker) -> None:
    logits = fp32_reranker.score([(QUERY, document) for document in DOCUMENTS])
    response = server.client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS,
                                                   "return_text": True})
    assert response.status_code == 200
    body = response.json()
    assert isinstance(body, list) and len(body) == len(DOCUMENTS)
    assert [item["score"] for item in body] == sorted((item["score"] for item in body), reverse=True)
    for item in body:
        assert set(item) == {"index", "text", "score"}
        assert item["text"] == DOCUMENTS[item["index"]]
        assert item["score"] == pytest.approx(float(fp32_reranker.activate(logits)[item["index"]]),
                                              abs=1e-6)
    for name in TEI_TIMING_HEADERS:
        assert name in response.headers, name
    for name in TEI_TIMING_HEADERS[1:]:
        assert response.headers[name].isdigit(), (name, response.headers[name])
    assert int(response.headers["x-compute-characters"]) == sum(
        len(QUERY) + len(document) for document in DOCUMENTS)
    raw = server.client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS,
                                              "raw_scores": True}).json()
    assert all(set(item) == {"index", "score"} for item in raw)
    np.testing.assert_allclose([item["score"] for item in raw],
                               logits[[item["index"] for item in raw]], atol=1e-6, rtol=0)


def test_tei_truncation_options(server: RunningServer, fp32_reranker: Reranker) -> None:
    max_length = fp32_reranker.config.max_length
    long_document = " ".join(["wing flutter"] * max_length)
    response = server.client.post("/rerank", json={"query": QUERY, "texts": [long_document],
                                                   "truncate": False})
    assert response.status_code == 422
    assert response.json()["error_type"] == "Validation"
    assert f"must have less than {max_length} tokens" in response.json()["error"]
    # Left truncation keeps the end of the document: the score of its tail.
    tail_marker = "boundary layer transition on a flat plate"
    document = " ".join(["heat transfer"] * max_length) + " " + tail_marker
    left = server.client.post("/rerank", json={"query": QUERY, "texts": [document],
                                               "truncation_direction": "Left",
                                               "raw_scores": True}).json()
    right = server.client.post("/rerank", json={"query": QUERY, "texts": [document],
                                                "raw_scores": True}).json()
    tokenizer = fp32_reranker.tokenizer
    room = (max_length - tokenizer.num_special_tokens_to_add(is_pair=True)
            - len(tokenizer.encode(QUERY, add_special_tokens=False).ids))
    encoding = tokenizer.encode(document, add_special_tokens=False)
    tail = document[encoding.offsets[len(encoding.ids) - room][0]:]
    assert tail.endswith(tail_marker)
    assert left[0]["score"] == pytest.approx(float(fp32_reranker.score([(QUERY, tail)])[0]),
                                             abs=1e-5)
    assert right[0]["score"] == pytest.approx(float(fp32_reranker.score([(QUERY, document)])[0]),
                                              abs=1e-5)


COHERE_422 = [
    (b"{not json", "request body is not valid JSON"),
    (b"[1, 2]", "request body must be a JSON object, got a JSON array"),
    (b'{"documents": ["a"]}', "missing field `query`"),
    (b'{"query": "", "documents": ["a"]}', "field `query` must be a non-empty string, got ''"),
    (b'{"query": "   ", "documents": ["a"]}', "field `query` must be a non-empty string"),
    (b'{"query": 7, "documents": ["a"]}', "field `query` must be a string, got a JSON number"),
    (b'{"query": "q"}', "missing field `documents`"),
    (b'{"query": "q", "documents": "a"}', "field `documents` must be a list of strings"),
    (b'{"query": "q", "documents": ["a", 5]}', "`documents[1]` must be a string"),
    (b'{"query": "q", "documents": [{"title": "a"}]}', "`documents[0].text` must be a string"),
    (b'{"query": "q", "documents": ["a"], "top_n": "3"}', "field `top_n` must be an integer"),
    (b'{"query": "q", "documents": ["a"], "top_n": 0}', "field `top_n` must be a positive integer"),
    (b'{"query": "q", "documents": ["a"], "return_documents": "yes"}',
     "field `return_documents` must be a boolean"),
    (b'{"query": "q", "documents": ["a"], "deadline_ms": -5}',
     "field `deadline_ms` must be a positive number"),
    (b'{"query": "q", "documents": ["a"], "on_deadline": "later"}',
     'field `on_deadline` (or header X-On-Deadline) must be "error" or "fallback"'),
]


@pytest.mark.parametrize(("body", "message"), COHERE_422)
def test_cohere_validation_errors_name_the_field(server: RunningServer, body: bytes,
                                                 message: str) -> None:
    response = server.client.post("/v1/rerank", content=body,
                                  headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert set(response.json()) == {"message"}
    assert message in response.json()["message"]


def test_cohere_sdk_sees_422_as_unprocessable(server: RunningServer) -> None:
    with cohere_sdk(server) as client, pytest.raises(cohere.UnprocessableEntityError) as raised:
        client.rerank(query=" ", documents=["a"])
    assert raised.value.body == {"message": "field `query` must be a non-empty string, got ' '"}


def test_v2_rejects_object_documents(server: RunningServer) -> None:
    response = server.client.post("/v2/rerank", json={"model": MODEL, "query": "q",
                                                      "documents": [{"text": "a"}]})
    assert response.status_code == 422
    assert response.json() == {"message": "`documents[0]` must be a string, got a JSON object"}


def test_tei_errors_in_tei_shape(server: RunningServer) -> None:
    empty = server.client.post("/rerank", json={"query": "q", "texts": []})
    assert (empty.status_code, empty.json()) == (400, {"error": "`texts` cannot be empty",
                                                       "error_type": "Empty"})
    wrong = server.client.post("/rerank", json={"query": "q", "texts": ["a"], "raw_scores": 1})
    assert wrong.status_code == 422
    assert wrong.json() == {"error": "field `raw_scores` must be a boolean, got a JSON number (1)",
                            "error_type": "Validation"}
    direction = server.client.post("/rerank", json={"query": "q", "texts": ["a"],
                                                    "truncation_direction": "up"})
    assert direction.status_code == 422 and "truncation_direction" in direction.json()["error"]


def test_extra_fields_real_clients_send_are_tolerated(server: RunningServer) -> None:
    body = {"model": MODEL, "query": QUERY, "documents": DOCUMENTS[:2],
            "max_chunks_per_doc": 10, "rank_fields": ["text"], "priority": 0,
            "overlap_tokens": 80, "user": "someone"}
    assert server.client.post("/v1/rerank", json=body).status_code == 200
    assert server.client.post("/v2/rerank", json=body).status_code == 200
    tei = {"query": QUERY, "texts": DOCUMENTS[:2], "truncate": True, "inputs": "ignored"}
    assert server.client.post("/rerank", json=tei).status_code == 200


def test_empty_documents_cohere_answers_no_results(server: RunningServer) -> None:
    body = server.client.post("/v1/rerank", json={"query": "q", "documents": []}).json()
    assert body["results"] == []


def test_size_limits_answer_413_naming_the_limit(fp32_reranker: Reranker) -> None:
    config = ServeConfig(port=0, max_documents=3, max_characters=5000, max_tokens=60,
                         max_request_bytes=20_000)
    with running_server(fp32_reranker, config) as small:
        documents = small.client.post("/v1/rerank", json={"query": "q", "documents": ["a"] * 4})
        assert documents.status_code == 413
        assert documents.json()["message"] == (
            "`documents` has 4 entries, more than this server's limit of 3 (--max-documents); "
            "split the request")
        characters = small.client.post("/rerank", json={"query": "q", "texts": ["x" * 6000]})
        assert characters.status_code == 413
        assert characters.json()["error_type"] == "Validation"
        assert "(--max-characters)" in characters.json()["error"]
        tokens = small.client.post("/v2/rerank", json={"model": MODEL, "query": "q",
                                                       "documents": ["wing " * 40] * 2})
        assert tokens.status_code == 413 and "(--max-tokens)" in tokens.json()["message"]
        body = small.client.post("/v1/rerank", content=b" " * 30_000,
                                 headers={"content-type": "application/json"})
        assert body.status_code == 413 and "(--max-request-bytes)" in body.json()["message"]


def test_a_request_larger_than_one_batch_is_split_not_refused(fp32_reranker: Reranker) -> None:
    many = [f"{DOCUMENTS[index % len(DOCUMENTS)]} number {index}" for index in range(300)]
    assert len(many) > fp32_reranker.config.max_batch_size
    scores, order = engine_view(fp32_reranker, QUERY, many)
    with running_server(fp32_reranker, ServeConfig(port=0)) as fresh:
        body = fresh.client.post("/v2/rerank", json={"model": MODEL, "query": QUERY,
                                                     "documents": many}).json()
        assert [item["index"] for item in body["results"]] == order
        assert fresh.metric("onnxrank_engine_runs_total") == 1
        # The planner split the one request into several model runs.
        assert fresh.metric("onnxrank_batch_rows_count") >= len(many) / fp32_reranker.config.max_batch_size


def test_api_key(fp32_reranker: Reranker) -> None:
    key = "s3cret-key"
    with running_server(fp32_reranker, ServeConfig(port=0, api_key=key)) as guarded:
        anonymous = httpx.Client(base_url=guarded.base_url, timeout=30)
        wrong = httpx.Client(base_url=guarded.base_url, timeout=30,
                             headers={"Authorization": "Bearer nope"})
        assert anonymous.get("/health").status_code == 200
        answers = []
        for client in (anonymous, wrong):
            for method, path in (("POST", "/v1/rerank"), ("POST", "/v2/rerank"),
                                 ("GET", "/metrics"), ("GET", "/ready"), ("GET", "/v1/models"),
                                 ("GET", "/no/such/path")):
                response = client.request(method, path, json={"query": "q", "documents": ["a"]})
                answers.append((response.status_code, response.content))
                assert response.headers["www-authenticate"] == "Bearer"
        # One answer for every case: nothing tells a missing key from a wrong one, or a route
        # from a missing one.
        assert set(answers) == {(401, b'{"message":"unauthorized"}')}
        tei = wrong.post("/rerank", json={"query": "q", "texts": ["a"]})
        assert (tei.status_code, tei.content) == (401, b"")
        # OpenAI's routes answer in OpenAI's shape, which its SDK reads as AuthenticationError.
        embeddings = wrong.post("/v1/embeddings", json={"input": "q"})
        assert (embeddings.status_code, embeddings.json()) == (401, {"error": {
            "message": "unauthorized", "type": "invalid_request_error", "param": None,
            "code": "invalid_api_key"}})
        bad_openai = openai.OpenAI(api_key="nope", base_url=f"{guarded.base_url}/v1",
                                   max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad_openai.models.list()
        with cohere_sdk(guarded, api_key=key) as good:
            assert len(good.rerank(query=QUERY, documents=DOCUMENTS).results) == len(DOCUMENTS)
        with cohere_sdk(guarded, api_key="nope") as bad, pytest.raises(cohere.UnauthorizedError):
            bad.rerank(query=QUERY, documents=DOCUMENTS)
        anonymous.close()
        wrong.close()


def test_health_ready_models_metrics(server: RunningServer, fp32_reranker: Reranker) -> None:
    assert server.client.get("/health").json() == {"status": "ok"}
    assert server.client.get("/ready").json() == {"status": "ready",
                                                  "models": [fp32_reranker.spec.name]}
    models = server.client.get("/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == fp32_reranker.spec.name
    assert models["data"][0]["relevance_trained"] is False
    assert models["data"][0]["task"] == "rerank"
    server.client.post("/v1/rerank", json={"query": QUERY, "documents": DOCUMENTS})
    text = server.client.get("/metrics").text
    for name in ("onnxrank_requests_total", "onnxrank_request_duration_seconds_bucket",
                 "onnxrank_queue_wait_seconds_bucket", "onnxrank_tokenization_seconds_bucket",
                 "onnxrank_inference_seconds_bucket", "onnxrank_batch_rows_bucket",
                 "onnxrank_batch_padded_tokens_bucket", "onnxrank_queue_depth",
                 "onnxrank_pairs_scored_total", "onnxrank_engine_runs_total",
                 "onnxrank_requests_dropped_total"):
        assert re.search(rf"^{name}[{{ ]", text, flags=re.MULTILINE), name
    assert server.metric("onnxrank_requests_total", endpoint="/v1/rerank", status="200") >= 1
