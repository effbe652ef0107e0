"""The embedding endpoints: OpenAI's ``POST /v1/embeddings`` and text-embeddings-inference's
``POST /embed``, parsed into one EmbedCall and run through the model's Batcher.

The shapes follow the originals, field for field:

1. OpenAI (``/v1/embeddings``): ``input`` (a string or a list of strings; token-id arrays are
   refused), ``model``, ``encoding_format`` ("float", or "base64": the little-endian float32
   bytes of each vector, as the openai SDK decodes them), ``dimensions`` (only the model's own:
   no served model is trained for shortened vectors), ``user`` (ignored). Answer:
   ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
   "usage": {"prompt_tokens", "total_tokens"}}``. Errors: 400 (OpenAI's status for a bad
   request), 404 for an unknown model.
2. text-embeddings-inference (``/embed``): ``inputs`` (a string or a list of strings),
   ``normalize`` (true; the served models normalise inside their graph, so false is refused),
   ``truncate`` (true here, as a TEI server run with ``--auto-truncate``: false answers 413 for
   an input longer than the model's max_length, as TEI does), ``truncation_direction``
   ("Right" only), ``dimensions``. Answer: a list of vectors.

Both take ``deadline_ms`` (or the header ``X-Deadline-Ms``) as the rerank endpoints do.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxrank.serve.errors import Dialect, RequestError
from onnxrank.serve.jobs import DeadlineMissed, ms, run_job
from onnxrank.serve.parsing import json_type, optional_field, parse_deadline, read_payload

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from onnxrank.serve.config import ServeConfig
    from onnxrank.serve.registry import ServedModel
    from onnxrank.serve.state import ServerState

EMBEDDING_PATHS: dict[str, Dialect] = {"/v1/embeddings": "openai", "/embed": "tei"}
ENCODING_FORMATS = ("float", "base64")


@dataclass(frozen=True, slots=True)
class EmbedCall:
    """One parsed embedding request, whatever its dialect.

    Attributes:
        dialect: The API shape it came in (and goes back out) in.
        texts: Texts to embed, in request order.
        model: The ``model`` field as sent (None: the first embedding model).
        encoding_format: "float" or "base64" (OpenAI).
        dimensions: The vector size asked for, or None.
        truncate: False asks for a 413 when a text is longer than the model's max_length (TEI).
        deadline_ms: Answer within this many milliseconds of arrival, or 503.
    """

    dialect: Dialect
    texts: list[str]
    model: str | None = None
    encoding_format: str = "float"
    dimensions: int | None = None
    truncate: bool = True
    deadline_ms: float | None = None

    @property
    def characters(self) -> int:
        """Characters the engine reads."""
        return sum(map(len, self.texts))


def parse_embed_call(dialect: Dialect, payload: dict[str, Any], headers: Mapping[str, str],
                     config: ServeConfig) -> EmbedCall:
    """Check a decoded body of `dialect` and turn it into an EmbedCall.

    Raises:
        RequestError: Naming the field: OpenAI answers 400, TEI 422 (400 ``Empty`` for empty
            inputs, as TEI); 413 naming the limit for more texts or characters than the server
            takes.
    """
    status = 400 if dialect == "openai" else 422
    name = "input" if dialect == "openai" else "inputs"
    texts = _texts(payload, name, status=status, empty_status=400)
    deadline_ms, on_deadline = parse_deadline(payload, headers, config, status=status)
    if on_deadline != "error":
        raise RequestError(status, "field `on_deadline` \"fallback\" applies to the rerank "
                                   "endpoints only (an embedding has no order to fall back to); "
                                   "omit it", param="on_deadline")
    dimensions = optional_field(payload, "dimensions", int, status=status)
    if dimensions is not None and dimensions < 1:
        raise RequestError(status, f"field `dimensions` must be a positive integer, got "
                                   f"{dimensions}", param="dimensions")
    common: dict[str, Any] = {"dialect": dialect, "texts": texts, "dimensions": dimensions,
                              "deadline_ms": deadline_ms,
                              "model": optional_field(payload, "model", str, status=status)}
    if dialect == "openai":
        encoding = payload.get("encoding_format", "float")
        if encoding not in ENCODING_FORMATS:
            raise RequestError(400, "field `encoding_format` must be \"float\" or \"base64\", got "
                                    f"{json.dumps(encoding)[:40]}", param="encoding_format")
        call = EmbedCall(encoding_format=encoding, **common)
    else:
        if optional_field(payload, "normalize", bool) is False:
            raise RequestError(422, "field `normalize` false is not available: the served "
                                    "embedding models L2-normalise inside their graph; omit it or "
                                    "send true")
        direction = payload.get("truncation_direction", "right")
        if direction not in ("right", "Right"):
            raise RequestError(422, "field `truncation_direction` must be \"Right\" (the "
                                    "embedder keeps the start of a long text), got "
                                    f"{json.dumps(direction)[:40]}")
        truncate = optional_field(payload, "truncate", bool)
        call = EmbedCall(truncate=truncate is not False, **common)
    _check_size(call, config, name)
    return call


def _texts(payload: Mapping[str, Any], name: str, *, status: int, empty_status: int) -> list[str]:
    if name not in payload:
        raise RequestError(status, f"missing field `{name}`: a string or a list of strings is "
                                   "required", param=name)
    value = payload[name]
    if isinstance(value, str):
        texts = [value]
    elif isinstance(value, list):
        texts = value
    else:
        raise RequestError(status, f"field `{name}` must be a string or a list of strings, got a "
                                   f"JSON {json_type(value)}", param=name)
    if not texts:
        raise RequestError(empty_status, f"`{name}` cannot be empty", param=name)
    for index, text in enumerate(texts):
        if isinstance(text, (int, list)) and not isinstance(text, bool):
            raise RequestError(status, f"field `{name}` holds token ids ({name}[{index}] is a "
                                       f"JSON {json_type(text)}): this server embeds text only; "
                                       "send the text as a string or a list of strings",
                               param=name)
        if not isinstance(text, str):
            raise RequestError(status, f"`{name}[{index}]` must be a string, got a JSON "
                                       f"{json_type(text)}", param=name)
        if not text.strip():
            raise RequestError(status, f"`{name}[{index}]` must be a non-empty string, got "
                                       f"{text!r}", param=name)
    return list(texts)


def _check_size(call: EmbedCall, config: ServeConfig, name: str) -> None:
    if len(call.texts) > config.max_documents:
        raise RequestError(
            413, f"`{name}` has {len(call.texts)} texts, more than this server's limit of "
                 f"{config.max_documents} (--max-documents); split the request", param=name)
    if call.characters > config.max_characters:
        raise RequestError(
            413, f"the request has {call.characters} characters, more than this server's limit "
                 f"of {config.max_characters} (--max-characters); split the request", param=name)


def _check_dimensions(call: EmbedCall, model: ServedModel) -> None:
    dim = int(model.embedding_task.embedder.dim)
    if call.dimensions is not None and call.dimensions != dim:
        raise RequestError(
            400 if call.dialect == "openai" else 422,
            f"model {model.id!r} does not support field `dimensions` ({call.dimensions}): its "
            f"embeddings have {dim} dimensions and it was not trained to shorten them; omit "
            f"`dimensions` or send {dim}", param="dimensions")


async def _check_tokens(call: EmbedCall, model: ServedModel, max_tokens: int | None) -> None:
    """TEI's ``truncate: false`` and the server's --max-tokens, on the texts' token counts."""
    if call.truncate and max_tokens is None:
        return
    from starlette.concurrency import run_in_threadpool

    counts = await run_in_threadpool(model.embedding_task.count_tokens, call.texts,
                                     truncate=call.truncate)
    name = "input" if call.dialect == "openai" else "inputs"
    if not call.truncate:
        for index, count in enumerate(counts):
            if count > model.max_length:
                # TEI's message and status (413, ErrorType::Validation).
                raise RequestError(
                    413, f"Input validation error: `inputs` must have less than "
                         f"{model.max_length} tokens. Given: {count} ({name}[{index}]); send "
                         "\"truncate\": true to cut it", param=name)
    total = sum(min(count, model.max_length) for count in counts)
    if max_tokens is not None and total > max_tokens:
        raise RequestError(
            413, f"the request is {total} tokens as the model sees them, more than this "
                 f"server's limit of {max_tokens} (--max-tokens); split the request", param=name)


