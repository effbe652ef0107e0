"""Request bodies of the three API dialects into one RerankCall, with errors that name the field.

The shapes follow the originals, field for field:

1. Cohere v1 and Jina (``POST /v1/rerank``): ``model``, ``query``, ``documents`` (strings or
   objects with a ``text`` field), ``top_n``, ``return_documents``, ``rank_fields``.
2. Cohere v2 (``POST /v2/rerank``): ``model``, ``query``, ``documents`` (strings), ``top_n``,
   ``max_tokens_per_doc``.
3. text-embeddings-inference (``POST /rerank``): ``query``, ``texts``, ``raw_scores``,
   ``return_text``, ``truncate``, ``truncation_direction``.

Fields a dialect does not define are ignored, so whatever else real clients send is tolerated.
Every dialect also takes ``deadline_ms`` and ``on_deadline`` (or the headers ``X-Deadline-Ms``
and ``X-On-Deadline``), and ``instruction`` (decoder rerankers: the prompt's task instruction).

Every endpoint (rerank, embeddings, search) reads its body through read_payload: one JSON object
in UTF-8, nested at most MAX_NESTING levels, with signed 64-bit integers. A body that fails any of
that is a 4xx naming what was wrong, in the endpoint's dialect, never a 500.
"""

from __future__ import annotations

import codecs
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from onnxrank.serve.config import ServeConfig
from onnxrank.serve.errors import Dialect, RequestError
from onnxrank.serve.jobs import read_body

if TYPE_CHECKING:
    from starlette.requests import Request

OnDeadline = Literal["error", "fallback"]
RERANK_PATHS: dict[str, Dialect] = {"/v1/rerank": "cohere_v1", "/v2/rerank": "cohere_v2",
                                    "/rerank": "tei"}
DEADLINE_HEADER = "x-deadline-ms"
ON_DEADLINE_HEADER = "x-on-deadline"
ON_DEADLINE_CHOICES: tuple[OnDeadline, ...] = ("error", "fallback")
# The deepest nesting a request body may have: the limit of serde_json's default deserializer,
# which text-embeddings-inference parses its bodies with. Deeper values would reach Python's
# recursion limit (1,000 frames) in code that walks them: json.dumps of a document echoed back,
# a value quoted in an error message, a search filter.
MAX_NESTING = 128
# orjson reads integers up to 2**64 - 1 (larger ones as floats); SQLite, where search options
# and filters go, stores signed 64-bit integers.
INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class RerankCall:
    """One parsed rerank request, whatever its dialect.

    Attributes:
        dialect: Which API shape it came in (and goes back out) in.
        query: The query.
        documents: Texts to score, in request order.
        originals: What the client sent for each document (a string or its object), echoed
            back by Cohere v1 when ``return_documents`` is true.
        top_n: Keep the best n; None keeps all.
        return_documents: Include each document in the answer.
        raw_scores: Answer raw logits instead of the manifest's activation (TEI only).
        truncate: False asks for a 422 when a pair is longer than the model's max_length (TEI).
        truncate_left: Keep the end of long documents instead of their start (TEI).
        max_tokens_per_doc: Cut each document to this many tokens first (Cohere v2).
        deadline_ms: Answer within this many milliseconds of arrival, or give up.
        on_deadline: "error" answers 503 at the deadline; "fallback" answers the documents in
            request (retrieval) order, flagged as not reranked.
        model: The ``model`` field as sent: the served model to use (None: the first rerank
            model).
        instruction: The task instruction of a decoder reranker's prompt (None: the model's
            default); a model without a prompt refuses one.
    """

    dialect: Dialect
    query: str
    documents: list[str]
    originals: list[Any]
    top_n: int | None = None
    return_documents: bool = False
    raw_scores: bool = False
    truncate: bool = True
    truncate_left: bool = False
    max_tokens_per_doc: int | None = None
    deadline_ms: float | None = None
    on_deadline: OnDeadline = "error"
    model: str | None = None
    instruction: str | None = None

    @property
    def characters(self) -> int:
        """Characters the engine reads: the query once per document plus every document."""
        return len(self.query) * len(self.documents) + sum(map(len, self.documents))


async def read_payload(request: Request, config: ServeConfig, *,
                       status: int = 422) -> dict[str, Any]:
    """The JSON object of a request's body: every endpoint reads its body here.

    Raises:
        RequestError: 413 naming --max-request-bytes for a body over the limit; `status` as
            decode_body.
        ClientGone: The client left before its body arrived.
    """
    return decode_body(await read_body(request, config.max_request_bytes), status=status)


