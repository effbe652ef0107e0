"""The ASGI app: routes, request parsing, status codes and answers in each API family's shape.

Scoring stays in the engine (``Reranker.score_detailed`` through the Batcher); this module owns
HTTP only. See docs/serve.md for the endpoints.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxrank._optional import require
from onnxrank.serve.batcher import (
    Batcher,
    DeadlineExpiredError,
    DeadlineUnreachableError,
    Job,
    JobResult,
    QueueFullError,
    ShuttingDownError,
)
from onnxrank.serve.config import ServeConfig
from onnxrank.serve.documents import needs_tokens, prepare_documents
from onnxrank.serve.metrics import ServerMetrics
from onnxrank.serve.parsing import (
    FAMILY_OF_PATH,
    TEI_ERROR_TYPE,
    Family,
    RequestError,
    RerankCall,
    decode_body,
    parse_call,
)

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

    from onnxrank.engine.reranker import Reranker

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PUBLIC_PATHS = frozenset({"/health"})
KNOWN_PATHS = frozenset({*FAMILY_OF_PATH, "/health", "/ready", "/metrics", "/v1/models"})
# Cohere bills one search unit per query with up to 100 documents.
DOCUMENTS_PER_SEARCH_UNIT = 100
# nginx's code for "client closed the request": the status recorded for requests whose client
# left before the answer (nobody receives it).
CLIENT_CLOSED_STATUS = 499


@dataclass
class ServerState:
    """What the handlers share: the engine, the settings, the queue and the metrics."""

    reranker: Reranker
    config: ServeConfig
    metrics: ServerMetrics
    batcher: Batcher
    model_id: str
    created: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False

    @property
    def max_length(self) -> int:
        """Tokens per (query, document) row the engine runs (the config's, else the manifest's)."""
        return int(self.reranker.config.max_length or self.reranker.spec.max_length)

    @property
    def warning(self) -> str | None:
        """The label every answer carries when the model's scores are not relevance scores."""
        if self.reranker.spec.relevance_trained:
            return None
        return (f"model {self.model_id} is not relevance-trained: its scores are NOT relevance "
                "scores (speed measurements only)")


