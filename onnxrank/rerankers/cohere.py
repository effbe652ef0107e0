"""The Cohere-compatible backend: POST /v2/rerank through the official `cohere` SDK.

It talks to Cohere's API, to any server with the same v2 shape (``onnxrank serve``, LiteLLM,
Infinity...) through `base_url`, so a fleet of retrievers can share one rerank server.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, cast

from onnxrank._optional import require
from onnxrank.errors import MissingDependencyError
from onnxrank.rerankers.base import (
    DEFAULT_ON_ERROR,
    DEFAULT_TIMEOUT_S,
    Degradation,
    OnError,
    check_rerank_arguments,
    ranked_by_score,
)

if TYPE_CHECKING:
    from onnxrank.engine.ranking import RankedDocument

logger = logging.getLogger(__name__)

DEFAULT_COHERE_MODEL = "rerank-v3.5"
# The SDK's own names for the key; COHERE_API_KEY first as the issue tracker and most docs use it.
API_KEY_VARIABLES = ("COHERE_API_KEY", "CO_API_KEY")
# Calls in flight per backend instance (one per concurrent search); more wait for a worker.
MAX_CONCURRENT_CALLS = 16


class CohereReranker:
    """Reranks through a Cohere v2 rerank endpoint.

    The API key comes from `api_key`, else from the environment variables the cohere SDK itself
    reads (COHERE_API_KEY, CO_API_KEY). Without a key, without the `cohere` package, or when the
    call fails (connection refused, an HTTP error, a timeout, a body that is not a v2 rerank
    answer), `rerank` logs one warning and returns the retrieval order flagged
    ``reranked=False`` within `timeout_s` (``on_error="raise"`` raises instead).

    Args:
        model: Model name sent to the endpoint, e.g. "rerank-v3.5" (Cohere) or the model an
            ``onnxrank serve`` runs (it answers whatever name is asked).
        base_url: Endpoint root, e.g. "http://127.0.0.1:8080"; None is Cohere's API (or the
            SDK's CO_API_URL).
        api_key: The key; None reads COHERE_API_KEY, then CO_API_KEY.
        timeout_s: Total seconds per call (connect, queue, answer); no retries.
        max_tokens_per_doc: Sent as max_tokens_per_doc; None leaves the server's default.
        on_error: "fallback" or "raise".
    """

    name = "cohere"

    def __init__(
        self,
        *,
        model: str = DEFAULT_COHERE_MODEL,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_tokens_per_doc: int | None = None,
        on_error: OnError = DEFAULT_ON_ERROR,
    ) -> None:
        if not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if max_tokens_per_doc is not None and max_tokens_per_doc < 1:
            raise ValueError(f"max_tokens_per_doc must be >= 1 or None, got {max_tokens_per_doc!r}")
        self.model = model
        self.base_url = base_url
        self.timeout_s = float(timeout_s)
        self.max_tokens_per_doc = max_tokens_per_doc
        self._api_key = api_key
        self._degradation = Degradation(self.name, on_error)
        self._lock = threading.Lock()
        self._client: Any = None
        self._executor: ThreadPoolExecutor | None = None

    def _resolve_key(self) -> str | None:
        if self._api_key:
            return self._api_key
        # The one place the library reads the environment: the cohere SDK's own key variables,
        # so a key set for any Cohere client works here too.
        for variable in API_KEY_VARIABLES:
            value = os.environ.get(variable)
            if value:
                return value
        return None

    def _connect(self) -> tuple[Any, ThreadPoolExecutor]:
        """The SDK client and the worker pool, created once (under the lock)."""
        with self._lock:
            if self._client is None:
                cohere = require("cohere", extra="cohere")
                key = self._resolve_key()
                if key is None:
                    raise _NoKeyError(
                        "no API key: pass api_key=..., or set COHERE_API_KEY or CO_API_KEY "
                        "(any value for a server started without --api-key)"
                    )
                options: dict[str, Any] = {"timeout": self.timeout_s, "max_retries": 0}
                if self.base_url:
                    options["base_url"] = self.base_url.rstrip("/")
                self._client = cohere.ClientV2(api_key=key, **options)
                self._executor = ThreadPoolExecutor(
                    max_workers=MAX_CONCURRENT_CALLS, thread_name_prefix="onnxrank-cohere"
                )
            return self._client, cast(ThreadPoolExecutor, self._executor)

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_k: int | None = None,
        deadline_ms: float | None = None,
    ) -> list[RankedDocument]:
        """Documents best first by the endpoint's relevance_score.

        Args:
            query: Non-empty query.
            documents: Candidate texts.
            top_k: Keep the best k (sent as top_n).
            deadline_ms: Time budget of this call; the smaller of it and `timeout_s` applies.

        Raises:
            ValueError, TypeError: Bad arguments.
            BackendUnavailableError: Only with ``on_error="raise"``.
        """
        documents = check_rerank_arguments(query, documents, top_k, deadline_ms)
        if not documents:
            return []
        budget_s = self.timeout_s if deadline_ms is None else min(self.timeout_s, deadline_ms / 1000)
        started = time.monotonic()
        try:
            client, executor = self._connect()
        except (MissingDependencyError, _NoKeyError) as err:
            return self._degradation.fallback(documents, top_k=top_k, reason=str(err), error=err)
        request: dict[str, Any] = {"model": self.model, "query": query, "documents": documents}
        if top_k is not None:
            request["top_n"] = top_k
        if self.max_tokens_per_doc is not None:
            request["max_tokens_per_doc"] = self.max_tokens_per_doc
        # httpx's timeout bounds each phase (connect, each read), not the whole call: a server
        # that trickles bytes could exceed it. The future's timeout bounds the total.
        request["request_options"] = {"timeout": budget_s, "max_retries": 0}
        future = executor.submit(client.rerank, **request)
        try:
            response = future.result(timeout=max(budget_s - (time.monotonic() - started), 0.0))
        except FutureTimeout as err:
            future.cancel()
            return self._degradation.fallback(
                documents, top_k=top_k, reason=f"no answer from {self._where()} within {budget_s:.3g} s",
                error=err,
            )
        except Exception as err:  # noqa: BLE001 - any SDK/transport failure degrades, by contract
            return self._degradation.fallback(
                documents, top_k=top_k, reason=f"{self._where()} failed: {_describe(err)}", error=err
            )
        try:
            scores = _parse_results(response, len(documents), top_k)
        except ValueError as err:
            return self._degradation.fallback(
                documents, top_k=top_k, reason=f"{self._where()} answered a malformed body: {err}", error=err
            )
        return list(ranked_by_score(documents, scores, top_k=top_k, backend=self.name))

    def _where(self) -> str:
        return f"{self.base_url or 'the Cohere API'} (model {self.model!r})"

    def close(self) -> None:
        """Release the worker pool (calls in flight finish in the background)."""
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
            self._client = None
            self._executor = None


class _NoKeyError(RuntimeError):
    pass


def _describe(err: BaseException) -> str:
    status = getattr(err, "status_code", None)
    if status is not None:
        return f"HTTP {status} {str(getattr(err, 'body', ''))[:200]}"
    return f"{type(err).__name__}: {err}"[:300]


def _parse_results(response: object, count: int, top_k: int | None) -> dict[int, float]:
    """index -> relevance_score from a V2RerankResponse, checked strictly.

    Raises:
        ValueError: No results list, an index out of range or repeated, a non-finite score, or
            fewer results than asked for.
    """
    results = getattr(response, "results", None)
    if not isinstance(results, list):
        raise ValueError(f"'results' must be a list, got {type(results).__name__}")
    scores: dict[int, float] = {}
    for position, item in enumerate(results):
        index = getattr(item, "index", None)
        score = getattr(item, "relevance_score", None)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise ValueError(f"results[{position}].index must be an int in [0, {count}), got {index!r}")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise ValueError(f"results[{position}].relevance_score must be a finite number, got {score!r}")
        if index in scores:
            raise ValueError(f"results[{position}].index {index} is repeated")
        scores[index] = float(score)
    expected = count if top_k is None else min(top_k, count)
    if len(scores) < expected:
        raise ValueError(f"{len(scores)} results for {count} documents (top_n {top_k})")
    return scores
