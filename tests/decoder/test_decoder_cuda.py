"""Decoder rerankers on a real CUDA device: every built-in recipe's tiny fp32 export, with and
without prefix reuse, against the model card's PyTorch code, through IO binding.

Marked ``gpu``: deselected by default (this machine and CI have none); run them on a machine with
onnxruntime-gpu and a GPU with ``pytest -m gpu tests/decoder/test_decoder_cuda.py``. The same
checks on the CPU are in test_decoder_prefix.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from test_decoder_prefix import prefix_pairs

from onnxrank.engine.backends.onnxruntime import OnnxruntimeRunner
from onnxrank.engine.reranker import Reranker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                       reason="needs onnxruntime-gpu and a GPU"),
]


def test_prefix_reuse_on_cuda_equals_whole_rows_and_the_model_card(
        recipe_name: str, recipe_cuda_dir: Path, recipe_card: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[tuple[str, ...]] = []
    bound_run = OnnxruntimeRunner._run_with_io_binding

    def counted(self: OnnxruntimeRunner, feeds: dict[str, np.ndarray]) -> np.ndarray:
        runs.append(tuple(sorted(feeds)))
        return bound_run(self, feeds)

    monkeypatch.setattr(OnnxruntimeRunner, "_run_with_io_binding", counted)
    reused = Reranker.from_dir(recipe_cuda_dir, device="cuda")
    whole = Reranker.from_dir(recipe_cuda_dir, device="cuda", prefix_reuse=False)
    for reranker in (reused, whole):
        info = reranker.device_info
        assert (info.device, info.provider, info.precision) == (
            "cuda", "CUDAExecutionProvider", "fp32")
    assert reused.uses_prefix_graph and not whole.uses_prefix_graph
    pairs = prefix_pairs()
    runs.clear()
    with_prefix = reused.score(pairs)
    prefix_runs = len(runs)
    without = whole.score(pairs)
    assert prefix_runs and len(runs) > prefix_runs  # both engines ran through IO binding
    assert np.abs(with_prefix - without).max() <= 1e-4 * without.std(), recipe_name
    expected = recipe_card.score(pairs)
    assert np.abs(reused.activate(with_prefix) - expected).max() <= 1e-4, recipe_name


def test_a_rows_score_on_cuda_does_not_depend_on_its_batch_mates(recipe_cuda_dir: Path) -> None:
    reranker = Reranker.from_dir(recipe_cuda_dir, device="cuda")
    pairs = prefix_pairs()[:8]
    together = reranker.score(pairs)
    alone = np.array([reranker.score([pair])[0] for pair in pairs])
    assert np.abs(together - alone).max() <= 1e-4 * together.std()
