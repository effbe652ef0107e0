"""Model loading, provider selection and load-time errors."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from onnxrank import Device, Reranker
from onnxrank.engine.backends.onnxruntime import providers_for
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.devices import resolve_device
from onnxrank.engine.embedder import Embedder
from onnxrank.engine.kinds import KINDS
from onnxrank.engine.late_interaction import LateInteractionReranker
from onnxrank.engine.model import KINDS as MODEL_KINDS
from onnxrank.engine.model import EngineModel
from onnxrank.engine.reranker import DecoderReranker
from onnxrank.engine.runtime import choose_candidates
from onnxrank.engine.spec import (
    ModelKind,
    load_model_spec,
    model_kind,
    sha256_file,
    write_manifest,
)
from onnxrank.errors import DeviceUnavailableError, ModelLoadError
from onnxrank.export.recipes import QWEN3_RERANKER
from onnxrank.types import Pair, Scores


@pytest.fixture()
def model_copy(tiny_model_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, target, ignore=shutil.ignore_patterns("checkpoint"))
    return target


def rewrite_manifest(model_dir: Path, **changes: object) -> None:
    data = json.loads((model_dir / "manifest.json").read_text())
    data.update(changes)
    (model_dir / "manifest.json").write_text(json.dumps(data))


def test_missing_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ModelLoadError, match=re.escape(
        f"model directory {missing} does not exist or is not a directory"
    )):
        Reranker.from_dir(missing)


def test_directory_without_manifest(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=re.escape(
        f"could not find manifest.json in {tmp_path}; export a model with `onnxrank export`"
    )):
        Reranker.from_dir(tmp_path)


def test_tampered_model_file_is_refused(model_copy: Path) -> None:
    with open(model_copy / "model.onnx", "ab") as handle:
        handle.write(b"tampered")
    with pytest.raises(ModelLoadError, match=re.escape(
        f"{model_copy / 'model.onnx'} does not match its manifest hash"
    )):
        Reranker.from_dir(model_copy, device="cpu", backend="onnxruntime", precision="fp32")


def test_unreadable_model_is_refused(model_copy: Path) -> None:
    (model_copy / "model.onnx").write_bytes(b"not an onnx file")
    spec = load_model_spec(model_copy)
    fp32 = replace(spec.variants["fp32"], sha256=sha256_file(model_copy / "model.onnx"))
    write_manifest(replace(spec, variants={**spec.variants, "fp32": fp32}), model_copy)
    with pytest.raises(ModelLoadError, match=re.escape(f"could not load {model_copy / 'model.onnx'}: ")):
        Reranker.from_dir(model_copy, device="cpu", backend="onnxruntime", precision="fp32")


def test_tokenizer_from_another_model_is_refused(model_copy: Path) -> None:
    rewrite_manifest(model_copy, vocab_size=1000)
    with pytest.raises(ModelLoadError, match=re.escape(
        f"tokenizer {model_copy / 'tokenizer.json'} has 30522 tokens but the model's vocabulary "
        "has 1000: the tokenizer does not belong to this model"
    )):
        Reranker.from_dir(model_copy, device="cpu", backend="onnxruntime", precision="fp32")


def test_embedding_model_is_refused(model_copy: Path) -> None:
    rewrite_manifest(model_copy, task="embedding")
    with pytest.raises(ModelLoadError, match=re.escape(
        f"{model_copy} holds a 'embedding' model, but this needs a cross-encoder exported with "
        "--task rerank"
    )):
        Reranker.from_dir(model_copy)


def test_the_kind_is_chosen_once_from_the_manifest(tiny_model_dir: Path,
                                                   tiny_embedder_dir: Path) -> None:
    # one table from manifest facts to a kind, one class per kind
    assert model_kind("rerank", None) is ModelKind.CROSS_ENCODER
    assert model_kind("rerank", QWEN3_RERANKER) is ModelKind.DECODER_RERANKER
    assert model_kind("embedding", None) is ModelKind.EMBEDDER
    with pytest.raises(ValueError, match=re.escape(
            "no model kind is a 'embedding' model with a prompt recipe; prompt recipes are for "
            "decoder rerankers (task 'rerank')")):
        model_kind("embedding", QWEN3_RERANKER)
    assert all(engine.kind is kind for kind, engine in KINDS.items())
    assert load_model_spec(tiny_model_dir).kind is ModelKind.CROSS_ENCODER
    # the base loads any kind as its own class; a kind's class refuses the others
    settings = {"device": "cpu", "backend": "onnxruntime", "precision": "fp32"}
    assert type(EngineModel.from_dir(tiny_model_dir, **settings)) is Reranker
    assert type(EngineModel.from_dir(tiny_embedder_dir, **settings)) is Embedder
    with pytest.raises(ModelLoadError, match=re.escape(
            f"{tiny_model_dir} holds a 'rerank' model, but this needs a decoder reranker "
            "exported with --recipe")):
        DecoderReranker.from_dir(tiny_model_dir, **settings)


def test_each_kind_class_records_itself_in_the_one_table() -> None:
    # every kind has its class, read-only, and a fresh interpreter that imports only the base
    # module gets the whole table (the package face imports every kind's module first)
    assert dict(KINDS) == {ModelKind.CROSS_ENCODER: Reranker,
                           ModelKind.DECODER_RERANKER: DecoderReranker,
                           ModelKind.EMBEDDER: Embedder,
                           ModelKind.LATE_INTERACTION: LateInteractionReranker}
    assert KINDS is MODEL_KINDS
    with pytest.raises(TypeError):
        KINDS[ModelKind.EMBEDDER] = Reranker  # type: ignore[index]
    listed = subprocess.run(
        [sys.executable, "-c", "from onnxrank.engine.model import KINDS; "
                               "print(sorted((k.name, c.__name__) for k, c in KINDS.items()))"],
        capture_output=True, text=True, check=True).stdout
    assert listed.strip() == str(sorted((kind.name, engine.__name__)
                                        for kind, engine in KINDS.items()))


def test_a_users_subclass_runs_as_itself(model_copy: Path) -> None:
    class TracedReranker(Reranker):
        """A user's variant: same kind, its own behaviour."""

        def score(self, pairs: Sequence[Pair], *, instruction: str | None = None) -> Scores:
            return super().score(pairs, instruction=instruction) + 1.0

    class StrictReranker(Reranker):
        kind = ModelKind.CROSS_ENCODER  # repeating the parent's kind is still a variant

    settings: dict[str, Any] = {"device": "cpu", "backend": "onnxruntime", "precision": "fp32"}
    traced = TracedReranker.from_dir(model_copy, **settings)
    plain = Reranker.from_dir(model_copy, **settings)
    assert type(traced) is TracedReranker and type(plain) is Reranker
    assert type(StrictReranker.from_dir(model_copy, **settings)) is StrictReranker
    assert KINDS[ModelKind.CROSS_ENCODER] is Reranker  # the variants did not replace the kind's class
    pairs = [("wing", "a wing in a slipstream")]
    np.testing.assert_array_equal(traced.score(pairs), plain.score(pairs) + 1.0)
    # a variant of one kind still refuses a model of another
    with pytest.raises(ModelLoadError, match=re.escape(
            f"{model_copy} holds a 'rerank' model, but this needs an embedding model exported "
            "with --task embedding, such as models/minilm-embedder")):
        Embedder.from_dir(model_copy)
    with pytest.raises(ModelLoadError, match=re.escape(
            f"{model_copy} holds a 'rerank' model, but this needs a late-interaction model (a "
            "ColBERT checkpoint exported with `onnxrank export`)")):
        LateInteractionReranker.from_dir(model_copy, **settings)


