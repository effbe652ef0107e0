"""One process serving a reranker, an embedder and search, checked with the real clients: the
openai SDK (/v1/embeddings, /v1/models), the cohere SDK (rerank), and httpx (TEI's /embed, and
/v1/search against the library's own answer)."""

from __future__ import annotations

import base64
import re
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cohere
import httpx
import numpy as np
import openai
import pytest
from conftest import EMBED_ID, RERANK_ID
from serve_helpers import RunningServer, assert_same_searches, running_server, without_timings
from tokenizers import Tokenizer

from onnxrank.engine.embedder import Embedder
from onnxrank.engine.reranker import Reranker
from onnxrank.retrieval import HybridRetriever
from onnxrank.serve import ServeConfig

TEXTS = ["a wing in a propeller slipstream", "heat conduction in composite slabs",
         "time sharing operating system with paging for ibm computers"]
KNOWN = f"{RERANK_ID} (rerank), {EMBED_ID} (embedding)"
QUERY = "heat transfer to a blunt body"
DOCUMENTS = ["heat conduction in slabs", "wing lift", "ablation and heat transfer to a blunt body"]


def openai_client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(api_key="unused", base_url=f"{server.base_url}/v1", max_retries=0)


def token_counts(embedder: Embedder, texts: list[str]) -> list[int]:
    """Tokens per text as the embedder truncates them, from the model's own tokenizer file."""
    tokenizer = Tokenizer.from_file(str(embedder.model_dir / embedder.spec.tokenizer_file))
    tokenizer.no_padding()
    tokenizer.enable_truncation(embedder.spec.max_length)
    return [len(encoding.ids) for encoding in tokenizer.encode_batch(texts)]


# --- OpenAI /v1/embeddings --------------------------------------------------------------------


def test_openai_sdk_embeddings_equal_the_embedder(rag_server: RunningServer,
                                                  bow_embed_engine: Embedder) -> None:
    expected = bow_embed_engine.embed(TEXTS)
    client = openai_client(rag_server)
    # Without encoding_format the SDK asks for base64 and decodes little-endian float32 itself.
    default = client.embeddings.create(model=EMBED_ID, input=TEXTS)
    as_floats = client.embeddings.create(model=EMBED_ID, input=TEXTS, encoding_format="float")
    for response in (default, as_floats):
        assert response.object == "list" and response.model == EMBED_ID
        assert [item.index for item in response.data] == [0, 1, 2]
        assert {item.object for item in response.data} == {"embedding"}
        np.testing.assert_array_equal(
            np.asarray([item.embedding for item in response.data], dtype=np.float32), expected)
        assert response.usage.prompt_tokens == response.usage.total_tokens \
            == sum(token_counts(bow_embed_engine, TEXTS))
    single = client.embeddings.create(model=EMBED_ID, input=TEXTS[1], dimensions=32)
    assert len(single.data) == 1
    np.testing.assert_array_equal(np.asarray(single.data[0].embedding, np.float32),
                                  bow_embed_engine.embed(TEXTS[1:2])[0])  # a batch of its own
    # base64 over plain HTTP: the raw little-endian float32 bytes of each vector.
    raw = rag_server.client.post("/v1/embeddings", json={
        "model": EMBED_ID, "input": TEXTS, "encoding_format": "base64"}).json()
    decoded = np.stack([np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
                        for item in raw["data"]])
    np.testing.assert_array_equal(decoded, expected)


def test_embedding_usage_is_the_embedders_own_token_count(rag_server: RunningServer,
                                                          bow_embed_engine: Embedder) -> None:
    texts = [*TEXTS, " ".join(["wing"] * 200)]  # the last one is cut to max_length
    tokenizer = Tokenizer.from_file(str(bow_embed_engine.model_dir
                                        / bow_embed_engine.spec.tokenizer_file))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    whole = [len(encoding.ids) for encoding in tokenizer.encode_batch(texts)]
    assert whole[-1] > bow_embed_engine.spec.max_length
    expected = [min(count, bow_embed_engine.spec.max_length) for count in whole]
    run = bow_embed_engine.embed_detailed(texts)
    assert run.token_counts.tolist() == expected
    np.testing.assert_array_equal(run.vectors, bow_embed_engine.embed(texts))
    assert sum(rows * length for rows, length in run.batches) >= sum(expected)
    response = openai_client(rag_server).embeddings.create(model=EMBED_ID, input=texts,
                                                            encoding_format="float")
    assert response.usage.prompt_tokens == response.usage.total_tokens == sum(expected)


