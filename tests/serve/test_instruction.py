"""A decoder reranker's per-request `instruction` on /v1/rerank (Cohere v1 and Jina) and TEI's
/rerank: served scores equal the engine's with the same instruction, requests with different
instructions queued together are scored in one engine call per instruction, and a model
without a prompt answers 422 naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest
from serve_helpers import WAIT_S, GatedEngine, RunningServer, poll, running_server

from onnxrank.engine.reranker import Reranker
from onnxrank.serve import ServeConfig

DECODER, BERT = "qwen", "bert"
QUERY = "what is known about wing flutter at high speeds"
DOCUMENTS = ["The flutter of aircraft wings at transonic speeds was studied in a wind tunnel.",
             "Boundary layer transition on a flat plate.", "wings"]
INSTRUCTIONS = ["Find reports on aircraft structures", "Judge whether the document is about heat"]


@pytest.fixture(scope="module")
def gated(decoder_reranker: Reranker) -> Iterator[GatedEngine]:
    engine = GatedEngine(decoder_reranker)
    yield engine
    engine.gate.set()  # never leave a worker waiting


@pytest.fixture(scope="module")
def server(gated: GatedEngine, fp32_reranker: Reranker) -> Iterator[RunningServer]:
    with running_server({DECODER: gated, BERT: fp32_reranker}, ServeConfig(port=0)) as running:
        yield running


def post(server: RunningServer, path: str, body: dict[str, Any]) -> httpx.Response:
    with httpx.Client(base_url=server.base_url, timeout=WAIT_S) as client:
        return client.post(path, json=body)


def scores_by_index(response: httpx.Response, field: str) -> np.ndarray:
    assert response.status_code == 200, response.text
    items = response.json() if isinstance(response.json(), list) else response.json()["results"]
    scores = np.full(len(DOCUMENTS), np.nan)
    for item in items:
        scores[item["index"]] = item[field]
    return scores


def engine_scores(reranker: Reranker, instruction: str | None) -> np.ndarray:
    ranked = reranker.rerank(QUERY, DOCUMENTS, instruction=instruction)
    scores = np.full(len(DOCUMENTS), np.nan)
    for document in ranked:
        scores[document.index] = document.score
    return scores


def test_served_instruction_scores_equal_the_engine(server: RunningServer,
                                                    decoder_reranker: Reranker) -> None:
    for instruction in (None, *INSTRUCTIONS):
        expected = engine_scores(decoder_reranker, instruction)
        extra = {} if instruction is None else {"instruction": instruction}
        cohere = post(server, "/v1/rerank", {"model": DECODER, "query": QUERY,
                                             "documents": DOCUMENTS, **extra})
        tei = post(server, "/rerank", {"model": DECODER, "query": QUERY, "texts": DOCUMENTS,
                                       **extra})
        np.testing.assert_allclose(scores_by_index(cohere, "relevance_score"), expected,
                                   atol=1e-6, rtol=0)
        np.testing.assert_allclose(scores_by_index(tei, "score"), expected, atol=1e-6, rtol=0)
    first, second = (engine_scores(decoder_reranker, instruction) for instruction in INSTRUCTIONS)
    assert not np.allclose(first, second)


def test_different_instructions_queued_together_run_one_engine_call_each(
    server: RunningServer, gated: GatedEngine, decoder_reranker: Reranker,
) -> None:
    runs = server.metric("onnxrank_engine_runs_total", model=DECODER)
    with ThreadPoolExecutor(max_workers=4) as pool:
        entered = gated.runs_entered
        gated.gate.clear()
        held = pool.submit(post, server, "/v1/rerank", {"model": DECODER, "query": QUERY,
                                                        "documents": DOCUMENTS})
        poll(lambda: gated.runs_entered > entered, "the worker to take the first request")
        instructions = [*INSTRUCTIONS, INSTRUCTIONS[0]]
        bodies: list[dict[str, Any]] = [
            {"model": DECODER, "query": QUERY, "documents": DOCUMENTS, "instruction": instruction}
            for instruction in instructions]
        waiting = [pool.submit(post, server, "/v1/rerank", body) for body in bodies]
        poll(lambda: server.metric("onnxrank_queue_depth", model=DECODER) == len(bodies),
             "the requests to queue")
        gated.gate.set()
        assert held.result(WAIT_S).status_code == 200
        answers = [future.result(WAIT_S) for future in waiting]
    for instruction, answer in zip(instructions, answers):
        np.testing.assert_allclose(scores_by_index(answer, "relevance_score"),
                                   engine_scores(decoder_reranker, instruction),
                                   atol=1e-6, rtol=0)
    # The held run, then one engine call per instruction: the two with the same one share it.
    assert server.metric("onnxrank_engine_runs_total", model=DECODER) - runs == 3
    assert [answer.headers["x-onnxrank-batch-requests"] for answer in answers] == ["2", "1", "2"]


def test_a_model_without_a_prompt_refuses_an_instruction(server: RunningServer) -> None:
    message = ("field `instruction` applies to decoder rerankers (a model exported with a prompt "
               "recipe); model 'bert' has no prompt: omit `instruction`")
    cohere = post(server, "/v1/rerank", {"model": BERT, "query": QUERY, "documents": DOCUMENTS,
                                         "instruction": INSTRUCTIONS[0]})
    tei = post(server, "/rerank", {"model": BERT, "query": QUERY, "texts": DOCUMENTS,
                                   "instruction": INSTRUCTIONS[0]})
    assert (cohere.status_code, cohere.json()) == (422, {"message": message})
    assert (tei.status_code, tei.json()) == (422, {"error": message, "error_type": "Validation"})
    blank = post(server, "/v1/rerank", {"model": DECODER, "query": QUERY, "documents": DOCUMENTS,
                                        "instruction": " "})
    assert (blank.status_code, blank.json()) == (422, {"message": (
        "field `instruction` must be a non-empty string (omit it for the model's default), "
        "got ' '")})


def test_an_instruction_the_prompt_has_no_room_for_is_a_422(server: RunningServer,
                                                            decoder_reranker: Reranker) -> None:
    too_long = " ".join(["aircraft structures"] * 400)
    with pytest.raises(ValueError) as engine_error:
        decoder_reranker.rerank(QUERY, DOCUMENTS, instruction=too_long)
    for path, body, key in (("/v1/rerank", {"documents": DOCUMENTS}, "message"),
                            ("/rerank", {"texts": DOCUMENTS}, "error")):
        response = post(server, path, {"model": DECODER, "query": QUERY, **body,
                                       "instruction": too_long})
        assert response.status_code == 422, response.text
        assert response.json()[key] == f"field `instruction`: {engine_error.value}"


@pytest.mark.parametrize("instruction", [None, INSTRUCTIONS[0]])
def test_the_token_limit_counts_the_prompt_as_the_engine_builds_rows(
        decoder_reranker: Reranker, instruction: str | None) -> None:
    # The tokens of the rows the engine will run: the recipe's prompt and the instruction
    # (None: the recipe's default) around each query and document.
    encoder = type(decoder_reranker).row_encoder(
        decoder_reranker.tokenizer, decoder_reranker.row_budget().max_length,
        decoder_reranker.spec.recipe)
    total = sum(len(row.ids) for row in encoder.encode([(QUERY, document) for document in DOCUMENTS],
                                                        instruction=instruction))
    assert total > 3 * decoder_reranker.row_budget(instruction).fixed_tokens > 0
    body = {"model": DECODER, "query": QUERY, "documents": DOCUMENTS}
    if instruction is not None:
        body["instruction"] = instruction
    with running_server({DECODER: decoder_reranker}, ServeConfig(port=0, max_tokens=total)) as at:
        assert post(at, "/v1/rerank", body).status_code == 200
    with running_server({DECODER: decoder_reranker},
                        ServeConfig(port=0, max_tokens=total - 1)) as below:
        refused = post(below, "/v1/rerank", body)
    assert refused.status_code == 413, refused.text
    assert f"the request is {total} tokens as the model sees them" in refused.text