def test_a_second_class_for_a_kind_is_refused() -> None:
    with pytest.raises(TypeError, match=re.escape(
            f"{__name__}.test_a_second_class_for_a_kind_is_refused.<locals>.OtherEmbedder declares "
            "kind=EMBEDDER, which onnxrank.engine.embedder.Embedder runs already; a model kind is "
            "run by one class")):
        class OtherEmbedder(Reranker):
            kind = ModelKind.EMBEDDER
    assert KINDS[ModelKind.EMBEDDER] is Embedder


def test_stand_in_warns_that_scores_are_not_relevance(
    model_copy: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rewrite_manifest(model_copy, relevance_trained=False)
    with caplog.at_level(logging.WARNING, logger="onnxrank.engine.reranker"):
        Reranker.from_dir(model_copy, device="cpu", backend="onnxruntime", precision="fp32")
    assert "its scores are not relevance scores" in caplog.text


def test_from_pretrained_resolves_names(tiny_model_dir: Path, tmp_path: Path) -> None:
    models_dir = tiny_model_dir.parent
    by_name = Reranker.from_pretrained(tiny_model_dir.name, models_dir=models_dir, device="cpu")
    by_path = Reranker.from_pretrained(tiny_model_dir, device="cpu")
    pairs = [("wing", "a wing in a slipstream")]
    np.testing.assert_array_equal(by_name.score(pairs), by_path.score(pairs))
    assert Reranker.locate(tiny_model_dir.name, models_dir=models_dir,
                           config=EngineConfig()).resolve() == tiny_model_dir.resolve()
    with pytest.raises(ModelLoadError, match=re.escape(
        f"no exported model named 'missing' in {tmp_path.resolve()}"
    )):
        Reranker.from_pretrained("missing", models_dir=tmp_path)


# --- provider selection: this machine has no GPU, so the provider lists are faked ---------------

CPU_ONLY = ["AzureExecutionProvider", "CPUExecutionProvider"]
WITH_CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]


