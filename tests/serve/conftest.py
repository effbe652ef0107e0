"""Fixtures of the server tests: the tiny model's fp32 engine and a default server over it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_helpers import RunningServer, running_server

from onnxrank.engine.reranker import Reranker
from onnxrank.serve import ServeConfig


@pytest.fixture(scope="session")
def fp32_reranker(tiny_model_dir: Path) -> Reranker:
    """The tiny model's fp32 variant: batch mates change its scores by float rounding only."""
    return Reranker.from_dir(tiny_model_dir, device="cpu", precision="fp32", threads=1)


@pytest.fixture(scope="module")
def server(fp32_reranker: Reranker) -> Iterator[RunningServer]:
    """A default server over the fp32 engine."""
    with running_server(fp32_reranker, ServeConfig(port=0)) as running:
        yield running
