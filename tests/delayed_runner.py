"""A real runner made slower, to order or disturb the runtime probe in tests (the engine's own
runs stay real: only time is added)."""

from __future__ import annotations

import time


class DelayedRunner:
    """A real runner whose runs take `extra` seconds longer, and 0.2 s more while the machine is
    stalled (`stalls`: a shared count of timed runs left to stall; the warm-up run never is)."""

    def __init__(self, runner, extra: float, stalls: list[int] | None = None) -> None:  # noqa: ANN001
        self.runner, self.extra, self.runs = runner, extra, 0
        self.stalls = stalls if stalls is not None else [0]

    def run(self, feeds):  # noqa: ANN001, ANN201
        self.runs += 1
        stalled = self.runs > 1 and self.stalls[0] > 0
        if stalled:
            self.stalls[0] -= 1
        time.sleep(self.extra + (0.2 if stalled else 0.0))
        return self.runner.run(feeds)

    def with_info(self, **changes):  # noqa: ANN003, ANN201
        return self.runner.with_info(**changes)
