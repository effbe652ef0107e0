"""Baselines score the same pairs as the engine (so the speed comparison is like for like)."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from onnxrank import Reranker
from onnxrank.bench.baselines import (
    FastembedBaseline,
    NaiveOrtBaseline,
    SentenceTransformersBaseline,
    checkpoint_dir,
)
from onnxrank.engine.spec import load_model_spec
from onnxrank.errors import DeviceUnavailableError, MissingDependencyError, ModelLoadError

QUERY = "what similarity laws must be obeyed when constructing aeroelastic models"
DOCUMENTS = [
    "experimental investigation of the aerodynamics of a wing in a slipstream .",
    "the theory of aeroelastic models of heated high speed aircraft and their similarity laws",
    "simple shear flow past a flat plate in an incompressible fluid of small viscosity . " * 3,
    "heat conduction in composite slabs",
]
PAIRS = [(QUERY, document) for document in DOCUMENTS]


@pytest.fixture(scope="module")
def spec(tiny_model_dir: Path):
    return load_model_spec(tiny_model_dir)


def test_naive_loop_matches_engine_fp32(tiny_model_dir: Path, spec) -> None:
    engine = Reranker.from_dir(tiny_model_dir, device="cpu", backend="onnxruntime",
                               precision="fp32", threads=1)
    naive = NaiveOrtBaseline(spec, tiny_model_dir, device="cpu", threads=1)
    np.testing.assert_allclose(naive.score(PAIRS), engine.score(PAIRS), atol=1e-4,
                               err_msg="naive onnxruntime loop vs engine fp32, tiny-reranker")
    assert naive.settings["variant"] == "fp32" and naive.settings["threads"] == 1
    assert naive.settings["precision"] == "fp32"


def test_sentence_transformers_matches_engine_fp32(tiny_model_dir: Path, spec) -> None:
    engine = Reranker.from_dir(tiny_model_dir, device="cpu", backend="onnxruntime",
                               precision="fp32", threads=1)
    baseline = SentenceTransformersBaseline(spec, tiny_model_dir, device="cpu", threads=1)
    # CrossEncoder.predict applies its default activation (sigmoid for one label): same work.
    expected = 1.0 / (1.0 + np.exp(-engine.score(PAIRS)))
    np.testing.assert_allclose(baseline.score(PAIRS), expected, atol=1e-3,
                               err_msg="sentence-transformers vs engine fp32, tiny-reranker")
    assert baseline.settings["precision"] == "fp32" and baseline.settings["threads"] == 1
    assert baseline.settings["checkpoint"] == str(checkpoint_dir(spec, tiny_model_dir))


def test_sentence_transformers_runs_a_half_precision_checkpoint_in_fp32(
    tiny_checkpoint_dir: Path, tiny_model_dir: Path, tmp_path: Path, spec
) -> None:
    """transformers 5 loads a checkpoint in its saved dtype by default (fp16 here, even on a
    CPU); the baseline is labelled PyTorch fp32, so it must load it in fp32."""
    import torch
    import transformers

    half = tmp_path / "fp16-checkpoint"
    shutil.copytree(tiny_checkpoint_dir, half)
    transformers.AutoModelForSequenceClassification.from_pretrained(
        str(tiny_checkpoint_dir), dtype=torch.float16).save_pretrained(str(half))
    assert transformers.AutoConfig.from_pretrained(str(half)).dtype == torch.float16
    local = dataclasses.replace(spec, source={"kind": "local", "path": str(half)})
    baseline = SentenceTransformersBaseline(local, tiny_model_dir, device="cpu", threads=1)
    assert baseline._model.dtype == torch.float32
    scores = baseline.score(PAIRS)
    assert scores.dtype == np.float32 and scores.shape == (len(PAIRS),)
    assert np.isfinite(scores).all()


def test_sentence_transformers_fp16_is_the_gpu_path(tiny_model_dir: Path, spec) -> None:
    """st_fp16 runs on CUDA only (tests/bench/test_bench_runs.py measures it there): on a CPU it
    is refused with the peers that are a CPU user's fast paths, before loading anything."""
    with pytest.raises(DeviceUnavailableError, match="st_openvino, st_openvino_int8"):
        SentenceTransformersBaseline(spec, tiny_model_dir, device="cpu", threads=1,
                                     precision="fp16")
    with pytest.raises(ValueError, match="fp32 or fp16, not 'bf16'"):
        SentenceTransformersBaseline(spec, tiny_model_dir, device="cpu", threads=1,
                                     precision="bf16")