async def embed(state: ServerState, dialect: Dialect, request: Request) -> Response:
    """Answer ``POST /v1/embeddings`` or ``POST /embed``."""
    started = time.perf_counter()
    config = state.config
    payload = await read_payload(request, config, status=400 if dialect == "openai" else 422)
    call = parse_embed_call(dialect, payload, request.headers, config)
    model = state.models.pick(call.model, "embedding", dialect, request.url.path)
    _check_dimensions(call, model)
    await _check_tokens(call, model, config.max_tokens)
    deadline = None if call.deadline_ms is None else started + call.deadline_ms / 1000.0
    try:
        result = await run_job(model, request, call.texts, deadline)
    except DeadlineMissed as missed:
        why = (f"{missed.why} ({call.deadline_ms:g} ms)" if missed.at_arrival else
               f"the deadline of {call.deadline_ms:g} ms passed before the texts were embedded")
        raise RequestError(503, why) from missed
    return _embeddings_response(model, call, result, started)


def _embeddings_response(model: ServedModel, call: EmbedCall, result: Any,
                         started: float) -> Response:
    import orjson
    from starlette.responses import Response

    vectors = np.asarray(result.values, dtype=np.float32)
    tokens = int(np.sum(result.token_counts))
    body: Any
    if call.dialect == "openai":
        if call.encoding_format == "base64":
            little_endian = vectors.astype("<f4", copy=False)
            embeddings: list[Any] = [base64.b64encode(row.tobytes()).decode("ascii")
                                     for row in little_endian]
        else:
            embeddings = list(vectors)
        body = {"object": "list",
                "data": [{"object": "embedding", "index": index, "embedding": embedding}
                         for index, embedding in enumerate(embeddings)],
                "model": model.id, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    else:
        body = vectors
    # orjson writes each float32 as the shortest decimal that reads back to it (json would
    # write float64 digits: twice the bytes, and 20x the time on a 2-core server).
    response = Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
                        media_type="application/json")
    headers = response.headers
    headers["x-compute-type"] = model.engine.device_info.device
    headers["x-compute-characters"] = str(call.characters)
    headers["x-compute-tokens"] = str(tokens)
    headers["x-compute-time"] = str(ms(time.perf_counter() - started))
    headers["x-queue-time"] = str(int(result.queue_ms))
    headers["x-tokenization-time"] = str(int(result.tokenize_ms))
    headers["x-inference-time"] = str(int(result.inference_ms))
    headers["x-onnxrank-batch-requests"] = str(result.run_requests)
    headers["x-onnxrank-batch-texts"] = str(result.run_items)
    return response
