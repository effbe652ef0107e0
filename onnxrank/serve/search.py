"""``POST /v1/search``: the hybrid retriever over the index opened at start, read-only.

The answer is ``SearchResult.to_dict()``, the payload of ``onnxrank query --json`` (every hit
with its stage ranks and scores, the timings and the notes). Searches run on a pool of threads
(the retriever serves many threads at once; each has its own SQLite connection); at most
``--max-queue`` searches wait for a thread, one more gets 429. With ``rerank`` true the fused
candidates are reranked by a served rerank model (``model``; default the first) through that
model's queue and engine worker, like a ``/v1/rerank`` request (QueuedReranker): concurrent
searches share engine runs, and a full queue answers 429. ``deadline_ms`` is that stage's time
budget: candidates not scored within it keep the fused order (``reranked: false``).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from onnxrank.engine.devices import usable_cpus
from onnxrank.retrieval.results import MODES
from onnxrank.serve.errors import Dialect, RequestError
from onnxrank.serve.jobs import read_body
from onnxrank.serve.parsing import decode_body, optional_field, parse_deadline
from onnxrank.serve.queued_reranker import QueuedReranker

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from onnxrank.retrieval.hybrid import HybridRetriever
    from onnxrank.serve.config import ServeConfig
    from onnxrank.serve.registry import ServedModel
    from onnxrank.serve.state import ServerState

SEARCH_PATH = "/v1/search"
# Optional body fields passed to search_detailed as they are, with their JSON type; a field the
# client leaves out keeps the library's default.
PASSED_FIELDS: dict[str, type] = {"depth": int, "rerank_top_n": int, "fusion": str,
                                  "rrf_k": int, "fusion_weight": float}


class SearchService:
    """The opened index and the threads searches run on.

    A search's thread retrieves, then waits for its rerank job in the rerank model's queue; the
    pool is sized for that wait (as many threads as searches may wait, at least the usable CPUs),
    so that concurrent searches reach the queue together and share engine runs.

    Args:
        retriever: The opened index (read-only).
        max_waiting: Searches that may wait for a thread; one more is refused (429).
        threads: Search threads; None: max(usable CPUs, max_waiting).
    """

    def __init__(self, retriever: HybridRetriever, *, max_waiting: int,
                 threads: int | None = None) -> None:
        self.retriever = retriever
        self.threads = threads or max(usable_cpus(), max_waiting)
        self.max_in_flight = max_waiting + self.threads
        self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="onnxrank-search")
        self._lock = threading.Lock()
        self._in_flight = 0
        self._backends: dict[str, QueuedReranker] = {}

    def backend(self, model: ServedModel) -> QueuedReranker:
        """The rerank backend over a served rerank model (one per model, shared by searches, so
        that an engine failure logs one warning); call it on the server's event loop."""
        with self._lock:
            if model.id not in self._backends:
                self._backends[model.id] = QueuedReranker(model, asyncio.get_running_loop())
            return self._backends[model.id]

    async def run(self, query: str, options: dict[str, Any]) -> dict[str, Any]:
        """The search's JSON payload, computed on a search thread.

        Raises:
            RequestError: 429 when max_in_flight searches are in flight; 422 for options the
                retriever rejects (its message names the value).
        """
        with self._lock:
            if self._in_flight >= self.max_in_flight:
                raise RequestError(
                    429, f"the server is overloaded: {self.max_in_flight - self.threads} searches "
                         "are already waiting (--max-queue); retry after 1 s", retry_after_s=1)
            self._in_flight += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, self._search, query, options)
        finally:
            with self._lock:
                self._in_flight -= 1

    def _search(self, query: str, options: dict[str, Any]) -> dict[str, Any]:
        try:
            result = self.retriever.search_detailed(query, **options)
        except (ValueError, TypeError) as err:
            raise RequestError(422, str(err)) from err
        return result.to_dict()

    def stop(self) -> None:
        """Finish the searches in flight, then end the threads."""
        self._executor.shutdown(wait=True)


def parse_search(payload: Mapping[str, Any], headers: Mapping[str, str],
                 config: ServeConfig) -> tuple[str, dict[str, Any], str | None]:
    """The query, the search_detailed options and the rerank model id of a search body.

    Raises:
        RequestError: 422 naming the field.
    """
    if "query" not in payload:
        raise RequestError(422, "missing field `query`: a non-empty string is required",
                           param="query")
    query = payload["query"]
    if not isinstance(query, str) or not query.strip():
        raise RequestError(422, f"field `query` must be a non-empty string, got "
                                f"{json.dumps(query)[:40]}", param="query")
    options: dict[str, Any] = {}
    k = optional_field(payload, "k", int)
    if k is not None:
        options["k"] = k
    mode = payload.get("mode", "hybrid")
    if mode not in MODES:
        raise RequestError(422, f"field `mode` must be one of {', '.join(MODES)}, got "
                                f"{json.dumps(mode)[:40]}", param="mode")
    options["mode"] = mode
    filters = payload.get("filters")
    if filters is not None and not isinstance(filters, dict):
        raise RequestError(422, "field `filters` must be a JSON object such as "
                                '{"topic": "aero", "year": {"gte": 1960}}, got '
                                f"{json.dumps(filters)[:40]}", param="filters")
    options["filters"] = filters
    for name, kind in PASSED_FIELDS.items():
        value = payload.get(name)
        if value is None:
            continue
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        options[name] = optional_field({name: value}, name, kind)
    options["rerank"] = bool(optional_field(payload, "rerank", bool))
    deadline_ms, on_deadline = parse_deadline(payload, headers, config)
    if on_deadline != "error":
        raise RequestError(422, "field `on_deadline` does not apply to /v1/search: candidates the "
                                "rerank stage could not score within `deadline_ms` always keep "
                                "the fused order (reranked: false); omit it",
                           param="on_deadline")
    if options["rerank"]:
        options["rerank_deadline_ms"] = deadline_ms
    elif "rerank_top_n" in options:
        raise RequestError(422, "field `rerank_top_n` needs \"rerank\": true", param="rerank_top_n")
    return query, options, optional_field(payload, "model", str)


async def search(state: ServerState, dialect: Dialect, request: Request) -> Response:
    """Answer ``POST /v1/search``."""
    from starlette.responses import JSONResponse

    service = state.search
    if service is None:
        raise RequestError(404, "this server has no index: start it with --index DIR to serve "
                                "/v1/search")
    body = await read_body(request, state.config.max_request_bytes)
    query, options, model_id = parse_search(decode_body(body), request.headers, state.config)
    if options["rerank"]:
        model = state.models.pick(model_id, "rerank", dialect, request.url.path)
        options["reranker"] = service.backend(model)
    elif model_id is not None:
        raise RequestError(422, "field `model` names the rerank model and needs \"rerank\": true",
                           param="model")
    return JSONResponse(await service.run(query, options))