def test_resolve_device_cases(caplog: pytest.LogCaptureFixture) -> None:
    assert resolve_device("cpu", WITH_CUDA) is Device.CPU
    assert resolve_device("cuda", WITH_CUDA) is Device.CUDA
    with caplog.at_level(logging.INFO, logger="onnxrank.engine.devices"):
        assert resolve_device("auto", WITH_CUDA) is Device.CUDA
        assert resolve_device("auto", CPU_ONLY) is Device.CPU
    assert "device='auto' chose cuda" in caplog.text and "device='auto' chose cpu" in caplog.text
    with pytest.raises(ValueError, match=re.escape(
        "device must be one of 'cpu', 'cuda', 'auto', got 'tpu'"
    )):
        resolve_device("tpu", CPU_ONLY)


def test_explicit_cuda_without_provider_names_the_available_ones(tiny_model_dir: Path) -> None:
    with pytest.raises(DeviceUnavailableError, match=re.escape(
        "device='cuda' was requested but CUDAExecutionProvider is not available (available "
        "providers: AzureExecutionProvider, CPUExecutionProvider). Install onnxruntime-gpu"
    )):
        resolve_device("cuda", CPU_ONLY)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(DeviceUnavailableError):
            Reranker.from_dir(tiny_model_dir, device="cuda")


def test_cuda_sessions_leave_out_cudnn_attention_and_tf32() -> None:
    cuda, cpu = providers_for(Device.CUDA)
    assert (cuda[0], cpu) == ("CUDAExecutionProvider", "CPUExecutionProvider")
    options = cuda[1]
    cudnn_attention = 8  # onnxruntime's sdpa_kernel bit for cuDNN's attention
    assert int(options["sdpa_kernel"]) & cudnn_attention == 0 and int(options["sdpa_kernel"]) > 0
    assert options["use_tf32"] == "0"
    assert providers_for(Device.CPU) == ["CPUExecutionProvider"]


def test_cuda_never_runs_int8(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ort, "get_available_providers", lambda: WITH_CUDA)
    spec = load_model_spec(tiny_model_dir)
    assert [c.label for c in choose_candidates(spec, Device.CUDA, "auto", "auto")[0]] == [
        "onnxruntime/fp16"]
    assert [c.label for c in choose_candidates(spec, Device.CPU, "onnxruntime", "auto")[0]] == [
        "onnxruntime/int8"]  # per-row int8: within the batch bound (test_batch_gate.py)
    with pytest.raises(ValueError, match=re.escape(
        "onnxruntime/int8: precision='int8' is CPU-only; on CUDA use 'fp16', 'opt' or 'fp32'"
    )):
        choose_candidates(spec, Device.CUDA, "onnxruntime", "int8")


def test_cuda_that_does_not_attach(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """onnxruntime lists CUDA but the session falls back to CPU (e.g. missing cuDNN)."""
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("a real CUDA provider is present")
    monkeypatch.setattr(ort, "get_available_providers", lambda: WITH_CUDA)
    with pytest.raises(DeviceUnavailableError, match=re.escape(
        "CUDAExecutionProvider is installed but did not attach to "
        f"{tiny_model_dir / 'model_fp16.onnx'} (session providers: CPUExecutionProvider); the "
        "usual cause is missing or mismatched CUDA/cuDNN libraries."
    )):
        Reranker.from_dir(tiny_model_dir, device="cuda")
    with caplog.at_level(logging.WARNING, logger="onnxrank.engine.runtime"):
        reranker = Reranker.from_dir(tiny_model_dir, device="auto", backend="onnxruntime")
    # onnxruntime's first CPU choice: the tiny model's per-row int8 is batch-independent
    assert reranker.device_info.device == "cpu" and reranker.device_info.variant == "int8"
    assert "Falling back to CPU because device='auto'" in caplog.text
