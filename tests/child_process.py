"""Run a heavy call (an export) in a child process, so that the memory it takes goes back when it ends.

An export grows the heap with torch tracing, onnxruntime quantization, OpenVINO and NNCF state
that glibc's arenas do not give back to the system: in the pytest process, every export's peak
(1-2.5 GB for a tiny model) would stay resident for the rest of the session and add up. In a child
it is returned when the child exits.

The call is the same code with the same arguments: `in_child_process` returns what it returns and
raises what it raises (an ExportError from the child is an ExportError here, with the child's
traceback as its cause). Children fork from a server that has imported torch, transformers,
onnxruntime, OpenVINO and NNCF once (_PRELOAD), so a call does not pay the seconds of CPU of
importing them again. The child runs with the caller's environment and working directory of the
moment of the call. What it prints or logs is not captured by `capsys`/`caplog`: tests that read
those call in the test process.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

Result = TypeVar("Result")

# imported once by the fork server. transformers imports its model classes lazily, and their first
# use pulls in generation utilities, scikit-learn, SciPy and torch._dynamo: about 2 s of every
# child's 4 s export of a tiny model before these were preloaded (OpenVINO and NNCF add 0.5 s)
_PRELOAD = ["torch", "transformers", "transformers.models.auto.modeling_auto", "onnx", "onnxruntime",
            "onnxruntime.quantization", "onnxruntime.transformers.optimizer", "openvino", "nncf",
            "onnxrank.export.pipeline", "onnxrank.cli"]


def _call_as(environment: dict[str, str], directory: str, function: Callable[..., Result],
             args: tuple[Any, ...], kwargs: dict[str, Any]) -> Result:
    os.environ.clear()
    os.environ.update(environment)
    os.chdir(directory)
    return function(*args, **kwargs)


def in_child_process(function: Callable[..., Result], /, *args: Any, **kwargs: Any) -> Result:
    """`function(*args, **kwargs)` in a fresh child process (function and arguments must pickle)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_call_as, dict(os.environ), os.getcwd(), function, args, kwargs).result()