def test_openai_sdk_error_shapes(rag_server: RunningServer) -> None:
    client = openai_client(rag_server)
    cases: list[tuple[dict[str, Any], type[openai.APIStatusError], str, str]] = [
        ({"model": EMBED_ID, "input": [[101, 2054]]}, openai.BadRequestError, "input",
         "field `input` holds token ids (input[0] is a JSON array): this server embeds text "
         "only; send the text as a string or a list of strings"),
        ({"model": EMBED_ID, "input": TEXTS, "dimensions": 8}, openai.BadRequestError,
         "dimensions", "model 'embedder' does not support field `dimensions` (8): its embeddings "
         "have 32 dimensions and it was not trained to shorten them; omit `dimensions` or send 32"),
        ({"model": "text-embedding-3-small", "input": TEXTS}, openai.NotFoundError, "model",
         f"model 'text-embedding-3-small' is not served here; known models: {KNOWN}"),
        ({"model": RERANK_ID, "input": TEXTS}, openai.BadRequestError, "model",
         "model 'ranker' is a rerank model, but /v1/embeddings needs an embedding model; use "
         "one of: embedder"),
        ({"model": EMBED_ID, "input": ["fine", " "]}, openai.BadRequestError, "input",
         "`input[1]` must be a non-empty string, got ' '"),
    ]
    for arguments, error_type, param, message in cases:
        with pytest.raises(error_type) as caught:
            client.embeddings.create(**arguments)
        body = caught.value.body
        assert isinstance(body, dict)
        assert body == {"message": message, "type": "invalid_request_error", "param": param,
                        "code": body["code"]}, arguments
    bad_format = rag_server.client.post("/v1/embeddings", json={
        "model": EMBED_ID, "input": "x", "encoding_format": "int8"})
    assert bad_format.status_code == 400
    assert bad_format.json()["error"]["param"] == "encoding_format"
    assert bad_format.json()["error"]["message"] == (
        'field `encoding_format` must be "float" or "base64", got "int8"')


def test_openai_sdk_lists_models_with_their_task(rag_server: RunningServer) -> None:
    models = openai_client(rag_server).models.list()
    assert [model.id for model in models.data] == [RERANK_ID, EMBED_ID]
    # Fields OpenAI's model object does not define come through as the SDK's extras.
    assert [(model.model_extra or {})["task"] for model in models.data] == ["rerank", "embedding"]
    assert (models.data[1].model_extra or {})["dimensions"] == 32
    assert {model.object for model in models.data} == {"model"}


# --- TEI /embed --------------------------------------------------------------------------------


def test_tei_embed_equals_the_embedder(rag_server: RunningServer,
                                       bow_embed_engine: Embedder) -> None:
    expected = bow_embed_engine.embed(TEXTS)
    batch = rag_server.client.post("/embed", json={"inputs": TEXTS, "normalize": True})
    assert batch.status_code == 200
    np.testing.assert_array_equal(np.asarray(batch.json(), dtype=np.float32), expected)
    assert int(batch.headers["x-compute-tokens"]) == sum(token_counts(bow_embed_engine, TEXTS))
    # A batch of one pads differently from the batch above (last-bit differences): its own call.
    single = rag_server.client.post("/embed", json={"inputs": TEXTS[0]}).json()
    np.testing.assert_array_equal(np.asarray(single, dtype=np.float32),
                                  bow_embed_engine.embed(TEXTS[:1]))


def test_tei_embed_error_shapes(rag_server: RunningServer) -> None:
    long_text = " ".join(["wing"] * 200)  # one token each, with [CLS] and [SEP]: 202
    cases = [
        ({"inputs": []}, 400, "Empty", "`inputs` cannot be empty"),
        ({"inputs": "x", "normalize": False}, 422, "Validation",
         "field `normalize` false is not available: the served embedding models L2-normalise "
         "inside their graph; omit it or send true"),
        ({"inputs": [long_text], "truncate": False}, 413, "Validation",
         "Input validation error: `inputs` must have less than 128 tokens. Given: 202 "
         "(inputs[0]); send \"truncate\": true to cut it"),
        ({"inputs": "x", "model": "bge-small"}, 422, "Validation",
         f"model 'bge-small' is not served here; known models: {KNOWN}"),
        ({"texts": ["x"]}, 422, "Validation",
         "missing field `inputs`: a string or a list of strings is required"),
    ]
    for body, status, error_type, message in cases:
        response = rag_server.client.post("/embed", json=body)
        assert (response.status_code, response.json()) == (
            status, {"error": message, "error_type": error_type}), body
    # A long text with the default truncate is cut to max_length, not refused.
    assert rag_server.client.post("/embed", json={"inputs": [long_text]}).status_code == 200


# --- rerank with the cohere SDK on the two-model server -----------------------------------------


