"""Fixtures of the integration tests: the tiny exported model, loaded once in fp32."""

from __future__ import annotations

from pathlib import Path

import pytest

from onnxrank import Reranker


@pytest.fixture(scope="module")
def fp32(tiny_model_dir: Path) -> Reranker:
    return Reranker.from_dir(tiny_model_dir, device="cpu", precision="fp32")
