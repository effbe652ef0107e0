"""Seq2seq rerankers (the monot5 and mt5-mmarco recipes) on a real CUDA device: the tiny T5 and
mT5 exports with fp32 and fp16, through IO binding, against transformers' monoT5 scoring.

Marked ``gpu``: deselected by default (this machine and CI have none); run them on a machine with
onnxruntime-gpu and a GPU with ``pytest -m gpu tests/decoder/test_t5_cuda.py``. The same checks on
the CPU are in test_t5_reranker.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from built_once import built_once
from decoder_commands import export_decoder
from io_binding import io_bound_rows
from t5_checkpoint import CASES, MonoT5Reference, built_tiny_checkpoint

from onnxrank.engine.reranker import Reranker
from onnxrank.export.validate import load_validation_pairs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                       reason="needs onnxruntime-gpu and a GPU"),
]

# fp32 on the CUDA provider (TF32 off): the CPU test's bound against the reference
FP32_SHARE_OF_SPREAD = 1e-3
# fp16, CUDA's default for a decoder export that has it: the decoder GPU tests' bound
FP16_SHARE_OF_SPREAD = 5e-2


@pytest.fixture(scope="module", params=list(CASES))
def recipe(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def checkpoint(recipe: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_tiny_checkpoint(tmp_path_factory, recipe)


@pytest.fixture(scope="module")
def cuda_model_dir(recipe: str, checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The variants CUDA runs: `onnxrank export --recipe NAME --variants fp32,fp16`."""
    return built_once(tmp_path_factory, f"models/{recipe}-tiny-cuda", lambda out: export_decoder(
        checkpoint, recipe, out, "--variants", "fp32,fp16"))


@pytest.fixture(scope="module")
def scored(recipe: str, checkpoint: Path,
           cuda_model_dir: Path) -> tuple[list[tuple[str, str]], np.ndarray]:
    """Validation pairs the reference cuts nothing of (the export's max_length), and its scores."""
    reference = MonoT5Reference(checkpoint, CASES[recipe][2])
    max_length = json.loads((cuda_model_dir / "manifest.json").read_text())["max_length"]
    pairs = [(pair.query, pair.passage) for pair in load_validation_pairs(48)]
    pairs = [pair for pair in pairs if len(reference.token_ids(*pair)) <= max_length]
    return pairs, np.asarray(reference.score(pairs))


@pytest.mark.parametrize("precision", ["fp32", "auto"])
def test_cuda_scores_like_transformers(recipe: str, precision: str, cuda_model_dir: Path,
                                       scored: tuple[list[tuple[str, str]], np.ndarray],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    runs = io_bound_rows(monkeypatch)
    reranker = Reranker.from_dir(cuda_model_dir, device="cuda", precision=precision)
    info = reranker.device_info
    built = json.loads((cuda_model_dir / "manifest.json").read_text())["variants"]
    # auto on CUDA is fp16 where the export kept it (its CPU gate passed), else fp32
    expected_variant = "fp16" if precision == "auto" and "fp16" in built else "fp32"
    assert (info.device, info.provider, info.variant) == (
        "cuda", "CUDAExecutionProvider", expected_variant), (recipe, built)
    pairs, expected = scored
    assert len(pairs) >= 16
    runs.clear()
    scores = reranker.activate(reranker.score(pairs))
    assert sum(runs) == len(pairs)  # every row went through IO binding
    spread = float(np.ptp(expected))
    bound = FP16_SHARE_OF_SPREAD if expected_variant == "fp16" else FP32_SHARE_OF_SPREAD
    worst = float(np.abs(scores - expected).max())
    assert worst <= bound * spread, f"{recipe} {expected_variant}: max|Δ| {worst}, spread {spread}"
