"""The rows each CUDA run sends through onnxruntime's IO binding, for the gpu-marked tests (a plain
module: test files of several folders import it by name)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from onnxrank.engine.backends.onnxruntime import OnnxruntimeRunner


def io_bound_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, the row count of every run through IO binding, appended as it runs."""
    rows: list[int] = []
    bound_run = OnnxruntimeRunner._run_with_io_binding

    def counted(self: OnnxruntimeRunner, feeds: dict[str, np.ndarray], *rest: Any) -> np.ndarray:
        rows.append(len(feeds["input_ids"]))
        return bound_run(self, feeds, *rest)

    monkeypatch.setattr(OnnxruntimeRunner, "_run_with_io_binding", counted)
    return rows