# fastembed pins huggingface-hub<2, below transformers 5 and sentence-transformers 6, so [all]
# leaves it out: its score checks are deselected by default (marker `fastembed`) and run with
# `python -m pytest -m fastembed` where onnxrank[fastembed] is installed
needs_fastembed = pytest.mark.fastembed


def test_fastembed_baseline_checks_its_arguments_before_importing(tiny_model_dir: Path, spec) -> None:
    with pytest.raises(DeviceUnavailableError, match=re.escape(
        "the fastembed baseline runs our int8 file on fastembed's CPU path only"
    )):
        FastembedBaseline(spec, tiny_model_dir, device="cuda", threads=1)
    with pytest.raises(ValueError, match=re.escape("variant must be one of int8, fp32, got 'opt'")):
        FastembedBaseline(spec, tiny_model_dir, device="cpu", threads=1, variant="opt")
    if importlib.util.find_spec("fastembed") is None:
        with pytest.raises(MissingDependencyError, match=re.escape(
                'pip install "onnxrank[fastembed]"')):
            FastembedBaseline(spec, tiny_model_dir, device="cpu", threads=1)


@needs_fastembed
def test_fastembed_runs_our_int8_file_at_full_length(tiny_model_dir: Path, spec) -> None:
    # Dynamic int8 scales activations per batch, so the engine runs fastembed's batches: input
    # order, padded to the longest row.
    engine = Reranker.from_dir(tiny_model_dir, device="cpu", backend="onnxruntime",
                               precision="int8", threads=1, sort_by_length=False,
                               pad_to_multiple=1)
    baseline = FastembedBaseline(spec, tiny_model_dir, device="cpu", threads=1)
    np.testing.assert_allclose(baseline.score(PAIRS), engine.score(PAIRS), atol=1e-3,
                               err_msg="fastembed vs engine int8, tiny-reranker")
    # A 300-token document: fastembed must read past the 128 tokens MiniLM's config suggests.
    long_pairs = [(QUERY, DOCUMENTS[2] * 6)] * 2
    np.testing.assert_allclose(baseline.score(long_pairs), engine.score(long_pairs), atol=1e-3)


@needs_fastembed
def test_fastembed_on_its_default_fp32_file_matches_engine_fp32(tiny_model_dir: Path, spec) -> None:
    engine = Reranker.from_dir(tiny_model_dir, device="cpu", backend="onnxruntime",
                               precision="fp32", threads=1)
    baseline = FastembedBaseline(spec, tiny_model_dir, device="cpu", threads=1, variant="fp32")
    np.testing.assert_allclose(baseline.score(PAIRS), engine.score(PAIRS), atol=1e-4,
                               err_msg="fastembed on model.onnx vs engine fp32, tiny-reranker")
    assert baseline.settings["precision"] == "fp32"
    assert baseline.settings["model_file"] == str(tiny_model_dir / spec.variants["fp32"].file)


def test_checkpoint_lookup(tiny_model_dir: Path, tiny_checkpoint_dir: Path, spec) -> None:
    assert checkpoint_dir(spec, tiny_model_dir) == tiny_checkpoint_dir
    named = dataclasses.replace(spec, source={"checkpoint_dir": "checkpoint"})
    with pytest.raises(ModelLoadError, match=re.escape(
        f"checkpoint directory 'checkpoint' named by the manifest does not exist in {tiny_model_dir}"
    )):
        checkpoint_dir(named, tiny_model_dir)
    with pytest.raises(ModelLoadError, match=re.escape(
        f"the manifest of {tiny_model_dir} names no PyTorch checkpoint"
    )):
        checkpoint_dir(dataclasses.replace(spec, source={"kind": "hub"}), tiny_model_dir)