def test_cohere_sdk_reranks_on_the_two_model_server(rag_server: RunningServer,
                                                    bow_rerank_engine: Reranker) -> None:
    scores = bow_rerank_engine.activate(
        bow_rerank_engine.score([(QUERY, document) for document in DOCUMENTS]))
    order = sorted(range(len(DOCUMENTS)), key=lambda index: (-scores[index], index))
    with httpx.Client(timeout=30) as http:
        v1 = cohere.Client(api_key="unused", base_url=rag_server.base_url, httpx_client=http)
        unnamed = v1.rerank(query=QUERY, documents=DOCUMENTS)  # no model: the first reranker
        v2 = cohere.ClientV2(api_key="unused", base_url=rag_server.base_url, httpx_client=http)
        named = v2.rerank(model=RERANK_ID, query=QUERY, documents=DOCUMENTS)
        for response in (unnamed, named):
            assert [result.index for result in response.results] == order
            np.testing.assert_allclose([result.relevance_score for result in response.results],
                                       scores[order], atol=1e-6, rtol=0)
        with pytest.raises(cohere.errors.BadRequestError) as wrong_task:
            v2.rerank(model=EMBED_ID, query=QUERY, documents=DOCUMENTS)
        assert wrong_task.value.body == {"message": (
            "model 'embedder' is an embedding model, but /v2/rerank needs a rerank model; use "
            "one of: ranker")}
        with pytest.raises(cohere.errors.NotFoundError) as unknown:
            v2.rerank(model="rerank-v3.5", query=QUERY, documents=DOCUMENTS)
        assert unknown.value.body == {
            "message": f"model 'rerank-v3.5' is not served here; known models: {KNOWN}"}
    tei = rag_server.client.post("/rerank", json={"query": QUERY, "texts": DOCUMENTS,
                                                  "model": EMBED_ID})
    assert (tei.status_code, tei.json()["error_type"]) == (422, "Validation")


# --- /v1/search ----------------------------------------------------------------------------------


SEARCHES: list[dict[str, Any]] = [
    {"query": "heat transfer", "mode": "lexical", "k": 3},
    {"query": "wing in a slipstream", "mode": "vector", "k": 4},
    {"query": "shear flow over a plate", "mode": "hybrid", "k": 5,
     "filters": {"topic": ["aero", "thermal"], "year": {"gte": 1959}}},
    {"query": "operating systems and compilers", "k": 3, "rerank": True, "rerank_top_n": 4},
    {"query": "ablation heat", "k": 2, "rerank": True, "model": RERANK_ID, "depth": 6},
    {"query": "heat flow past a plate", "k": 4, "fusion": "convex", "fusion_weight": 0.3},
    {"query": "heat flow past a plate", "k": 4, "fusion": "rrf", "rrf_k": 10},
]


def library_answer(retriever: HybridRetriever, reranker: Reranker,
                   body: dict[str, Any]) -> dict[str, Any]:
    """What the library (and `onnxrank query --json`) answers for the same search."""
    options = {key: value for key, value in body.items() if key not in ("query", "model")}
    if options.get("rerank"):
        options["reranker"] = reranker
    return without_timings(retriever.search_detailed(body["query"], **options).to_dict())


def test_search_answers_what_the_library_answers(rag_server: RunningServer,
                                                 retriever: HybridRetriever,
                                                 bow_rerank_engine: Reranker) -> None:
    for body in SEARCHES:
        response = rag_server.client.post("/v1/search", json=body)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert set(answer["timings_ms"]) >= {"lexical_ms", "dense_ms", "fusion_ms", "rerank_ms"}
        assert without_timings(answer) == library_answer(retriever, bow_rerank_engine, body)
        assert answer["results"], body
    reranked = rag_server.client.post("/v1/search", json=SEARCHES[3]).json()
    assert all(hit["reranked"] and hit["rerank_score"] is not None
               for hit in reranked["results"])
    assert reranked["reranker"] == "local"


def test_concurrent_searches_get_the_single_thread_answers(rag_server: RunningServer,
                                                           retriever: HybridRetriever,
                                                           bow_rerank_engine: Reranker) -> None:
    expected = [library_answer(retriever, bow_rerank_engine, body) for body in SEARCHES]
    bodies = SEARCHES * 6

    def post(body: dict[str, Any]) -> dict[str, Any]:
        with httpx.Client(base_url=rag_server.base_url, timeout=30) as client:
            return without_timings(client.post("/v1/search", json=body).json())

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, bodies))
    assert_same_searches(answers, expected * 6)
    assert answers[5]["fusion"] != answers[6]["fusion"]  # the fusion options reach the retriever


