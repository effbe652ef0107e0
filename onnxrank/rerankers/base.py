"""The reranker protocol every backend implements, its result type and the degradation path.

Scores from different backends are not comparable (a local cross-encoder's sigmoid, Cohere's
relevance_score, an LLM's 0-10 rating), so every result names the backend that produced it.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from onnxrank.engine.ranking import RankedDocument, rank_order
from onnxrank.errors import RerankError

logger = logging.getLogger(__name__)

OnError = Literal["fallback", "raise"]
ON_ERRORS: tuple[str, ...] = ("fallback", "raise")
# What a backend does when it cannot rerank (no model, no key, endpoint down): keep the retrieval
# order, flagged reranked=False, with one logged warning. A search never fails because of it.
DEFAULT_ON_ERROR: OnError = "fallback"
# Total time one remote rerank call may take (connect, queue, answer), in seconds.
DEFAULT_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class BackendRankedDocument(RankedDocument):
    """A RankedDocument plus the name of the backend that produced it.

    Attributes:
        backend: "local", "cohere", "llm", "none", or a custom backend's name.
    """

    backend: str = ""


@runtime_checkable
class RerankBackend(Protocol):
    """Anything that reorders documents for a query (see onnxrank.rerankers for the backends).

    `rerank` returns the documents best first with ``index`` pointing into `documents`. It does
    not raise when the backend is unavailable: it returns the input order flagged
    ``reranked=False`` (a backend built with ``on_error="raise"`` raises instead).
    """

    @property
    def name(self) -> str:
        """The backend's name, stored on every result."""
        ...

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_k: int | None = None,
        deadline_ms: float | None = None,
    ) -> list[RankedDocument]:
        """Documents best first; `deadline_ms` bounds the time spent (None: the backend's own)."""
        ...


class BackendUnavailableError(RerankError):
    """Raised by a backend built with ``on_error="raise"`` when it cannot rerank."""


def check_rerank_arguments(query: object, documents: object, top_k: object, deadline_ms: object) -> list[str]:
    """Validate the arguments every backend takes; returns the documents as a list.

    Raises:
        TypeError: `query` is not a str or `documents` is not a sequence of str.
        ValueError: Empty query, top_k < 1 or deadline_ms <= 0.
    """
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    if not query.strip():
        raise ValueError(f"query must be a non-empty string, got {query!r}")
    if isinstance(documents, str) or not isinstance(documents, Sequence):
        raise TypeError(f"documents must be a list of str, got {type(documents).__name__}")
    for index, document in enumerate(documents):
        if not isinstance(document, str):
            raise TypeError(f"documents[{index}] must be a str, got {type(document).__name__}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
    if deadline_ms is not None and (
        isinstance(deadline_ms, bool) or not isinstance(deadline_ms, (int, float)) or not deadline_ms > 0
    ):
        raise ValueError(f"deadline_ms must be > 0 or None, got {deadline_ms!r}")
    return list(documents)


def check_on_error(on_error: str) -> None:
    """Raises ValueError unless `on_error` is "fallback" or "raise"."""
    if on_error not in ON_ERRORS:
        raise ValueError(f"on_error must be one of {', '.join(ON_ERRORS)}, got {on_error!r}")


def retrieval_order(
    documents: Sequence[str], *, top_k: int | None, backend: str
) -> list[RankedDocument]:
    """The documents in input order, unscored (score NaN, ``reranked=False``)."""
    kept = documents if top_k is None else documents[:top_k]
    ranked: list[RankedDocument] = [
        BackendRankedDocument(index=index, score=math.nan, text=text, reranked=False, backend=backend)
        for index, text in enumerate(kept)
    ]
    return ranked


def ranked_by_score(
    documents: Sequence[str], scores: dict[int, float], *, top_k: int | None, backend: str
) -> list[RankedDocument]:
    """Scored documents best first (ties keep input order), then unscored ones in input order."""
    indices = sorted(scores)
    order = [indices[position] for position in
             rank_order([scores[index] for index in indices], top_k=top_k)]
    ranked: list[RankedDocument] = [
        BackendRankedDocument(index=index, score=float(scores[index]), text=documents[index], backend=backend)
        for index in order
    ]
    ranked += [
        BackendRankedDocument(index=index, score=math.nan, text=text, reranked=False, backend=backend)
        for index, text in enumerate(documents)
        if index not in scores
    ]
    return ranked if top_k is None else ranked[:top_k]


class Degradation:
    """The fallback path of one backend instance: one WARNING for the first failure, INFO after.

    A search loop or a server calls a broken backend thousands of times; one warning says what is
    wrong and how to fix it, and the rest would only bury it.
    """

    def __init__(self, backend: str, on_error: OnError) -> None:
        check_on_error(on_error)
        self.backend = backend
        self.on_error = on_error
        self._warned = False
        self._lock = threading.Lock()
        self.failures = 0

    def fallback(
        self, documents: Sequence[str], *, top_k: int | None, reason: str, error: BaseException | None = None
    ) -> list[RankedDocument]:
        """Log the failure and return the retrieval order, or raise with ``on_error="raise"``.

        Raises:
            BackendUnavailableError: The backend was built with ``on_error="raise"``.
        """
        if self.on_error == "raise":
            raise BackendUnavailableError(f"{self.backend} reranker: {reason}") from error
        with self._lock:
            first = not self._warned
            self._warned = True
            self.failures += 1
        message = "%s reranker: %s; keeping the retrieval order (reranked=False)"
        if first:
            logger.warning(message, self.backend, reason)
        else:
            logger.info(message, self.backend, reason)
        return retrieval_order(documents, top_k=top_k, backend=self.backend)
