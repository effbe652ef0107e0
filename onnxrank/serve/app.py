"""The ASGI app: routes, the API key gate, the answer count, and the rerank endpoints.

Scoring and embedding stay in the engines (through each model's Batcher); this module and its
siblings own HTTP only: rerank here, embeddings in embeddings.py, search in search.py. See
docs/serve.md for the endpoints.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxrank._optional import require
from onnxrank.engine.ranking import rank_order
from onnxrank.engine.reranker import DecoderReranker
from onnxrank.serve.batcher import Batcher, JobResult
from onnxrank.serve.config import ServeConfig
from onnxrank.serve.documents import needs_tokens, prepare_documents
from onnxrank.serve.embeddings import EMBEDDING_PATHS, embed
from onnxrank.serve.errors import Dialect, RequestError, error_response
from onnxrank.serve.jobs import CLIENT_CLOSED_STATUS, ClientGone, DeadlineMissed, ms, run_job
from onnxrank.serve.metrics import ServerMetrics
from onnxrank.serve.parsing import RERANK_PATHS, RerankCall, parse_call, read_payload
from onnxrank.serve.registry import ModelSet, ServedModel
from onnxrank.serve.search import SEARCH_PATH, search
from onnxrank.serve.search_service import SearchService
from onnxrank.serve.state import ServerState
from onnxrank.serve.tasks import task_for

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

    from onnxrank.engine.embedder import Embedder
    from onnxrank.engine.reranker import Reranker
    from onnxrank.retrieval.hybrid import HybridRetriever

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PUBLIC_PATHS = frozenset({"/health"})
# The error shape of each POST path; every other path answers its only error, the 401, in
# Cohere's {"message"} shape, the same for a route and a missing one.
DIALECT_OF_PATH: dict[str, Dialect] = {**RERANK_PATHS, **EMBEDDING_PATHS, SEARCH_PATH: "openai"}
KNOWN_PATHS = frozenset({*DIALECT_OF_PATH, "/health", "/ready", "/metrics", "/v1/models"})
# Cohere bills one search unit per query with up to 100 documents.
DOCUMENTS_PER_SEARCH_UNIT = 100


def create_app(models: Mapping[str, Reranker | Embedder] | Reranker | Embedder,
               config: ServeConfig | None = None, *,
               retriever: HybridRetriever | None = None) -> Starlette:
    """The server as an ASGI app (serve it with uvicorn, or `onnxrank serve`).

    Each model gets its own queue and engine worker, which start with the app's lifespan and warm
    their model up; ``/ready`` answers 200 once every model is warm. On lifespan shutdown the
    queues are finished, then the workers end.

    Args:
        models: Served models by the id clients put in ``model``, in order (the first of each
            task is the default of requests that name none); a single engine is served under
            its manifest's name. Each engine's task (rerank or embedding) comes from its manifest.
        config: Server settings; None uses the defaults.
        retriever: An opened index for ``POST /v1/search``; None: no search endpoint (404).

    Returns:
        A Starlette app.

    Raises:
        MissingDependencyError: The `serve` extra is not installed.
        ValueError: No models.
    """
    require("starlette", extra="serve")
    from starlette.applications import Starlette
    from starlette.routing import Route

    config = config or ServeConfig()
    engines: Mapping[str, Reranker | Embedder] = (models if isinstance(models, Mapping)
                                                   else {models.spec.name: models})
    metrics = ServerMetrics(tuple(engines))
    served = ModelSet([
        ServedModel(id=name, engine=engine, batcher=Batcher(
            task_for(engine), metrics, model=name, max_queue=config.max_queue,
            merge=config.batching, window_s=config.batch_window_ms / 1000.0))
        for name, engine in engines.items()
    ])
    state = ServerState(models=served, config=config, metrics=metrics)
    if retriever is not None:
        state.search = SearchService(retriever, max_waiting=config.max_queue)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for model in served:
            model.batcher.start()
        try:
            yield
        finally:
            state.draining = True
            # Blocking joins of the workers: run them off the event loop so answers still go out.
            loop = asyncio.get_running_loop()
            await asyncio.gather(*(
                loop.run_in_executor(None, model.batcher.stop, config.shutdown_timeout_s)
                for model in served))
            if state.search is not None:
                await loop.run_in_executor(None, state.search.stop)

    def post_route(path: str, handler: Callable[[ServerState, Dialect, Request],
                                                Awaitable[Response]]) -> Route:
        dialect = DIALECT_OF_PATH[path]

        async def endpoint(request: Request) -> Response:
            return await _answered(state, dialect, request, handler)

        return Route(path, endpoint, methods=["POST"])

    def get_route(path: str, answer: Callable[[ServerState], Response]) -> Route:
        async def endpoint(request: Request) -> Response:
            return answer(state)

        return Route(path, endpoint, methods=["GET"])

    routes = [
        *(post_route(path, _rerank) for path in RERANK_PATHS),
        *(post_route(path, embed) for path in EMBEDDING_PATHS),
        post_route(SEARCH_PATH, search),
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
            response = error_response(DIALECT_OF_PATH.get(path), RequestError(401, "unauthorized"))
            response.headers["www-authenticate"] = "Bearer"
            await response(scope, receive, counting_send)
            return
        await self.app(scope, receive, counting_send)


def _authorized(scope: Scope, expected: bytes) -> bool:
    for name, value in scope["headers"]:
        if name == b"authorization":
            return hmac.compare_digest(value, expected)
    return False


async def _answered(state: ServerState, dialect: Dialect, request: Request,
                    handler: Callable[[ServerState, Dialect, Request], Awaitable[Response]]
                    ) -> Response:
    """Exactly one answer to a POST: the handler's, or its error in the dialect's shape."""
    from starlette.responses import Response

    started = time.perf_counter()
    try:
        state.check_accepting()
        response = await handler(state, dialect, request)
    except RequestError as err:
        response = error_response(dialect, err)
    except ClientGone:
        response = Response(status_code=CLIENT_CLOSED_STATUS)
    except Exception as err:  # a bug: still one answer, in the dialect's shape, and counted
        logger.exception("request to %s failed", request.url.path)
        response = error_response(dialect, RequestError(500, f"internal error: {err!r}"))
    response.headers["x-total-time"] = str(ms(time.perf_counter() - started))
    state.metrics.request_seconds.labels(endpoint=request.url.path).observe(
        time.perf_counter() - started)
    return response


# --- endpoints ---------------------------------------------------------------------------------


def _health(state: ServerState) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse({"status": "ok"})


def _ready(state: ServerState) -> Response:
    from starlette.responses import JSONResponse

    if state.draining:
        return JSONResponse({"status": "draining"}, status_code=503)
    if not state.ready:
        return JSONResponse({"status": "loading"}, status_code=503)
    return JSONResponse({"status": "ready", "models": [model.id for model in state.models]})


def _metrics(state: ServerState) -> Response:
    from starlette.responses import Response

    body, content_type = state.metrics.exposition()
    return Response(body, media_type=content_type)


def _models(state: ServerState) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse({"object": "list",
                         "data": [model.describe(state.created) for model in state.models]})


async def _rerank(state: ServerState, dialect: Dialect, request: Request) -> Response:
    started = time.perf_counter()
    config = state.config
    call = parse_call(dialect, await read_payload(request, config), request.headers, config)
    model = state.models.pick(call.model, "rerank", dialect, request.url.path)
    if call.instruction is not None and not isinstance(model.reranker, DecoderReranker):
        raise RequestError(422, f"field `instruction` applies to decoder rerankers (a model "
                                f"exported with a prompt recipe); model {model.id!r} has no "
                                "prompt: omit `instruction`", param="instruction")
    if call.instruction is not None:
        try:  # an instruction the prompt has no room for fails here, not in the engine run
            model.reranker.check_instruction(call.instruction)
        except ValueError as err:
            raise RequestError(422, f"field `instruction`: {err}", param="instruction") from err
    if needs_tokens(call, config.max_tokens):
        from starlette.concurrency import run_in_threadpool

        call = await run_in_threadpool(prepare_documents, call, model.reranker,
                                       max_tokens=config.max_tokens)
    if not call.documents:
        return _ranked_response(model, call, None, started)
    deadline = None if call.deadline_ms is None else started + call.deadline_ms / 1000.0
    try:
        result = await run_job(model, request,
                               [(call.query, document) for document in call.documents], deadline,
                               options=call.instruction)
    except DeadlineMissed as missed:
        why = (f"{missed.why} ({call.deadline_ms:g} ms)" if missed.at_arrival else
               f"the deadline of {call.deadline_ms:g} ms passed before the request was scored")
        if call.on_deadline == "fallback":
            return _ranked_response(model, call, None, started, reranked=False)
        raise RequestError(
            503, f"{why}; send \"on_deadline\": \"fallback\" to get the retrieval order "
                 "instead") from missed
    return _ranked_response(model, call, result, started)


# --- answers -----------------------------------------------------------------------------------


def _ranked_response(
    model: ServedModel, call: RerankCall, result: JobResult | None, started: float,
    *, reranked: bool = True,
) -> Response:
    """The success answer of `call` in its dialect's shape (retrieval order when not reranked)."""
    from starlette.responses import JSONResponse

    count = len(call.documents)
    if result is not None:
        logits = np.asarray(result.values, dtype=np.float32)
        values = (logits.astype(np.float64) if call.raw_scores
                  else np.asarray(model.reranker.activate(logits), dtype=np.float64))
        order = rank_order(values)  # best first; equal scores keep request order
        tokens = int(np.sum(result.token_counts))
    else:
        values = np.zeros(count, dtype=np.float64)
        order = np.arange(count)
        tokens = 0
    if call.top_n is not None:
        order = order[: call.top_n]
    flag = {} if reranked else {"reranked": False}
    warnings = [] if model.warning is None else [model.warning]
    if not reranked:
        warnings.append(f"the deadline of {call.deadline_ms:g} ms passed: documents are in "
                        "request (retrieval) order, NOT reranked, and their scores are 0")
    body: Any
    if call.dialect == "tei":
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
        version = "1" if call.dialect == "cohere_v1" else "2"
        meta: dict[str, Any] = {
            "api_version": {"version": version},
            "billed_units": {"search_units": math.ceil(count / DOCUMENTS_PER_SEARCH_UNIT)},
            "tokens": {"input_tokens": tokens},
        }
        if warnings:
            meta["warnings"] = warnings
        body = {"id": str(uuid.uuid4()), "results": results, "meta": meta}
        if call.dialect == "cohere_v1":  # Jina's fields, in the same answer
            body.update({"model": model.id, "usage": {"total_tokens": tokens}})
    response = JSONResponse(body)
    headers = response.headers
    headers["x-compute-type"] = model.reranker.device_info.device
    headers["x-compute-characters"] = str(call.characters)
    headers["x-compute-tokens"] = str(tokens)
    headers["x-compute-time"] = str(ms(time.perf_counter() - started))
    if result is not None:
        headers["x-queue-time"] = str(int(result.queue_ms))
        headers["x-tokenization-time"] = str(int(result.tokenize_ms))
        headers["x-inference-time"] = str(int(result.inference_ms))
        headers["x-onnxrank-batch-requests"] = str(result.run_requests)
        headers["x-onnxrank-batch-pairs"] = str(result.run_items)
    headers["x-onnxrank-reranked"] = "true" if reranked else "false"
    if model.warning is not None:
        headers["x-onnxrank-warning"] = model.warning
    return response
