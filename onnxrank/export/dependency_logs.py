"""Dependencies' loggers held at onnxrank's level while the export calls them.

NNCF sets its own logger to INFO with a stdout handler on import; torch.onnx logs a line per
torchvision operator it cannot register; onnxscript logs its opset conversion's fallback;
transformers 5 logs a training notice when OpenVINO's tracer reads a model's attributes. None of
it is something a user of `onnxrank export` can act on; ``--verbose`` lowers onnxrank's level and
so lets the first kind through again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def dependency_logs_quieted(*names: str, floor: int = logging.NOTSET) -> Iterator[None]:
    """Inside the block each named logger logs only what onnxrank's logger would, and nothing
    below `floor`; their own levels come back after it."""
    level_inside = max(logging.getLogger("onnxrank").getEffectiveLevel(), floor)
    loggers = [logging.getLogger(name) for name in names]
    levels = [each.level for each in loggers]
    for each, level in zip(loggers, levels):
        each.setLevel(max(level, level_inside))
    try:
        yield
    finally:
        for each, level in zip(loggers, levels):
            each.setLevel(level)