def test_search_error_shapes(rag_server: RunningServer) -> None:
    cases = [
        ({"k": 3}, 422, "query", "missing field `query`: a non-empty string is required"),
        ({"query": "x", "mode": "semantic"}, 422, "mode",
         'field `mode` must be one of vector, lexical, hybrid, got "semantic"'),
        ({"query": "x", "filters": ["aero"]}, 422, "filters",
         'field `filters` must be a JSON object such as {"topic": "aero", "year": {"gte": '
         '1960}}, got ["aero"]'),
        ({"query": "x", "rerank_top_n": 5}, 422, "rerank_top_n",
         'field `rerank_top_n` needs "rerank": true'),
        ({"query": "x", "k": "ten"}, 422, "k", 'field `k` must be an integer, got a JSON string '
                                               '("ten")'),
        ({"query": "x", "rerank": True, "model": EMBED_ID}, 400, "model",
         "model 'embedder' is an embedding model, but /v1/search needs a rerank model; use one "
         "of: ranker"),
        ({"query": "x", "k": 0}, 422, None, "k must be >= 1, got 0"),
        ({"query": "x", "fusion_weight": "high"}, 422, "fusion_weight",
         'field `fusion_weight` must be a number, got a JSON string ("high")'),
    ]
    for body, status, param, message in cases:
        response = rag_server.client.post("/v1/search", json=body)
        assert response.status_code == status, body
        error = response.json()["error"]
        assert (error["message"], error["param"]) == (message, param), body


def test_search_without_an_index_is_a_404(bow_embed_engine: Embedder) -> None:
    with running_server({EMBED_ID: bow_embed_engine}, ServeConfig(port=0)) as server:
        response = server.client.post("/v1/search", json={"query": "x"})
        assert response.status_code == 404
        assert response.json()["error"]["message"] == (
            "this server has no index: start it with --index DIR to serve /v1/search")
        rerank = server.client.post("/v1/rerank", json={"query": "x", "documents": ["a"]})
        assert rerank.status_code == 404
        assert rerank.json() == {"message": "/v1/rerank needs a rerank model, and this server "
                                            f"serves none; it serves: {EMBED_ID} (embedding)"}


# --- a mixed burst under a small queue: every request answered exactly once --------------------


ENDPOINTS = ("/v1/embeddings", "/embed", "/v1/rerank", "/v1/search")


def burst_body(index: int) -> tuple[str, dict[str, Any]]:
    endpoint = ENDPOINTS[index % len(ENDPOINTS)]
    text = TEXTS[index % len(TEXTS)]
    if endpoint == "/v1/embeddings":
        return endpoint, {"model": EMBED_ID, "input": [text] * 8}
    if endpoint == "/embed":
        return endpoint, {"inputs": [text] * 8}
    if endpoint == "/v1/rerank":
        return endpoint, {"query": text, "documents": DOCUMENTS * 4}
    return endpoint, {"query": text, "k": 3, "rerank": index % 8 == 3}


def test_mixed_burst_is_answered_exactly_once(bow_rerank_engine: Reranker,
                                              bow_embed_engine: Embedder,
                                              retriever: HybridRetriever) -> None:
    engines = {RERANK_ID: bow_rerank_engine, EMBED_ID: bow_embed_engine}
    config = ServeConfig(port=0, max_queue=2)
    sent = 120
    statuses: Counter[tuple[str, int]] = Counter()
    lock = threading.Lock()
    with running_server(engines, config, retriever=retriever) as server:

        def send(index: int) -> None:
            endpoint, body = burst_body(index)
            with httpx.Client(base_url=server.base_url, timeout=30) as client:
                status = client.post(endpoint, json=body).status_code
            with lock:
                statuses[(endpoint, status)] += 1

        with ThreadPoolExecutor(24) as pool:
            list(pool.map(send, range(sent)))
        assert sum(statuses.values()) == sent
        assert {status for _, status in statuses} <= {200, 429}, statuses
        for endpoint in ENDPOINTS:
            for status in (200, 429):
                assert server.metric("onnxrank_requests_total", endpoint=endpoint,
                                     status=str(status)) == statuses[(endpoint, status)]
        assert sum(server.metric("onnxrank_requests_total", endpoint=endpoint)
                   for endpoint in ENDPOINTS) == sent
        embedded = server.metric("onnxrank_texts_embedded_total", model=EMBED_ID)
        # 8 texts per accepted embedding request reached the engine, none of a refused one.
        accepted = statuses[("/v1/embeddings", 200)] + statuses[("/embed", 200)]
        assert embedded == 8 * accepted


def test_unknown_model_messages_name_every_model(rag_server: RunningServer) -> None:
    response = rag_server.client.post("/v1/rerank", json={"model": "x", "query": "q",
                                                          "documents": ["a"]})
    assert response.status_code == 404
    assert re.fullmatch(re.escape(f"model 'x' is not served here; known models: {KNOWN}"),
                        response.json()["message"])
