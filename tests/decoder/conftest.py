"""Fixtures of the decoder-reranker tests: a tiny random Qwen3ForCausalLM with a byte-level BPE
tokenizer (chat special tokens, single-token "yes"/"no"), exported once through the CLI with the
qwen3-reranker recipe (in a child process, whose memory goes back when it ends), and the model
card's transformers recipe on the same checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from child_process import in_child_process
from decoder_reference import ModelCardReranker

from onnxrank.engine.reranker import Reranker

# the tiny tokenizer spends about 180 tokens on the recipe's fixed text, so rows need room
MAX_LENGTH = 320
VALIDATION_PAIRS = "48"


@pytest.fixture(scope="session")
def decoder_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from onnxrank.export.decoder_standin import build_decoder_checkpoint

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    directory = tmp_path_factory.mktemp("checkpoints") / "qwen3-tiny"
    build_decoder_checkpoint(directory, size="tiny", seed=0)
    return directory


@pytest.fixture(scope="session")
def decoder_model_dir(decoder_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`onnxrank export --model DIR --recipe qwen3-reranker --out OUT`, as a user runs it."""
    from onnxrank.cli import main

    out = tmp_path_factory.mktemp("models") / "qwen3-tiny-reranker"
    code = in_child_process(main, ["export", "--model", str(decoder_checkpoint), "--recipe",
                                   "qwen3-reranker", "--out", str(out), "--max-length",
                                   str(MAX_LENGTH), "--validation-pairs", VALIDATION_PAIRS, "--quiet"])
    assert code == 0, "the decoder export failed (see the captured stderr)"
    return out


@pytest.fixture(scope="session")
def model_card(decoder_checkpoint: Path) -> ModelCardReranker:
    return ModelCardReranker(decoder_checkpoint, MAX_LENGTH)


@pytest.fixture(scope="session")
def fp32_decoder(decoder_model_dir: Path) -> Reranker:
    return Reranker.from_dir(decoder_model_dir, device="cpu", backend="onnxruntime",
                             precision="fp32", threads=1)
