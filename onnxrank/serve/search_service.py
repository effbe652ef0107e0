"""The opened index of ``POST /v1/search`` and the threads searches run on.

Searches run on a pool of threads (the retriever serves many threads at once; each has its own
SQLite connection); at most ``--max-queue`` searches wait for a thread, one more gets 429. A
search's rerank stage goes through the rerank model's queue and engine worker (QueuedReranker).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from onnxrank.engine.devices import usable_cpus
from onnxrank.engine.late_interaction import LateInteractionReranker
from onnxrank.rerankers.base import RerankBackend
from onnxrank.rerankers.stored import StoredVectorReranker
from onnxrank.retrieval.document_vectors import open_document_vectors
from onnxrank.serve.errors import RequestError
from onnxrank.serve.queued_reranker import QueuedReranker

if TYPE_CHECKING:
    from onnxrank.retrieval.hybrid import HybridRetriever
    from onnxrank.serve.registry import ServedModel


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
        self._stored: dict[str, StoredVectorReranker] = {}
        self.document_vectors = open_document_vectors(retriever.store)

    def backend(self, model: ServedModel) -> QueuedReranker:
        """The rerank backend over a served rerank model (one per model, shared by searches, so
        that an engine failure logs one warning); call it on the server's event loop."""
        with self._lock:
            if model.id not in self._backends:
                self._backends[model.id] = QueuedReranker(model, asyncio.get_running_loop())
            return self._backends[model.id]

    def stage_backend(self, model: ServedModel) -> RerankBackend:
        """A cascade stage's backend: a late-interaction model whose document vectors the index
        stores reads them (one query encoding on the search thread), any other model goes
        through its queue (`backend`)."""
        engine = model.reranker
        vectors = self.document_vectors
        if (isinstance(engine, LateInteractionReranker) and vectors is not None
                and vectors.record.manifest_hash == engine.spec.manifest_hash()):
            with self._lock:
                if model.id not in self._stored:
                    self._stored[model.id] = StoredVectorReranker(engine, vectors)
                return self._stored[model.id]
        return self.backend(model)

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