def create_app(reranker: Reranker, config: ServeConfig | None = None) -> Starlette:
    """The rerank server as an ASGI app (serve it with uvicorn, or `onnxrank serve`).

    The engine worker starts with the app's lifespan and warms the model up; ``/ready`` answers
    200 once it has. On lifespan shutdown the queue is finished, then the worker ends.

    Args:
        reranker: The loaded engine; the server scores only through ``score_detailed``.
        config: Server settings; None uses the defaults.

    Returns:
        A Starlette app.

    Raises:
        MissingDependencyError: The `serve` extra is not installed.
    """
    require("starlette", extra="serve")
    from starlette.applications import Starlette
    from starlette.routing import Route

    config = config or ServeConfig()
    metrics = ServerMetrics()
    batcher = Batcher(reranker.score_detailed, metrics, max_queue=config.max_queue,
                      merge=config.batching, window_s=config.batch_window_ms / 1000.0)
    state = ServerState(reranker=reranker, config=config, metrics=metrics, batcher=batcher,
                        model_id=config.model_id or reranker.spec.name)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        batcher.start()
        try:
            yield
        finally:
            state.draining = True
            # Blocking join of the worker: run it off the event loop so answers still go out.
            await asyncio.get_running_loop().run_in_executor(
                None, batcher.stop, config.shutdown_timeout_s)

    def rerank_route(path: str) -> Route:
        family = FAMILY_OF_PATH[path]

        async def endpoint(request: Request) -> Response:
            return await _rerank(state, family, request)

        return Route(path, endpoint, methods=["POST"])

    def get_route(path: str, answer: Callable[[ServerState], Response]) -> Route:
        async def endpoint(request: Request) -> Response:
            return answer(state)

        return Route(path, endpoint, methods=["GET"])

    routes = [
        *(rerank_route(path) for path in FAMILY_OF_PATH),
        get_route("/health", _health),
        get_route("/ready", _ready),
        get_route("/metrics", _metrics),
        get_route("/v1/models", _models),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.server = state
    app.add_middleware(_Gate, state=state)
    return app


# --- the gate: API key and the answer count --------------------------------------------------


class _Gate:
    """Checks the API key before routing and counts every answer by endpoint and status."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state
        key = state.config.api_key
        self._expected = None if key is None else f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        endpoint = path if path in KNOWN_PATHS else "other"
        counted = False

        async def counting_send(message: Message) -> None:
            nonlocal counted
            if message["type"] == "http.response.start" and not counted:
                counted = True
                self.state.metrics.requests.labels(endpoint=endpoint,
                                                   status=str(message["status"])).inc()
            await send(message)

        if (self._expected is not None and path not in PUBLIC_PATHS
                and not _authorized(scope, self._expected)):
            # Same answer for a missing and a wrong key, on every path, known or not.
            response = _error_response(FAMILY_OF_PATH.get(path), RequestError(401, "unauthorized"))
            response.headers["www-authenticate"] = "Bearer"
            await response(scope, receive, counting_send)
            return
        await self.app(scope, receive, counting_send)



def _authorized(scope: Scope, expected: bytes) -> bool:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return hmac.compare_digest(value, expected)
    return False


# --- endpoints ---------------------------------------------------------------------------------


def _health(state: ServerState) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse({"status": "ok"})


def _ready(state: ServerState) -> Response:
    from starlette.responses import JSONResponse

    if state.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if not state.batcher.ready.is_set():
        return JSONResponse({"status": "loading"}, status_code=503)
    return JSONResponse({"status": "ready", "model": state.model_id})


def _metrics(state: ServerState) -> Response:
    from starlette.responses import Response

    body, content_type = state.metrics.exposition()
    return Response(body, media_type=content_type)


def _models(state: ServerState) -> Response:
    from starlette.responses import JSONResponse

    spec = state.reranker.spec
    return JSONResponse({"object": "list", "data": [{
        "id": state.model_id, "object": "model", "created": state.created,
        "owned_by": "onnxrank", "max_length": state.max_length,
        "relevance_trained": spec.relevance_trained,
        "device": state.reranker.device_info.device,
        "variant": state.reranker.device_info.variant,
    }]})


async def _rerank(state: ServerState, family: Family, request: Request) -> Response:
    started = time.perf_counter()
    try:
        response = await _answer(state, family, request, started)
    except RequestError as err:
        response = _error_response(family, err)
    except Exception as err:  # a bug: still one answer, in the family's shape, and counted
        logger.exception("rerank request failed")
        response = _error_response(family, RequestError(500, f"internal error: {err!r}"))
    response.headers["x-total-time"] = str(_ms(time.perf_counter() - started))
    state.metrics.request_seconds.labels(endpoint=request.url.path).observe(
        time.perf_counter() - started)
    return response


async def _answer(state: ServerState, family: Family, request: Request, started: float) -> Response:
    if state.draining:
        raise RequestError(503, "the server is shutting down; send the request to another replica")
    if not state.batcher.ready.is_set():
        raise RequestError(503, "the model is still warming up; retry when /ready answers 200")
    from starlette.requests import ClientDisconnect
    from starlette.responses import Response

    config = state.config
    try:
        body = await _read_body(request, config.max_request_bytes)
    except ClientDisconnect:  # gone before its body arrived: nothing to answer, nothing queued
        return Response(status_code=CLIENT_CLOSED_STATUS)
    call = parse_call(family, decode_body(body), request.headers, config)
    if needs_tokens(call, config.max_tokens):
        from starlette.concurrency import run_in_threadpool

        call = await run_in_threadpool(
            prepare_documents, call, state.reranker.tokenizer,
            max_length=state.max_length, max_tokens=config.max_tokens)
    if not call.documents:
        return _ranked_response(state, call, None, started)
    deadline = None if call.deadline_ms is None else started + call.deadline_ms / 1000.0
    loop = asyncio.get_running_loop()
    job = Job(pairs=[(call.query, document) for document in call.documents],
              future=loop.create_future(), loop=loop, deadline=deadline)
    try:
        state.batcher.submit(job)
    except QueueFullError as err:
        raise RequestError(429, str(err), retry_after_s=err.retry_after_s) from err
    except ShuttingDownError as err:
        raise RequestError(503, str(err)) from err
    except DeadlineUnreachableError as err:
        # answered now rather than after a wait that would end in the same answer
        return _missed_deadline(state, call, started, f"{err} ({call.deadline_ms:g} ms)")
    outcome = await _wait(state, request, job, deadline)
    if isinstance(outcome, JobResult):
        return _ranked_response(state, call, outcome, started)
    if outcome == "client_disconnected":
        return Response(status_code=CLIENT_CLOSED_STATUS)
    return _missed_deadline(
        state, call, started,
        f"the deadline of {call.deadline_ms:g} ms passed before the request was scored")


def _missed_deadline(state: ServerState, call: RerankCall, started: float, why: str) -> Response:
    """The retrieval order flagged as not reranked when the request asked for it, else a 503."""
    if call.on_deadline == "fallback":
        return _ranked_response(state, call, None, started, reranked=False)
    raise RequestError(
        503, f"{why}; send \"on_deadline\": \"fallback\" to get the retrieval order instead")


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the request body is {declared} bytes, more than this server's "
                                f"limit of {limit} bytes (--max-request-bytes)")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"the request body is more than this server's limit of "
                                    f"{limit} bytes (--max-request-bytes)")
        chunks.append(chunk)
    return b"".join(chunks)


async def _wait(
    state: ServerState, request: Request, job: Job, deadline: float | None
) -> JobResult | str:
    """The job's result, or why the request stopped waiting ("client_disconnected", "deadline").

    Raises:
        RequestError: 500 (424 for TEI) when the engine failed, 503 when the server stopped.
    """
    disconnect: asyncio.Future[Any] = asyncio.ensure_future(_client_gone(request))
    waiters: set[asyncio.Future[Any]] = {job.future, disconnect}
    try:
        timeout = None if deadline is None else max(0.0, deadline - time.perf_counter())
        done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        disconnect.cancel()
    if job.future.done():
        error = job.future.exception()
        if error is None:
            return job.future.result()
        if isinstance(error, DeadlineExpiredError):
            return "deadline"
        if isinstance(error, ShuttingDownError):
            raise RequestError(503, str(error)) from error
        raise RequestError(500, f"inference failed: {error}") from error
    reason = "client_disconnected" if disconnect in done else "deadline"
    state.batcher.withdraw(job, reason)
    job.future.cancel()  # a result that still comes is dropped
    return reason


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body was read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
        await asyncio.sleep(0.05)  # not expected after the body; never spin


# --- answers -----------------------------------------------------------------------------------


def _ms(seconds: float) -> int:
    return int(seconds * 1000.0)


def _ranked_response(
    state: ServerState, call: RerankCall, result: JobResult | None, started: float,
    *, reranked: bool = True,
) -> Response:
    """The success answer of `call` in its family's shape (retrieval order when not reranked)."""
    from starlette.responses import JSONResponse

    count = len(call.documents)
    if result is not None:
        logits = np.asarray(result.scores, dtype=np.float32)
        values = (logits.astype(np.float64) if call.raw_scores
                  else np.asarray(state.reranker.activate(logits), dtype=np.float64))
        # Best first; equal scores keep request order.
        order = np.lexsort((np.arange(count), -values))
        tokens = int(np.sum(result.token_counts))
    else:
        values = np.zeros(count, dtype=np.float64)
        order = np.arange(count)
        tokens = 0
    if call.top_n is not None:
        order = order[: call.top_n]
    flag = {} if reranked else {"reranked": False}
    warnings = [] if state.warning is None else [state.warning]
    if not reranked:
        warnings.append(f"the deadline of {call.deadline_ms:g} ms passed: documents are in "
                        "request (retrieval) order, NOT reranked, and their scores are 0")
    body: Any
    if call.family == "tei":
        body = [
            {"index": int(index),
             **({"text": call.documents[index]} if call.return_documents else {}),
             "score": float(values[index]), **flag}
            for index in order
        ]
    else:
        results = []
        for index in order:
            item: dict[str, Any] = {"index": int(index), "relevance_score": float(values[index])}
            if call.return_documents:
                original = call.originals[index]
                item["document"] = original if isinstance(original, dict) else {"text": original}
            results.append({**item, **flag})
        version = "1" if call.family == "cohere_v1" else "2"
        meta: dict[str, Any] = {
            "api_version": {"version": version},
            "billed_units": {"search_units": math.ceil(count / DOCUMENTS_PER_SEARCH_UNIT)},
            "tokens": {"input_tokens": tokens},
        }
        if warnings:
            meta["warnings"] = warnings
        body = {"id": str(uuid.uuid4()), "results": results, "meta": meta}
        if call.family == "cohere_v1":  # Jina's fields, in the same answer
            body.update({"model": state.model_id, "usage": {"total_tokens": tokens}})
    response = JSONResponse(body)
    headers = response.headers
    headers["x-compute-type"] = state.reranker.device_info.device
    headers["x-compute-characters"] = str(call.characters)
    headers["x-compute-tokens"] = str(tokens)
    headers["x-compute-time"] = str(_ms(time.perf_counter() - started))
    if result is not None:
        headers["x-queue-time"] = str(int(result.queue_ms))
        headers["x-tokenization-time"] = str(int(result.tokenize_ms))
        headers["x-inference-time"] = str(int(result.inference_ms))
        headers["x-onnxrank-batch-requests"] = str(result.run_requests)
        headers["x-onnxrank-batch-pairs"] = str(result.run_pairs)
    headers["x-onnxrank-reranked"] = "true" if reranked else "false"
    if state.warning is not None:
        headers["x-onnxrank-warning"] = state.warning
    return response


def _error_response(family: Family | None, error: RequestError) -> Response:
    """An error in the family's shape: Cohere ``{"message"}``, TEI ``{"error", "error_type"}``."""
    from starlette.responses import JSONResponse, Response

    status = error.status
    if family == "tei":
        if status == 401:  # TEI answers a bad key with a bare 401
            response: Response = Response(status_code=401)
        else:
            # TEI answers a failed inference with 424 (ErrorType::Backend).
            status = 424 if status == 500 else status
            response = JSONResponse(
                {"error": error.message, "error_type": TEI_ERROR_TYPE.get(status, "Backend")},
                status_code=status)
    else:
        response = JSONResponse({"message": error.message}, status_code=status)
    if error.retry_after_s is not None:
        response.headers["retry-after"] = str(error.retry_after_s)
    return response
