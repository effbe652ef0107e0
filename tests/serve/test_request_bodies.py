"""Hostile request bodies against every POST endpoint of one process (rerank in its Cohere v1/v2,
Jina and TEI shapes, embeddings in OpenAI's and TEI's, search): each is a 4xx in the endpoint's
dialect with a message saying what was wrong, and the server logs no traceback for it."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from serve_helpers import RunningServer

from onnxrank.serve.app import DIALECT_OF_PATH
from onnxrank.serve.parsing import MAX_NESTING

POST_PATHS = sorted(DIALECT_OF_PATH)
JSON = {"content-type": "application/json"}
NOT_JSON = "request body is not valid JSON"
TOO_DEEP = f"field `top_n` nests arrays and objects more than {MAX_NESTING} levels deep"


def nested_list(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


HOSTILE_BODIES = {
    "arrays nested 50,000 levels": (nested_list(50_000), NOT_JSON),
    "objects nested 50,000 levels": (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, NOT_JSON),
    # Deep enough to pass the JSON decoder (1,024 levels) but to reach Python's recursion limit
    # when a handler quotes the value in its message or echoes it back.
    "a field nested 1,000 levels": (b'{"query": "q", "documents": ["a"], "texts": ["a"], '
                                    b'"input": "a", "inputs": "a", "top_n": '
                                    + nested_list(1_000) + b"}", TOO_DEEP),
    "one level past the limit": (b'{"query": "q", "top_n": {"a": ' + nested_list(MAX_NESTING - 1)
                                 + b"}}", TOO_DEEP),
    # Read as an int (orjson reads up to 2**64 - 1), which SQLite cannot bind.
    "an integer beyond 64 bits": (b'{"query": "q", "documents": ["a"], "texts": ["a"], '
                                  b'"input": "a", "inputs": "a", "top_n": 18446744073709551615}',
                                  "field `top_n` holds the integer 18446744073709551615, more "
                                  "than the largest this server takes (9223372036854775807"),
    "an empty body": (b"", NOT_JSON),
    "invalid UTF-8": (b'{"query": "caf\xe9", "documents": ["a"]}', NOT_JSON),
    "UTF-16": ('{"query": "q", "documents": ["a"]}'.encode("utf-16"), NOT_JSON),
    "NaN": (b'{"query": "q", "documents": ["a"], "deadline_ms": NaN}', NOT_JSON),
    "Infinity": (b'{"query": "q", "documents": ["a"], "deadline_ms": Infinity}', NOT_JSON),
    "a number beyond a double": (b'{"query": "q", "documents": ["a"], "top_n": 1e999}', NOT_JSON),
    "trailing data": (b'{"query": "q"} {"query": "q"}', NOT_JSON),
    "an array at the top": (b'[{"query": "q"}]', "request body must be a JSON object, got a JSON "
                                                 "array"),
    "a string at the top": (b'"q"', "request body must be a JSON object, got a JSON string"),
}


@pytest.fixture()
def server_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every log record of the server: the package's, and uvicorn's (whose logger does not
    propagate to the root)."""
    caplog.set_level(logging.DEBUG)
    uvicorn_logger = logging.getLogger("uvicorn")
    uvicorn_logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        uvicorn_logger.removeHandler(caplog.handler)


def bad_body_status(path: str) -> int:
    return 400 if path == "/v1/embeddings" else 422  # OpenAI answers 400; the others 422


def error_message(path: str, body: object) -> str:
    """The message of an error body, checking that it has the shape of `path`'s dialect."""
    assert isinstance(body, dict)
    dialect = DIALECT_OF_PATH[path]
    if dialect == "tei":
        assert body.keys() == {"error", "error_type"} and body["error_type"] == "Validation"
        return str(body["error"])
    if dialect == "openai":
        assert body.keys() == {"error"}
        assert body["error"].keys() == {"message", "type", "param", "code"}
        assert body["error"]["type"] == "invalid_request_error"
        return str(body["error"]["message"])
    assert body.keys() == {"message"}
    return str(body["message"])


CLIENT_LOGGERS = ("httpx", "httpcore")  # the test's own client, in the same process


def assert_no_traceback(log: pytest.LogCaptureFixture) -> None:
    """At most one line, and no traceback, logged by the server for the request."""
    records = [record for record in log.records if not record.name.startswith(CLIENT_LOGGERS)]
    lines = [f"{record.name}: {record.getMessage()}" for record in records]
    assert len(records) <= 1, lines
    for record in records:
        assert record.exc_info is None and "\n" not in record.getMessage(), lines
    assert not any("Traceback" in line or "RecursionError" in line for line in lines), lines


@pytest.mark.parametrize("path", POST_PATHS)
@pytest.mark.parametrize("name", list(HOSTILE_BODIES))
def test_hostile_body_is_a_4xx_in_the_dialect_with_no_traceback(
        rag_server: RunningServer, server_log: pytest.LogCaptureFixture, path: str,
        name: str) -> None:
    body, expected = HOSTILE_BODIES[name]
    response = rag_server.client.post(path, content=body, headers=JSON)
    assert response.status_code == bad_body_status(path), response.text
    assert expected in error_message(path, response.json())
    if DIALECT_OF_PATH[path] == "openai":  # OpenAI's param names the field at fault
        param = "top_n" if expected.startswith("field `top_n`") else None
        assert response.json()["error"]["param"] == param
    assert_no_traceback(server_log)


def test_the_not_json_message_says_what_the_server_takes(rag_server: RunningServer) -> None:
    response = rag_server.client.post("/v1/rerank", content=nested_list(50_000), headers=JSON)
    assert response.json()["message"] == (
        "request body is not valid JSON (depth limit exceeded: line 1 column 1026 (char 1025)); "
        f"send one JSON object in UTF-8, without NaN or Infinity, nested at most {MAX_NESTING} "
        "levels")


def test_nesting_up_to_the_limit_reaches_the_field_checks(
        rag_server: RunningServer, server_log: pytest.LogCaptureFixture) -> None:
    # The object itself is one level: a field nested MAX_NESTING - 1 levels is within the limit.
    body = b'{"query": "q", "documents": ["a"], "top_n": ' + nested_list(MAX_NESTING - 1) + b"}"
    response = rag_server.client.post("/v1/rerank", content=body, headers=JSON)
    assert response.status_code == 422
    assert response.json()["message"].startswith("field `top_n` must be an integer, got a JSON "
                                                 "array ([[[")
    assert_no_traceback(server_log)


def test_an_integer_beyond_unsigned_64_bits_is_a_field_error(rag_server: RunningServer) -> None:
    # orjson reads it as a float, which no integer field takes.
    body = b'{"query": "q", "documents": ["a"], "top_n": 99999999999999999999999}'
    response = rag_server.client.post("/v1/rerank", content=body, headers=JSON)
    assert response.status_code == 422
    assert response.json() == {"message": "field `top_n` must be an integer, got a JSON number "
                                          "(1e+23)"}


def test_a_utf8_byte_order_mark_is_ignored(rag_server: RunningServer) -> None:
    body = b'\xef\xbb\xbf{"query": "heat transfer", "documents": ["heat", "wing lift"]}'
    response = rag_server.client.post("/v1/rerank", content=body, headers=JSON)
    assert response.status_code == 200
    assert len(response.json()["results"]) == 2
