"""Fixtures of the decoder-reranker tests: a tiny random Qwen3ForCausalLM with a byte-level BPE
tokenizer (chat special tokens, single-token "yes"/"no"), exported through the CLI with the
qwen3-reranker recipe (in a child process, whose memory goes back when it ends), and the model
card's transformers recipe on the same checkpoint; and the same for every built-in recipe
(``recipe_*`` fixtures, parametrised over RECIPE_MODELS). Checkpoints and exports are built once
per run (tests/built_once.py): pytest rebuilds a parametrised session fixture whenever a file
switches its parameter back."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from built_once import built_once
from decoder_commands import MAX_LENGTH, export_decoder
from decoder_reference import BgeGemmaCard, ModelCardReranker, MxbaiCard

from onnxrank.engine.reranker import Reranker


@pytest.fixture(scope="session")
def decoder_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from onnxrank.export.decoder_standin import build_decoder_checkpoint

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return built_once(tmp_path_factory, "checkpoints/qwen3-tiny",
                      lambda directory: build_decoder_checkpoint(directory, size="tiny", seed=0))


@pytest.fixture(scope="session")
def decoder_model_dir(decoder_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`onnxrank export --model DIR --recipe qwen3-reranker --out OUT`, as a user runs it."""
    return built_once(tmp_path_factory, "models/qwen3-tiny-reranker",
                      lambda out: export_decoder(decoder_checkpoint, "qwen3-reranker", out))


@pytest.fixture(scope="session")
def st_checkpoint(decoder_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Qwen3 stand-in with Qwen3-Reranker's prompt as its chat template, saved by
    sentence-transformers 6 as a CrossEncoder (Transformer(text-generation) + LogitScore)."""
    from st_checkpoints import build_st_reranker

    return built_once(tmp_path_factory, "checkpoints/qwen3-tiny-st",
                      lambda directory: build_st_reranker(decoder_checkpoint, directory))


@pytest.fixture(scope="session")
def st_model_dir(st_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`onnxrank export --model DIR --out OUT` of `st_checkpoint`: no --recipe, the recipe is
    read from its sentence-transformers files; every variant."""
    return built_once(tmp_path_factory, "models/qwen3-tiny-st",
                      lambda out: export_decoder(st_checkpoint, None, out))


@pytest.fixture(scope="session")
def model_card(decoder_checkpoint: Path) -> ModelCardReranker:
    return ModelCardReranker(decoder_checkpoint, MAX_LENGTH)


@pytest.fixture(scope="session")
def fp32_decoder(decoder_model_dir: Path) -> Reranker:
    return Reranker.from_dir(decoder_model_dir, device="cpu", backend="onnxruntime",
                             precision="fp32", threads=1)


# The built-in recipes, each on a tiny random checkpoint of its architecture: the builder, the
# model card's formula (decoder_reference), and the checkpoint's weight init (a random model's
# answer logits need some spread across pairs, Gemma's scaled embeddings flatten them at 0.1,
# and weight-only int8 must pass its gate for the default variant to be a quantized one).
RECIPE_MODELS = {
    "qwen3-reranker": None,  # the Qwen3 stand-in above (decoder_checkpoint, decoder_model_dir)
    "bge-reranker-v2-gemma": ("build_gemma_checkpoint", BgeGemmaCard, 0.2),
    "mxbai-rerank-v2": ("build_qwen2_checkpoint", MxbaiCard, 0.08),
}
# what the recipe tests export: the reference, onnxruntime int8, OpenVINO weight-only int8 and
# fp16 (test_decoder_fp16.py reads it here: a second export of fp32 and fp16 per recipe cost a
# trace and a validation more; no CPU default picks fp16)
RECIPE_VARIANTS = "fp32,int8,ov_int8,fp16"


@pytest.fixture(scope="session", params=list(RECIPE_MODELS))
def recipe_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def recipe_checkpoint(recipe_name: str, request: pytest.FixtureRequest,
                      tmp_path_factory: pytest.TempPathFactory) -> Path:
    import recipe_checkpoints

    case = RECIPE_MODELS[recipe_name]
    if case is None:
        return Path(request.getfixturevalue("decoder_checkpoint"))
    builder, _, init = case
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return built_once(tmp_path_factory, f"checkpoints/{recipe_name}", lambda directory: getattr(
        recipe_checkpoints, builder)(directory, initializer_range=init))


@pytest.fixture(scope="session")
def recipe_model_dir(recipe_name: str, recipe_checkpoint: Path, request: pytest.FixtureRequest,
                     tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`onnxrank export --model DIR --recipe NAME --variants ...`, once per recipe."""
    if RECIPE_MODELS[recipe_name] is None:
        return Path(request.getfixturevalue("decoder_model_dir"))
    return built_once(tmp_path_factory, f"models/{recipe_name}", lambda out: export_decoder(
        recipe_checkpoint, recipe_name, out, "--variants", RECIPE_VARIANTS))


@pytest.fixture(scope="session")
def recipe_cuda_dir(recipe_name: str, recipe_checkpoint: Path,
                    tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recipe's checkpoint exported with the variants a decoder runs on CUDA, fp32 and fp16
    (its int8 variants are CPU-only); used by the gpu-marked tests."""
    return built_once(tmp_path_factory, f"models/{recipe_name}-cuda", lambda out: export_decoder(
        recipe_checkpoint, recipe_name, out, "--variants", "fp32,fp16"))


@pytest.fixture(scope="session")
def recipe_card(recipe_name: str, recipe_checkpoint: Path,
                request: pytest.FixtureRequest) -> ModelCardReranker | BgeGemmaCard | MxbaiCard:
    case = RECIPE_MODELS[recipe_name]
    if case is None:
        return request.getfixturevalue("model_card")  # type: ignore[no-any-return]
    return case[1](recipe_checkpoint, MAX_LENGTH)


@pytest.fixture(scope="session")
def recipe_fp32(recipe_name: str, recipe_model_dir: Path, request: pytest.FixtureRequest) -> Reranker:
    if RECIPE_MODELS[recipe_name] is None:
        return request.getfixturevalue("fp32_decoder")  # type: ignore[no-any-return]
    return Reranker.from_dir(recipe_model_dir, device="cpu", backend="onnxruntime",
                             precision="fp32", threads=1)