def decode_body(body: bytes, *, status: int = 422) -> dict[str, Any]:
    """The JSON object of a request body, nested at most MAX_NESTING levels.

    Raises:
        RequestError: `status` (422; OpenAI answers 400) when the body is not JSON (invalid
            UTF-8, NaN or Infinity, a number beyond a double's range, nesting past orjson's
            1,024 levels), is not a JSON object, nests deeper than MAX_NESTING or holds an
            integer beyond INT64_MAX.
    """
    import orjson

    try:
        # json.loads took a UTF-8 byte order mark; RFC 8259 lets a parser ignore it.
        payload = orjson.loads(body.removeprefix(codecs.BOM_UTF8))
    except orjson.JSONDecodeError as err:
        raise RequestError(status, f"request body is not valid JSON ({err}); send one JSON "
                                   f"object in UTF-8, without NaN or Infinity, nested at most "
                                   f"{MAX_NESTING} levels") from err
    if not isinstance(payload, dict):
        raise RequestError(
            status, f"request body must be a JSON object, got a JSON {json_type(payload)}")
    _check_values(payload, status)
    return payload


def _check_values(payload: dict[str, Any], status: int) -> None:
    """Raise `status` naming the field that nests deeper than MAX_NESTING or holds an integer
    beyond INT64_MAX (walked level by level, so that the walk cannot reach the recursion limit).
    """
    level: list[tuple[str, Any]] = list(payload.items())
    depth = 1  # the body's object is the first level
    while level:
        inner: list[tuple[str, Any]] = []
        for name, value in level:
            if isinstance(value, (dict, list)):
                if depth == MAX_NESTING:
                    raise RequestError(
                        status, f"field `{name}` nests arrays and objects more than "
                                f"{MAX_NESTING} levels deep (the body counts as one); no field of "
                                "this API needs more than a few", param=name)
                items = value.values() if isinstance(value, dict) else value
                inner.extend((name, item) for item in items)
            elif type(value) is int and value > INT64_MAX:
                raise RequestError(
                    status, f"field `{name}` holds the integer {value}, more than the largest "
                            f"this server takes ({INT64_MAX}, a signed 64-bit integer)",
                    param=name)
        level = inner
        depth += 1


def parse_call(
    dialect: Dialect, payload: dict[str, Any], headers: Mapping[str, str], config: ServeConfig
) -> RerankCall:
    """Check a decoded body of `dialect` and turn it into a RerankCall.

    Raises:
        RequestError: 422 naming the field for a missing field, a wrong type or an empty query;
            400 for TEI's empty ``texts`` (as TEI answers); 413 naming the limit when the
            request has more documents or characters than the server takes.
    """
    query = payload.get("query")
    if "query" not in payload:
        raise RequestError(422, "missing field `query`: a non-empty string is required")
    if not isinstance(query, str):
        raise RequestError(422, f"field `query` must be a string, got a JSON {json_type(query)}")
    if not query.strip():
        raise RequestError(422, f"field `query` must be a non-empty string, got {query!r}")
    model = optional_field(payload, "model", str)
    instruction = optional_field(payload, "instruction", str)
    if instruction is not None and not instruction.strip():
        raise RequestError(422, f"field `instruction` must be a non-empty string (omit it for the "
                                f"model's default), got {instruction!r}", param="instruction")
    deadline_ms, on_deadline = parse_deadline(payload, headers, config)
    common: dict[str, Any] = {"dialect": dialect, "query": query, "model": model,
                              "deadline_ms": deadline_ms, "on_deadline": on_deadline,
                              "instruction": instruction}
    if dialect == "tei":
        documents = _documents(payload, "texts", allow_objects=False, allow_empty=False)
        direction = payload.get("truncation_direction", "right")
        if direction not in ("left", "Left", "right", "Right"):
            raise RequestError(422, "field `truncation_direction` must be \"Left\" or \"Right\", "
                                    f"got {json.dumps(direction)}")
        truncate = optional_field(payload, "truncate", bool)
        call = RerankCall(
            documents=documents, originals=list(documents),
            raw_scores=bool(optional_field(payload, "raw_scores", bool)),
            return_documents=bool(optional_field(payload, "return_text", bool)),
            truncate=truncate is not False, truncate_left=direction.lower() == "left",
            **common,
        )
    else:
        top_n = optional_field(payload, "top_n", int)
        if top_n is not None and top_n < 1:
            raise RequestError(422, f"field `top_n` must be a positive integer, got {top_n}")
        if dialect == "cohere_v1":
            originals = _documents(payload, "documents", allow_objects=True, allow_empty=True)
            rank_fields = _rank_fields(payload)
            documents = [_document_text(item, index, rank_fields)
                         for index, item in enumerate(originals)]
            call = RerankCall(
                documents=documents, originals=originals, top_n=top_n,
                return_documents=bool(optional_field(payload, "return_documents", bool)), **common,
            )
        else:
            documents = _documents(payload, "documents", allow_objects=False, allow_empty=True)
            max_tokens = optional_field(payload, "max_tokens_per_doc", int)
            if max_tokens is not None and max_tokens < 1:
                raise RequestError(422, "field `max_tokens_per_doc` must be a positive integer, "
                                        f"got {max_tokens}")
            call = RerankCall(documents=documents, originals=list(documents), top_n=top_n,
                              max_tokens_per_doc=max_tokens, **common)
    check_size(call, config)
    return call


