"""The LLM backend: a chat model rates each (query, document) pair from 0 to 10.

Pointwise: one chat request per document, at most `max_concurrency` in flight, all of them within
`timeout_s`. The answer must be a bare number from 0 to 10; anything else (prose, JSON, an
out-of-range value) counts as a failed call. One failed call, an HTTP error, a refused connection
or the time budget running out returns the retrieval order flagged ``reranked=False`` with one
logged warning: a ranking built from a subset of ratings would mix rated and unrated documents
in an order that means nothing.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Literal, cast

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

ChatApi = Literal["openai", "ollama"]
CHAT_APIS: tuple[str, ...] = ("openai", "ollama")
DEFAULT_LLM_URL = "http://127.0.0.1:11434/v1"  # Ollama's OpenAI-compatible root
DEFAULT_MAX_CONCURRENCY = 4
# Characters of each document sent to the model: about 500 tokens of English, enough for a chunk
# of `onnxrank index`'s default 400 words and small enough for any chat model's context.
DEFAULT_MAX_DOCUMENT_CHARS = 2000
MAX_SCORE = 10.0
SCORE_PATTERN = re.compile(r"\s*(\d{1,2}(?:\.\d+)?)\s*")
SYSTEM_PROMPT = (
    "You judge search results. Given a query and a document, rate how well the document answers "
    "the query on a scale from 0 (unrelated) to 10 (answers it fully). Reply with the number only."
)


def parse_score(content: object) -> float:
    """The rating in a chat answer: a bare number from 0 to 10, surrounding whitespace allowed.

    Raises:
        ValueError: Anything else.

    >>> parse_score(" 7 ")
    7.0
    """
    if not isinstance(content, str):
        raise ValueError(f"the answer must be a string, got {type(content).__name__}")
    match = SCORE_PATTERN.fullmatch(content)
    if match is None:
        raise ValueError(f"the answer must be a number from 0 to 10, got {content[:80]!r}")
    score = float(match.group(1))
    if not 0.0 <= score <= MAX_SCORE:
        raise ValueError(f"the answer must be a number from 0 to 10, got {score}")
    return score


class LLMReranker:
    """Reranks with a chat model's 0-10 relevance ratings.

    Args:
        model: Chat model name, e.g. "llama3.2:3b" (Ollama) or "gpt-4o-mini".
        base_url: For api="openai", the root that holds /chat/completions, e.g.
            "http://127.0.0.1:11434/v1"; for api="ollama", the server root that holds /api/chat.
        api: "openai" (OpenAI-compatible chat completions) or "ollama" (Ollama's native /api/chat).
        api_key: Sent as a Bearer token when given.
        timeout_s: Total seconds for all the documents of one call.
        max_concurrency: Chat requests in flight at once.
        max_document_chars: Characters of each document sent.
        on_error: "fallback" or "raise".
    """

    name = "llm"

    def __init__(
        self,
        *,
        model: str,
        base_url: str = DEFAULT_LLM_URL,
        api: ChatApi = "openai",
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        max_document_chars: int = DEFAULT_MAX_DOCUMENT_CHARS,
        on_error: OnError = DEFAULT_ON_ERROR,
    ) -> None:
        if not model:
            raise ValueError(f"model must be a non-empty chat model name, got {model!r}")
        if api not in CHAT_APIS:
            raise ValueError(f"api must be one of {', '.join(CHAT_APIS)}, got {api!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency!r}")
        if max_document_chars < 1:
            raise ValueError(f"max_document_chars must be >= 1, got {max_document_chars!r}")
        self.model = model
        self.base_url = base_url.rstrip("/")
        self.api = api
        self.timeout_s = float(timeout_s)
        self.max_concurrency = max_concurrency
        self.max_document_chars = max_document_chars
        self._api_key = api_key
        self._degradation = Degradation(self.name, on_error)
        self._lock = threading.Lock()
        self._client: Any = None

    @property
    def endpoint(self) -> str:
        """The URL each rating request is posted to."""
        return self.base_url + ("/chat/completions" if self.api == "openai" else "/api/chat")

    def _http(self) -> Any:
        with self._lock:
            if self._client is None:
                httpx = require("httpx", extra="llm")
                headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
                self._client = httpx.Client(
                    headers=headers,
                    limits=httpx.Limits(max_connections=self.max_concurrency),
                    trust_env=False,  # a local endpoint must not go through a proxy from the env
                )
            return self._client

    def _request_body(self, query: str, document: str) -> dict[str, Any]:
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {
                "role": "user",
                "content": f"Query: {query}\n\nDocument: {document[: self.max_document_chars]}\n\n"
                "Rating (0-10):",
            },
        ]
        body: dict[str, Any] = {"model": self.model, "messages": messages, "stream": False}
        if self.api == "openai":
            body.update(temperature=0, max_tokens=4)
        else:
            body["options"] = {"temperature": 0, "num_predict": 4}
        return body

    def _rate(self, client: Any, query: str, document: str, deadline: float) -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("time budget spent before the request was sent")
        response = client.post(self.endpoint, json=self._request_body(query, document), timeout=remaining)
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code} {response.text[:200]}")
        try:
            payload = response.json()
            if self.api == "openai":
                content = payload["choices"][0]["message"]["content"]
            else:
                content = payload["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise ValueError(f"not a {self.api} chat answer: {response.text[:200]!r}") from err
        return parse_score(content)

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_k: int | None = None,
        deadline_ms: float | None = None,
    ) -> list[RankedDocument]:
        """Documents best first by their rating (ties keep the input order).

        Args:
            query: Non-empty query.
            documents: Candidate texts (each cut to `max_document_chars`).
            top_k: Keep the best k.
            deadline_ms: Time budget of this call; the smaller of it and `timeout_s` applies.

        Raises:
            ValueError, TypeError: Bad arguments.
            BackendUnavailableError: Only with ``on_error="raise"``.
        """
        documents = check_rerank_arguments(query, documents, top_k, deadline_ms)
        if not documents:
            return []
        budget_s = self.timeout_s if deadline_ms is None else min(self.timeout_s, deadline_ms / 1000)
        deadline = time.monotonic() + budget_s
        try:
            client = self._http()
        except MissingDependencyError as err:
            return self._degradation.fallback(documents, top_k=top_k, reason=str(err), error=err)
        executor = ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="onnxrank-llm")
        futures: list[Future[float]] = []
        try:
            futures = [
                executor.submit(self._rate, client, query, document, deadline) for document in documents
            ]
            done, pending = wait(futures, timeout=budget_s, return_when=FIRST_EXCEPTION)
        finally:
            # Queued requests are dropped; those in flight end by their own timeout (the budget).
            executor.shutdown(wait=False, cancel_futures=True)
        failed = [future for future in done if future.exception() is not None]
        # A failure before the budget ran out is reported as itself; requests cut by the budget
        # (still pending, or failed by their timeout) as a timeout.
        timed_out = time.monotonic() >= deadline
        if (pending and not failed) or (failed and timed_out):
            rated = sum(1 for future in done if future.exception() is None)
            return self._degradation.fallback(
                documents,
                top_k=top_k,
                reason=f"{self.endpoint} (model {self.model!r}) rated {rated} of "
                f"{len(documents)} documents within {budget_s:.3g} s",
            )
        if failed:
            error = cast(BaseException, failed[0].exception())
            return self._degradation.fallback(
                documents,
                top_k=top_k,
                reason=f"{self.endpoint} (model {self.model!r}) failed: {_describe(error)}",
                error=error,
            )
        scores = {index: future.result() for index, future in enumerate(futures)}
        return list(ranked_by_score(documents, scores, top_k=top_k, backend=self.name))

    def close(self) -> None:
        """Close the HTTP connection pool."""
        with self._lock:
            if self._client is not None:
                self._client.close()
            self._client = None


def _describe(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:300]
