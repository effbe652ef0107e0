"""The bounded request queue and the one engine worker that merges what waits into one run.

Requests (jobs) enter a bounded queue from the event loop. One worker thread takes the oldest
job, waits until ``batch_window_ms`` after that job's arrival for others to join, takes every
job then waiting, and runs all their items through one call of its task (one call per distinct
job options, such as a decoder reranker's instruction; a `BatchTask`: the
rerank task scores (query, document) pairs with ``Reranker.score_detailed``, the embedding task
embeds texts with ``Embedder.embed``): the engine's planner sorts the items by length and cuts
token-budget batches across requests. Each job gets its own rows back. Jobs whose client left or
whose deadline passed are taken out before the engine and cost the others nothing. Each served
model has its own Batcher (queue and worker) over its own task.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from onnxrank.serve.metrics import ServerMetrics

logger = logging.getLogger(__name__)

# Throughput estimate (items/s) for Retry-After: exponential average over engine runs.
THROUGHPUT_SMOOTHING = 0.2


@dataclass(frozen=True, slots=True)
class TaskRun:
    """What one engine run of a task produced, rows in the order of its items.

    Attributes:
        values: One row per item: a score (rerank) or a vector (embedding).
        token_counts: Tokens per item as the model saw them.
        tokenize_ms / inference_ms: Time of the run's stages.
        batches: (rows, padded length) of each model run inside the engine run.
    """

    values: NDArray[np.float32]
    token_counts: NDArray[np.int64]
    tokenize_ms: float
    inference_ms: float
    batches: Sequence[tuple[int, int]]


class BatchTask(Protocol):
    """What a Batcher runs: one call over the items of every job merged into a run."""

    @property
    def name(self) -> str:
        """The task ("rerank", "embedding"), chosen by the engine's kind (serve.tasks.task_for)."""
        ...

    @property
    def warm_up_items(self) -> Sequence[Any]:
        """Items run once at start, before the server reports ready."""
        ...

    def run(self, items: Sequence[Any], options: Any) -> TaskRun:
        """Run the engine over `items` (pairs or texts) with the options every one of them shares
        (a decoder reranker's instruction; None: the engine's defaults); raises what the engine
        raises."""
        ...

    def items_counter(self, metrics: ServerMetrics) -> Any:
        """The Prometheus counter of the items this task's engine ran (pairs or texts)."""
        ...


