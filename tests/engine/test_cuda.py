"""The engine on a real CUDA device: fp16 against the PyTorch reference, IO binding, device choice.

Marked ``gpu``: deselected by default (this machine and CI have none); run them on a machine with
onnxruntime-gpu and a GPU with ``pytest -m gpu tests/engine/test_cuda.py``. The logic below the
device (provider lists, a CUDA provider that does not attach) is tested without one in
test_loading.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from io_binding import io_bound_rows
from test_reranker import DOCUMENTS, QUERY, spearman, torch_reference

from onnxrank import Reranker
from onnxrank.engine.backends.onnxruntime import CUDA_PROVIDER_OPTIONS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                       reason="needs onnxruntime-gpu and a GPU"),
]

PAIRS = [(QUERY, document) for document in DOCUMENTS] * 3
# fp16 on the tiny model (logits spread over ~9): the export's own fp16 gate, 0.05
FP16_MAX_ABS_DIFF = 5e-2
# fp32 on the CUDA provider: cuBLAS may sum in another order than the CPU (TF32 is off:
# CUDA_PROVIDER_OPTIONS)
CUDA_FP32_MAX_ABS_DIFF = 1e-3


def test_cuda_runs_fp16_with_io_binding_and_matches_pytorch(
    tiny_cuda_model_dir: Path, tiny_checkpoint_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = io_bound_rows(monkeypatch)
    reranker = Reranker.from_dir(tiny_cuda_model_dir, device="cuda")
    info = reranker.device_info
    assert (info.device, info.provider, info.variant, info.precision) == (
        "cuda", "CUDAExecutionProvider", "fp16", "fp16")
    # cuDNN's attention (a new plan for every shape) is left out, and TF32 is off
    options = reranker._runner.session.get_provider_options()["CUDAExecutionProvider"]
    assert {key: options[key] for key in CUDA_PROVIDER_OPTIONS} == CUDA_PROVIDER_OPTIONS
    runs.clear()  # the load's batch check ran through it too
    scores = reranker.score(PAIRS)
    expected = torch_reference(tiny_checkpoint_dir, PAIRS, reranker.config.max_length)
    assert scores.dtype == np.float32
    assert np.abs(scores - expected).max() <= FP16_MAX_ABS_DIFF
    assert spearman(scores, expected) >= 0.99
    # every distinct row went through IO binding (a pair repeated in one call runs once)
    assert sum(runs) == len(set(PAIRS))


def test_cuda_fp32_matches_the_cpu(tiny_cuda_model_dir: Path) -> None:
    on_cuda = Reranker.from_dir(tiny_cuda_model_dir, device="cuda", precision="fp32")
    on_cpu = Reranker.from_dir(tiny_cuda_model_dir, device="cpu", backend="onnxruntime",
                               precision="fp32")
    assert on_cuda.device_info.provider == "CUDAExecutionProvider"
    np.testing.assert_allclose(on_cuda.score(PAIRS), on_cpu.score(PAIRS),
                               atol=CUDA_FP32_MAX_ABS_DIFF, rtol=0)


def test_auto_device_chooses_cuda(tiny_cuda_model_dir: Path) -> None:
    reranker = Reranker.from_dir(tiny_cuda_model_dir, device="auto")
    assert reranker.device_info.device == "cuda"
    ranked = reranker.rerank(QUERY, DOCUMENTS)
    assert sorted(document.index for document in ranked) == list(range(len(DOCUMENTS)))
