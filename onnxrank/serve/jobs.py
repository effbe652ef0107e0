"""Reading a request body and taking a job through a model's queue, for every endpoint that runs
an engine: admission (429), deadlines, client disconnects and engine failures, one answer each."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from onnxrank.serve.batcher import (
    DeadlineExpiredError,
    DeadlineUnreachableError,
    Job,
    JobResult,
    QueueFullError,
    ShuttingDownError,
)
from onnxrank.serve.errors import RequestError

if TYPE_CHECKING:
    from starlette.requests import Request

    from onnxrank.serve.registry import ServedModel

# nginx's code for "client closed the request": the status recorded for requests whose client
# left before the answer (nobody receives it).
CLIENT_CLOSED_STATUS = 499


class ClientGone(Exception):
    """The client disconnected before its answer; answer CLIENT_CLOSED_STATUS (nobody reads it)."""


class DeadlineMissed(Exception):
    """The request's deadline passed (or the work ahead would outlast it) before it ran.

    Args:
        why: The sentence that says which.
        at_arrival: True when it was answered at arrival (the work ahead would outlast it).
    """

    def __init__(self, why: str, *, at_arrival: bool = False) -> None:
        super().__init__(why)
        self.why = why
        self.at_arrival = at_arrival


def ms(seconds: float) -> int:
    """Whole milliseconds (TEI's timing headers)."""
    return int(seconds * 1000.0)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, at most `limit` bytes.

    Raises:
        RequestError: 413 naming --max-request-bytes.
        ClientGone: The client left before its body arrived.
    """
    from starlette.requests import ClientDisconnect

    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the request body is {declared} bytes, more than this server's "
                                f"limit of {limit} bytes (--max-request-bytes)")
    chunks, size = [], 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"the request body is more than this server's limit of "
                                        f"{limit} bytes (--max-request-bytes)")
            chunks.append(chunk)
    except ClientDisconnect as err:  # gone before its body arrived: nothing queued
        raise ClientGone() from err
    return b"".join(chunks)


async def run_job(model: ServedModel, request: Request | None, items: list[Any],
                  deadline: float | None, *, options: str | None = None) -> JobResult:
    """Queue `items` (with the task `options` they share) on `model`'s worker and wait for their
    rows; `request` None (a search's rerank stage) waits without watching for a disconnect.

    Raises:
        RequestError: 429 (queue full, with Retry-After), 503 (shutting down), 500 (the engine
            failed; TEI's shape turns it into 424).
        DeadlineMissed: The deadline passed while waiting, or the work ahead would outlast it.
        ClientGone: The client disconnected while the job waited (it never reaches the engine).
    """
    loop = asyncio.get_running_loop()
    job = Job(items=items, future=loop.create_future(), loop=loop, deadline=deadline,
              options=options)
    try:
        model.batcher.submit(job)
    except QueueFullError as err:
        raise RequestError(429, str(err), retry_after_s=err.retry_after_s) from err
    except ShuttingDownError as err:
        raise RequestError(503, str(err)) from err
    except DeadlineUnreachableError as err:
        raise DeadlineMissed(str(err), at_arrival=True) from err
    # Without a request, a future that never completes stands in for the disconnect.
    disconnect: asyncio.Future[Any] = (loop.create_future() if request is None
                                       else asyncio.ensure_future(_client_gone(request)))
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
            raise DeadlineMissed("the deadline passed while the request waited")
        if isinstance(error, ShuttingDownError):
            raise RequestError(503, str(error)) from error
        raise RequestError(500, f"inference failed: {error}") from error
    reason = "client_disconnected" if disconnect in done else "deadline"
    model.batcher.withdraw(job, reason)
    job.future.cancel()  # a result that still comes is dropped
    if reason == "client_disconnected":
        raise ClientGone()
    raise DeadlineMissed("the deadline passed while the request waited")


async def _client_gone(request: Request) -> None:
    """Returns when the client disconnects (the body was read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
        await asyncio.sleep(0.05)  # not expected after the body; never spin