class QueueFullError(Exception):
    """The queue holds `max_queue` jobs; retry after `retry_after_s` seconds."""

    def __init__(self, max_queue: int, retry_after_s: int) -> None:
        super().__init__(
            f"the server is overloaded: {max_queue} requests are already waiting (--max-queue); "
            f"retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class DeadlineExpiredError(Exception):
    """The job's deadline passed before the engine took it."""


class DeadlineUnreachableError(DeadlineExpiredError):
    """At arrival, the work ahead of the job would already take longer than its deadline."""

    def __init__(self, estimated_s: float) -> None:
        super().__init__(
            f"the requests ahead of this one would take about {estimated_s * 1000:.0f} ms, "
            "longer than its deadline allows")
        self.estimated_s = estimated_s


class ShuttingDownError(Exception):
    """The server stopped before the job could run."""


@dataclass(frozen=True, slots=True)
class JobResult:
    """What one job gets back from its engine run.

    Attributes:
        values: The job's rows (raw logits, or vectors), in the job's item order.
        token_counts: Tokens per item as the model saw them.
        queue_ms: Arrival to the start of the engine run.
        tokenize_ms / inference_ms: Of the whole engine run (shared with its batch mates).
        run_requests: Jobs in the engine run.
        run_items: Items (pairs or texts) in the engine run.
    """

    values: NDArray[np.float32]
    token_counts: NDArray[np.int64]
    queue_ms: float
    tokenize_ms: float
    inference_ms: float
    run_requests: int
    run_items: int


@dataclass(eq=False)
class Job:
    """One request's items (pairs or texts) on their way through the queue.

    `future` is resolved on `loop` exactly once, with a JobResult or an exception. `options` go
    to the task with the items (a decoder reranker's instruction; None: the engine's defaults):
    the engine takes one value per call, so jobs with different options share the worker's turn
    but not an engine call.
    """

    items: list[Any]
    future: asyncio.Future[JobResult]
    loop: asyncio.AbstractEventLoop
    deadline: float | None = None  # time.perf_counter() value
    options: str | None = None
    enqueued_at: float = field(default_factory=time.perf_counter)
    state: str = "new"  # new -> queued -> running | dropped


class Batcher:
    """Owns one model's queue and its engine worker thread.

    Args:
        task: What the worker runs (onnxrank.serve.tasks: RerankTask, EmbeddingTask).
        metrics: Where runs, batches and drops are counted.
        model: The served model's id (the ``model`` label of its metrics).
        max_queue: Jobs that may wait; one more raises QueueFullError.
        merge: True merges every waiting job into one run; False runs jobs one by one.
        window_s: How long after the oldest waiting job's arrival the worker waits for others.
    """

    def __init__(
        self, task: BatchTask, metrics: ServerMetrics, *, model: str,
        max_queue: int, merge: bool, window_s: float,
    ) -> None:
        self.task = task
        self.model = model
        self._metrics = metrics
        self.max_queue = max_queue
        self.merge = merge
        self.window_s = window_s
        self._queue: deque[Job] = deque()
        self._running_items = 0
        self._run_started = 0.0
        self._cond = threading.Condition()
        self._stopping = False
        self._items_per_s: float | None = None
        self._thread: threading.Thread | None = None
        self.ready = threading.Event()

    # --- called from the event loop -------------------------------------------------------------

    def start(self) -> None:
        """Start the worker thread; it warms the engine up, then sets `ready`."""
        if self._thread is not None:
            raise RuntimeError("the batcher is already started")
        self._thread = threading.Thread(target=self._work, name=f"onnxrank-{self.model}", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue `job`.

        Raises:
            QueueFullError: `max_queue` jobs are waiting.
            DeadlineUnreachableError: The job has a deadline, and the work ahead of it plus its
                own would take longer at the recent items/s: waiting would only waste it.
            ShuttingDownError: stop() was called.
        """
        with self._cond:
            if self._stopping:
                raise ShuttingDownError("the server is shutting down")
            if len(self._queue) >= self.max_queue:
                raise QueueFullError(self.max_queue, self._retry_after_s())
            if job.deadline is not None and self._items_per_s:
                finish_s = self._pending_s(len(job.items))
                if time.perf_counter() + finish_s > job.deadline:
                    self._metrics.dropped.labels(model=self.model,
                                                 reason="deadline_unreachable").inc()
                    raise DeadlineUnreachableError(finish_s)
            job.state = "queued"
            self._queue.append(job)
            self._metrics.queue_depth.labels(model=self.model).set(len(self._queue))
            self._cond.notify()

    def withdraw(self, job: Job, reason: str) -> bool:
        """Take `job` out of the queue (its client left, or its deadline passed).

        Returns:
            True when it was still waiting (it will never reach the engine); False when the
            engine already has it (its result is then discarded) or it was answered.
        """
        with self._cond:
            if job.state != "queued":
                return False
            self._queue.remove(job)
            job.state = "dropped"
            self._metrics.queue_depth.labels(model=self.model).set(len(self._queue))
        self._metrics.dropped.labels(model=self.model, reason=reason).inc()
        return True

    def stop(self, timeout_s: float) -> None:
        """Stop taking jobs, finish the queued ones (for at most `timeout_s`), end the worker.

        Jobs still waiting when the time is up are answered with ShuttingDownError.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._cond:
            left = list(self._queue)
            self._queue.clear()
            self._metrics.queue_depth.labels(model=self.model).set(0)
        for job in left:
            job.state = "dropped"
            _resolve(job, ShuttingDownError("the server shut down before this request ran"))

    @property
    def depth(self) -> int:
        """Jobs waiting now."""
        return len(self._queue)

    def _retry_after_s(self) -> int:
        """Seconds until the work ahead is likely done (at least 1); called under the lock."""
        return max(1, math.ceil(self._pending_s(0))) if self._items_per_s else 1

    def _pending_s(self, extra_items: int) -> float:
        """Estimated seconds until the running run, every queued job and `extra_items` more are
        done, at the recent items/s; called under the lock with an estimate present."""
        assert self._items_per_s
        done = (time.perf_counter() - self._run_started) * self._items_per_s
        running_left = max(0.0, self._running_items - done)
        queued = sum(len(job.items) for job in self._queue)
        return (running_left + queued + extra_items) / self._items_per_s

    # --- the worker thread ----------------------------------------------------------------------

    def _work(self) -> None:
        try:
            self.task.run(self.task.warm_up_items, None)
        except Exception:  # the server stays up; /ready stays 503 and requests get 500s
            logger.exception("engine warm-up of %s failed", self.model)
        else:
            self.ready.set()
        while True:
            jobs = self._take()
            if jobs is None:
                return
            try:
                self._run(jobs)
            except Exception as err:  # a bug here must not stop the worker: answer and go on
                logger.exception("engine worker failed on a run of %d requests", len(jobs))
                for job in jobs:
                    _resolve(job, err)  # jobs answered already keep their answer

    def _take(self) -> list[Job] | None:
        """The next jobs to run together, or None when stopping with nothing left."""
        with self._cond:
            while not self._queue:
                if self._stopping:
                    return None
                self._cond.wait()
            if self.merge:
                # Wait for batch mates until the window after the oldest job's arrival closes,
                # unless the queue is full (nobody else can join) or the server is stopping.
                window_end = self._queue[0].enqueued_at + self.window_s
                while self._queue and len(self._queue) < self.max_queue and not self._stopping:
                    remaining = window_end - time.perf_counter()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                jobs = list(self._queue)
                self._queue.clear()
            else:
                jobs = [self._queue.popleft()]
            for job in jobs:
                job.state = "running"
            self._running_items = sum(len(job.items) for job in jobs)
            self._run_started = time.perf_counter()
            self._metrics.queue_depth.labels(model=self.model).set(len(self._queue))
        return jobs

    def _run(self, jobs: list[Job]) -> None:
        started = time.perf_counter()
        live = []
        for job in jobs:
            if job.deadline is not None and started >= job.deadline:
                job.state = "dropped"
                self._metrics.dropped.labels(model=self.model, reason="deadline").inc()
                _resolve(job, DeadlineExpiredError("the deadline passed while the request waited"))
            else:
                live.append(job)
        groups: dict[str | None, list[Job]] = {}
        for job in live:
            groups.setdefault(job.options, []).append(job)
        try:
            for index, group in enumerate(groups.values()):
                self._score_together(group, started if index == 0 else time.perf_counter())
        finally:
            with self._cond:
                self._running_items = 0

    def _score_together(self, jobs: list[Job], started: float) -> None:
        """One engine run for `jobs` (all with the same options); if it fails, each job alone, so
        that one request the engine rejects costs its batch mates nothing."""
        items = [item for job in jobs for item in job.items]
        try:
            run = self.task.run(items, jobs[0].options)
        except Exception as err:
            if len(jobs) == 1:
                logger.exception("engine run of %d items failed", len(items))
                _resolve(jobs[0], err)
                return
            logger.warning("engine run of %d requests failed (%r); scoring them one by one",
                           len(jobs), err)
            for job in jobs:
                self._score_together([job], started)
            return
        self._record(run, jobs, len(items), started)
        offset = 0
        for job in jobs:
            stop = offset + len(job.items)
            _resolve(job, JobResult(
                values=np.asarray(run.values[offset:stop]),
                token_counts=np.asarray(run.token_counts[offset:stop]),
                queue_ms=(started - job.enqueued_at) * 1000.0,
                tokenize_ms=float(run.tokenize_ms), inference_ms=float(run.inference_ms),
                run_requests=len(jobs), run_items=len(items),
            ))
            offset = stop

    def _record(self, run: TaskRun, jobs: list[Job], items: int, started: float) -> None:
        elapsed = time.perf_counter() - started
        metrics, model = self._metrics, {"model": self.model}
        metrics.engine_runs.labels(**model).inc()
        self.task.items_counter(metrics).labels(**model).inc(items)
        metrics.run_requests.labels(**model).observe(len(jobs))
        metrics.run_items.labels(**model).observe(items)
        metrics.tokenize_seconds.labels(**model).observe(run.tokenize_ms / 1000.0)
        metrics.inference_seconds.labels(**model).observe(run.inference_ms / 1000.0)
        for rows, padded_length in run.batches:
            metrics.batch_rows.labels(**model).observe(rows)
            metrics.batch_padded_tokens.labels(**model).observe(rows * padded_length)
        for job in jobs:
            metrics.queue_seconds.labels(**model).observe(started - job.enqueued_at)
        if elapsed > 0:
            speed = items / elapsed
            previous = self._items_per_s
            self._items_per_s = speed if previous is None else (
                THROUGHPUT_SMOOTHING * speed + (1 - THROUGHPUT_SMOOTHING) * previous)


def _resolve(job: Job, outcome: JobResult | BaseException) -> None:
    """Hand `outcome` to the job's future on its event loop (once; later calls do nothing)."""

    def settle() -> None:
        if job.future.done():
            return
        if isinstance(outcome, BaseException):
            job.future.set_exception(outcome)
        else:
            job.future.set_result(outcome)

    try:
        job.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: the server is gone and nobody waits any more
        logger.debug("event loop closed before a job could be answered")
