"""Decoder rerankers on a real CUDA device: every built-in recipe's tiny fp32 and fp16 exports,
with and without prefix reuse, against the model card's PyTorch code, through IO binding.

Marked ``gpu``: deselected by default (this machine and CI have none); run them on a machine with
onnxruntime-gpu and a GPU with ``pytest -m gpu tests/decoder/test_decoder_cuda.py``. The same
checks on the CPU are in test_decoder_prefix.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from test_decoder_prefix import prefix_pairs

from onnxrank.engine.backends.onnxruntime import OnnxruntimeRunner
from onnxrank.engine.batch_invariance import BATCH_DEPENDENCE_BOUND
from onnxrank.engine.reranker import Reranker
from onnxrank.engine.runtime import default_choice_cache

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

    def counted(self: OnnxruntimeRunner, feeds: dict[str, np.ndarray], *rest: Any) -> np.ndarray:
        runs.append(tuple(sorted(feeds)))
        return bound_run(self, feeds, *rest)

    monkeypatch.setattr(OnnxruntimeRunner, "_run_with_io_binding", counted)
    reused = Reranker.from_dir(recipe_cuda_dir, device="cuda", precision="fp32")
    whole = Reranker.from_dir(recipe_cuda_dir, device="cuda", precision="fp32", prefix_reuse=False)
    for reranker in (reused, whole):
        info = reranker.device_info
        assert (info.device, info.provider, info.precision) == (
            "cuda", "CUDAExecutionProvider", "fp32")
    assert reused.uses_prefix_graph and not whole.uses_prefix_graph
    pairs = prefix_pairs(whole)
    runs.clear()
    with_prefix = reused.score(pairs)
    prefix_runs = len(runs)
    without = whole.score(pairs)
    assert prefix_runs and len(runs) > prefix_runs  # both engines ran through IO binding
    assert np.abs(with_prefix - without).max() <= 1e-4 * without.std(), recipe_name
    expected = recipe_card.score(pairs)
    assert np.abs(reused.activate(with_prefix) - expected).max() <= 1e-4, recipe_name


def test_a_rows_fp32_score_on_cuda_does_not_depend_on_its_batch_mates(
        recipe_cuda_dir: Path) -> None:
    # fp32 only: fp16's rounding follows the kernels cuBLAS picks per shape (on an H100 the tiny
    # mxbai-rerank-v2's fp16 score moved by 5.9e-4, 8e-3 x its spread of 0.074)
    reranker = Reranker.from_dir(recipe_cuda_dir, device="cuda", precision="fp32")
    pairs = prefix_pairs(reranker)[:8]
    together = reranker.score(pairs)
    alone = np.array([reranker.score([pair])[0] for pair in pairs])
    assert np.abs(together - alone).max() <= 1e-4 * together.std()


# fp16 against fp32 and the card, as a share of the scores' spread: float16 rounds each layer's
# activations (the CPU check, test_decoder_fp16.py, measured up to 0.013 x the spread)
FP16_TOLERANCE = 0.05


def test_fp16_is_cudas_default_for_a_decoder_with_and_without_prefix_reuse(
        recipe_name: str, recipe_cuda_dir: Path, recipe_card: Any) -> None:
    reused = Reranker.from_dir(recipe_cuda_dir, device="cuda")
    whole = Reranker.from_dir(recipe_cuda_dir, device="cuda", prefix_reuse=False)
    for reranker in (reused, whole):
        info = reranker.device_info
        assert (info.device, info.provider, info.variant, info.precision) == (
            "cuda", "CUDAExecutionProvider", "fp16", "fp16"), recipe_name
    assert not whole.uses_prefix_graph
    if not reused.uses_prefix_graph:  # only where the load's prefix check measured why
        checks = [entry["moved"] for key, entry in json.loads(
            default_choice_cache().read_text()).items()
            if key.endswith("/prefix") and entry["prefix_check"] == "onnxruntime/fp16"]
        assert checks and min(checks) > BATCH_DEPENDENCE_BOUND, recipe_name
    pairs = prefix_pairs(whole)
    with_prefix, without = reused.score(pairs), whole.score(pairs)
    spread = float(without.std())
    assert np.abs(with_prefix - without).max() <= FP16_TOLERANCE * spread, recipe_name
    expected = recipe_card.score(pairs)
    for scores in (with_prefix, without):
        activated = reused.activate(scores)
        assert np.abs(activated - expected).max() <= FP16_TOLERANCE * expected.std(), (
            f"{recipe_name}: fp16 on CUDA vs the model card: max |diff| "
            f"{np.abs(activated - expected).max():.3g}, card spread {expected.std():.3g}")
