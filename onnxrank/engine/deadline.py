"""The deadline of a run cut short: which planned batches still fit a time budget."""

from __future__ import annotations

import time

from onnxrank.engine.batching import Batch


class DeadlineGate:
    """Stops a run before the batch that would end after the deadline.

    A batch is predicted from the slowest speed (seconds per padded token) of the batches so far,
    which keeps the overshoot within one batch. Pass `stop_before` to
    onnxrank.engine.execution.run_plan and call `ran` after each batch it yields.

    Args:
        deadline: The end, in time.perf_counter() seconds.
    """

    def __init__(self, deadline: float) -> None:
        self._deadline = deadline
        self._seconds_per_token = 0.0
        self._started = 0.0

    @classmethod
    def after(cls, deadline_ms: float) -> DeadlineGate:
        """A gate whose deadline is `deadline_ms` from now (<= 0: no batch runs)."""
        return cls(time.perf_counter() + deadline_ms / 1000.0)

    def stop_before(self, batch: Batch) -> bool:
        """Whether `batch` would end after the deadline (or it has passed already)."""
        now = time.perf_counter()
        self._started = now
        return (now >= self._deadline
                or now + self._seconds_per_token * batch.tokens > self._deadline)

    def ran(self, batch: Batch) -> None:
        """Record that `batch`, the one last let through, has run."""
        self._seconds_per_token = max(self._seconds_per_token,
                                      (time.perf_counter() - self._started) / batch.tokens)
