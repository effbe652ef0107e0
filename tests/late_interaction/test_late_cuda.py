"""Late-interaction (ColBERT) exports on a real CUDA device: token vectors, stored document
vectors and MaxSim scores against the CPU and sentence-transformers' MultiVectorEncoder, through
IO binding.

Marked ``gpu``: deselected by default (this machine and CI have none); run them on a machine with
onnxruntime-gpu and a GPU with ``pytest -m gpu tests/late_interaction/test_late_cuda.py``. The
same checks on the CPU are in test_late_interaction.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from io_binding import io_bound_rows
from test_late_interaction import DOCUMENTS, QUERY, reference_scores

from onnxrank.engine.late_interaction import LateInteractionReranker
from onnxrank.engine.reranker import Reranker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                       reason="needs onnxruntime-gpu and a GPU"),
]

# fp32 on the CUDA provider (TF32 off) against the CPU's fp32: cuBLAS may sum in another order
VECTOR_MAX_ABS_DIFF = 1e-4


def test_cuda_scores_and_vectors_match_the_cpu_and_the_reference(
        bert_checkpoint_dir: Path, bert_model_dir: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    runs = io_bound_rows(monkeypatch)
    # auto: the late-interaction export builds fp32 and int8, and int8 is CPU-only
    on_cuda = Reranker.from_dir(bert_model_dir, device="cuda")
    on_cpu = Reranker.from_dir(bert_model_dir, device="cpu", backend="onnxruntime",
                               precision="fp32")
    assert isinstance(on_cuda, LateInteractionReranker)
    info = on_cuda.device_info
    assert (info.device, info.provider, info.variant) == ("cuda", "CUDAExecutionProvider", "fp32")
    runs.clear()
    pairs = [(QUERY, document) for document in DOCUMENTS]
    scores = on_cuda.score(pairs)
    assert runs, "the CUDA session ran without IO binding"
    expected = reference_scores(bert_checkpoint_dir, QUERY, DOCUMENTS)
    assert np.abs(scores - expected).max() <= 1e-3 * float(expected.std())
    np.testing.assert_allclose(scores, on_cpu.score(pairs), atol=1e-4 * float(expected.std()),
                               rtol=0)
    stored = on_cuda.encode_documents(DOCUMENTS)
    for mine, theirs in zip(stored, on_cpu.encode_documents(DOCUMENTS)):
        assert mine.shape == theirs.shape
        np.testing.assert_allclose(mine, theirs, atol=VECTOR_MAX_ABS_DIFF, rtol=0)
    np.testing.assert_allclose(on_cuda.score_vectors(QUERY, stored), scores, atol=1e-6, rtol=0)
