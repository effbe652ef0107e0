"""The rerank backend of ``/v1/search``: a search thread's rerank stage, sent through the served
rerank model's queue and engine worker (onnxrank/serve/batcher.py), the same as ``/v1/rerank``.

Concurrent searches therefore share engine runs with each other and with rerank requests, and the
queue's limit, deadlines and metrics apply to them. The search thread hands its pairs to the
event loop (``asyncio.run_coroutine_threadsafe``) and blocks until the job is answered; the job
carries the rerank stage's deadline, so the wait is bounded by it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from onnxrank.rerankers.base import check_rerank_arguments, ranked_by_score, retrieval_order
from onnxrank.rerankers.local import LocalReranker
from onnxrank.serve.errors import RequestError
from onnxrank.serve.jobs import DeadlineMissed, run_job

if TYPE_CHECKING:
    from onnxrank.engine.ranking import RankedDocument
    from onnxrank.serve.registry import ServedModel


class QueuedReranker(LocalReranker):
    """A LocalReranker over a served model whose `rerank` goes through the model's queue.

    It is a LocalReranker (name "local", the model's manifest name and relevance_trained) so that
    a search's answer, notes included, is the one ``onnxrank query --rerank`` gives; only the way
    the pairs reach the engine differs.

    `rerank` answers:

    1. Every document scored by the engine (the manifest's activation), best first.
    2. The deadline passed before the engine took the job (or the work ahead would outlast it),
       or the engine's run did not end within it: the documents in input (fused) order, all
       flagged ``reranked=False``. The pairs of one search are scored in one engine run, so it
       is all or none.
    3. The engine failed: the same order, with one logged warning (as LocalReranker).

    Raises (from `rerank`, answered by the search endpoint):
        RequestError: 429 when the model's queue is full (with Retry-After), 503 when the
            server is shutting down.

    Args:
        model: The served rerank model.
        loop: The server's event loop (where the model's jobs are queued and answered).
    """

    def __init__(self, model: ServedModel, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(model.reranker)
        self._served = model
        self._loop = loop

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_k: int | None = None,
        deadline_ms: float | None = None,
    ) -> list[RankedDocument]:
        """Documents best first, scored by the served model's engine worker (see the class).

        Raises:
            ValueError, TypeError: Bad arguments.
            RequestError: 429 (queue full) or 503 (shutting down).
        """
        documents = check_rerank_arguments(query, documents, top_k, deadline_ms)
        if not documents:
            return []
        deadline = None if deadline_ms is None else time.perf_counter() + deadline_ms / 1000.0
        pairs = [(query, document) for document in documents]
        answer = asyncio.run_coroutine_threadsafe(
            run_job(self._served, None, pairs, deadline), self._loop)
        try:
            result = answer.result()
        except DeadlineMissed:
            return retrieval_order(documents, top_k=top_k, backend=self.name)
        except RequestError as err:
            if err.status != 500:
                raise
            return self._degradation.fallback(documents, top_k=top_k,
                                               reason=f"inference failed ({err})", error=err)
        scores = self._served.reranker.activate(np.asarray(result.values, dtype=np.float32))
        return ranked_by_score(documents, dict(enumerate(scores.tolist())), top_k=top_k,
                               backend=self.name)