def check_size(call: RerankCall, config: ServeConfig) -> None:
    """Raise 413 when `call` exceeds the server's document or character limit."""
    field_name = "texts" if call.dialect == "tei" else "documents"
    if len(call.documents) > config.max_documents:
        raise RequestError(
            413, f"`{field_name}` has {len(call.documents)} entries, more than this server's "
                 f"limit of {config.max_documents} (--max-documents); split the request")
    if call.characters > config.max_characters:
        raise RequestError(
            413, f"the request has {call.characters} characters (the query counted once per "
                 f"document), more than this server's limit of {config.max_characters} "
                 "(--max-characters); split the request")


def json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


_EXPECTED = {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}


def optional_field(payload: Mapping[str, Any], name: str, kind: type, *,
                   status: int = 422) -> Any:
    """The field's value, None when absent or null; `status` when it has another type."""
    value = payload.get(name)
    if value is None:
        return None
    # bool is an int in Python; JSON true is not an integer.
    wrong = not isinstance(value, kind) or (kind is int and isinstance(value, bool))
    if wrong:
        raise RequestError(
            status, f"field `{name}` must be {_EXPECTED[kind]}, got a JSON {json_type(value)} "
                    f"({json.dumps(value)[:40]})", param=name)
    return value


def _documents(
    payload: Mapping[str, Any], name: str, *, allow_objects: bool, allow_empty: bool
) -> list[Any]:
    if name not in payload:
        raise RequestError(422, f"missing field `{name}`: a list of strings is required")
    items = payload[name]
    if not isinstance(items, list):
        raise RequestError(
            422, f"field `{name}` must be a list of strings, got a JSON {json_type(items)}")
    if not items and not allow_empty:
        # TEI answers an empty batch with 400 and error_type Empty.
        raise RequestError(400, f"`{name}` cannot be empty")
    for index, item in enumerate(items):
        if isinstance(item, str):
            continue
        if allow_objects and isinstance(item, dict):
            continue
        allowed = "a string or an object with a `text` string" if allow_objects else "a string"
        raise RequestError(
            422, f"`{name}[{index}]` must be {allowed}, got a JSON {json_type(item)}")
    return list(items)


def _rank_fields(payload: Mapping[str, Any]) -> list[str] | None:
    fields = payload.get("rank_fields")
    if fields is None:
        return None
    if not isinstance(fields, list) or not all(isinstance(name, str) for name in fields) \
            or not fields:
        raise RequestError(422, "field `rank_fields` must be a non-empty list of strings, got "
                                f"{json.dumps(fields)[:60]}")
    return fields


def _document_text(item: Any, index: int, rank_fields: list[str] | None) -> str:
    """The text scored for one Cohere v1 document (a string, or an object's fields)."""
    if isinstance(item, str):
        return item
    if rank_fields is None or rank_fields == ["text"]:
        text = item.get("text")
        if not isinstance(text, str):
            raise RequestError(
                422, f"`documents[{index}].text` must be a string, got a JSON {json_type(text)}")
        return text
    # Several fields: "name: value" lines in rank_fields order, as Cohere's YAML advice for
    # structured documents; missing fields are skipped.
    lines = []
    for name in rank_fields:
        if name in item:
            value = item[name]
            lines.append(f"{name}: {value if isinstance(value, str) else json.dumps(value)}")
    if not lines:
        raise RequestError(422, f"`documents[{index}]` has none of the rank_fields {rank_fields}")
    return "\n".join(lines)


def parse_deadline(
    payload: Mapping[str, Any], headers: Mapping[str, str], config: ServeConfig, *,
    status: int = 422,
) -> tuple[float | None, OnDeadline]:
    """The request's deadline (ms from arrival, or None) and what to do when it passes.

    Raises:
        RequestError: `status` naming the field or header with a bad value.
    """
    value: Any = payload.get("deadline_ms")
    source = "field `deadline_ms`"
    if value is None and DEADLINE_HEADER in headers:
        source = "header X-Deadline-Ms"
        try:
            value = float(headers[DEADLINE_HEADER])
        except ValueError as err:
            raise RequestError(status, f"{source} must be a number of milliseconds, got "
                                    f"{headers[DEADLINE_HEADER]!r}") from err
    if value is None:
        value = config.default_deadline_ms
    elif isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise RequestError(status, f"{source} must be a positive number of milliseconds, got "
                                f"{json.dumps(value)[:40]}")
    on_deadline = payload.get("on_deadline", headers.get(ON_DEADLINE_HEADER, "error"))
    if on_deadline not in ON_DEADLINE_CHOICES:
        raise RequestError(status, "field `on_deadline` (or header X-On-Deadline) must be "
                                f"\"error\" or \"fallback\", got {json.dumps(on_deadline)[:40]}")
    return (None if value is None else float(value)), on_deadline
