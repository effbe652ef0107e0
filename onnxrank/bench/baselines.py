"""What the engine is compared with, each scoring the same pairs on the same thread count.

- ``st``: sentence-transformers CrossEncoder on the PyTorch checkpoint the model was exported from
  (fp32, its default batch size of 32, ``torch.set_num_threads`` set explicitly).
- ``naive_ort``: onnxruntime on the same fp32 ONNX file, the way a first attempt looks: fixed
  batches of 32 in input order, every row padded to max_length.
- ``fastembed``: fastembed's TextCrossEncoder on our int8 file, registered as a custom model and
  loaded from the model directory (no hub download); ``fastembed_fp32``: the same on the plain
  fp32 ``model.onnx``, the file fastembed itself ships for MiniLM cross-encoders.
- The peers at their best (CTranslate2, FlashRank, sentence-transformers on OpenVINO): see
  onnxrank.bench.peers.

A baseline that cannot run here raises MissingDependencyError, DeviceUnavailableError or
ModelLoadError; the suite reports the message as the reason it skipped that baseline.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from onnxrank._optional import require
from onnxrank.bench import peer_worker
from onnxrank.engine.runtime import open_model_file
from onnxrank.engine.spec import ModelSpec, verify_files
from onnxrank.errors import DeviceUnavailableError, ModelLoadError
from onnxrank.types import Pair, Scores

logger = logging.getLogger(__name__)

NAIVE_BATCH_SIZE = 32
ST_BATCH_SIZE = 32  # CrossEncoder.predict's default
FASTEMBED_FILES = ("tokenizer.json", "tokenizer_config.json")
FASTEMBED_OPTIONAL_FILES = ("config.json", "special_tokens_map.json", "vocab.txt")
FASTEMBED_VARIANTS = ("int8", "fp32")
FASTEMBED_FILE_LABELS = {"int8": "our int8 file", "fp32": "the plain fp32 model.onnx, its default"}


def checkpoint_dir(spec: ModelSpec, model_dir: Path) -> Path:
    """The PyTorch checkpoint a model was exported from.

    1. Manifest ``source["checkpoint_dir"]``, relative to the model directory (the stand-ins).
    2. Else ``source["path"]`` of a model exported from a local checkpoint directory.

    Raises:
        ModelLoadError: Neither names an existing directory.
    """
    name = spec.source.get("checkpoint_dir")
    if name:
        path = Path(model_dir) / name
        if not path.is_dir():
            raise ModelLoadError(
                f"checkpoint directory {name!r} named by the manifest does not exist in {model_dir}"
            )
        return path
    local = spec.source.get("path") if spec.source.get("kind") == "local" else None
    if local and Path(local).is_dir():
        return Path(local)
    raise ModelLoadError(
        f"the manifest of {model_dir} names no PyTorch checkpoint (source['checkpoint_dir'] or "
        "an existing local source['path']), so the sentence-transformers baseline has nothing "
        "to load; export with the checkpoint saved beside the ONNX files"
    )


# the sentence-transformers baseline's precisions and the torch dtype each loads the model in
ST_DTYPES = {"fp32": "float32", "fp16": "float16"}


class SentenceTransformersBaseline:
    """sentence-transformers CrossEncoder (6.x) on PyTorch, default batch size: fp32 (the
    fidelity reference, "st") or, on CUDA, fp16 ("st_fp16": a GPU user's fastest path in one
    argument).

    Args:
        spec: The exported model's manifest.
        model_dir: Its directory (the checkpoint is found through the manifest).
        device: "cpu" or "cuda".
        threads: torch intra-op threads, set explicitly for the whole process.
        precision: "fp32" or "fp16" (CUDA only).

    Raises:
        MissingDependencyError: sentence-transformers is not installed.
        DeviceUnavailableError: device="cuda" but torch has no CUDA; fp16 on a CPU.
        ModelLoadError: No checkpoint directory.
        ValueError: A precision other than fp32 and fp16.
    """

    def __init__(self, spec: ModelSpec, model_dir: Path, *, device: str, threads: int,
                 precision: str = "fp32") -> None:
        if precision not in ST_DTYPES:
            raise ValueError(f"the sentence-transformers baseline runs "
                             f"{' or '.join(ST_DTYPES)}, not {precision!r}")
        self.name = "st" if precision == "fp32" else f"st_{precision}"
        if precision == "fp16" and device != "cuda":
            raise DeviceUnavailableError(
                "PyTorch fp16 is sentence-transformers' GPU path; on a CPU its fastest paths are "
                "the OpenVINO backend and its int8 export (st_openvino, st_openvino_int8)")
        path = checkpoint_dir(spec, model_dir)
        torch = require("torch", extra="bench")
        sentence_transformers = require("sentence_transformers", extra="bench")
        if device == "cuda" and not torch.cuda.is_available():
            raise DeviceUnavailableError(
                "torch.cuda.is_available() is False (a CPU-only torch build?), so the "
                "sentence-transformers baseline cannot run on cuda"
            )
        torch.set_num_threads(threads)
        if precision == "fp16":
            # at its best: torch prefers cuDNN's fp16 attention on Hopper, which builds a plan for
            # every new (rows, length) shape, and reranking meets a new shape in most batches
            # (research/cuda_check.py torch-attention); the engine leaves it out likewise
            torch.backends.cuda.enable_cudnn_sdp(False)
        # the precision asked for whatever the checkpoint's dtype: transformers 5 (which
        # sentence-transformers 6 needs) loads a checkpoint in its saved dtype by default, a
        # half-precision one in fp16 or bf16 even on a CPU. The default activation is the
        # checkpoint's own (6.x reads it from config_sentence_transformers.json, else sigmoid for
        # one label), as a user gets it.
        self._model = sentence_transformers.CrossEncoder(
            str(path), device=device, max_length=spec.max_length, local_files_only=True,
            model_kwargs={"dtype": getattr(torch, ST_DTYPES[precision])},
        )
        self.settings: dict[str, Any] = {
            "runtime": f"torch {torch.__version__}, sentence-transformers "
                       f"{sentence_transformers.__version__}",
            "device": device,
            "precision": precision,
            **({"attention": "sdpa without cuDNN"} if precision == "fp16" else {}),
            "threads": threads,
            "batch_size": ST_BATCH_SIZE,
            "checkpoint": str(path),
        }
        self.label = (f"sentence-transformers CrossEncoder (PyTorch {precision}, "
                      f"batch {ST_BATCH_SIZE})")
        self._identity = torch.nn.Identity()

    def score(self, pairs: Sequence[Pair]) -> Scores:
        """Scores of the pairs, in input order."""
        return np.asarray(
            self._model.predict(list(pairs), batch_size=ST_BATCH_SIZE, show_progress_bar=False),
            dtype=np.float32,
        )

    def score_logits(self, pairs: Sequence[Pair]) -> Scores:
        """The model's logits of the pairs, in input order: the fidelity reference, as a sigmoid
        in float32 ties every logit above about 17 at 1.0."""
        return np.asarray(
            self._model.predict(list(pairs), batch_size=ST_BATCH_SIZE, show_progress_bar=False,
                                activation_fn=self._identity),
            dtype=np.float32,
        )


class NaiveOrtBaseline:
    """onnxruntime on the fp32 file: batches of 32 in input order, each row padded to max_length.

    Args:
        spec: The exported model's manifest.
        model_dir: Its directory.
        device: "cpu" or "cuda".
        threads: onnxruntime intra-op threads.

    Raises:
        ValueError: onnxruntime cannot run fp32 on `device` here.
        DeviceUnavailableError: device="cuda" and the CUDA provider did not attach.
        ModelLoadError: No fp32 variant, or its file or the tokenizer cannot be loaded or does
            not match the manifest.
    """

    name = "naive_ort"

    def __init__(self, spec: ModelSpec, model_dir: Path, *, device: str, threads: int) -> None:
        if "fp32" not in spec.variants:
            raise ModelLoadError(f"the naive loop runs the fp32 variant; {model_dir} has "
                                 f"{', '.join(spec.variants)}")
        verify_files(spec, model_dir, ["fp32"])
        # Through the engine's runtime layer: the same session options as the engine's sessions.
        self._model = open_model_file(Path(model_dir) / spec.variants["fp32"].file,
                                      backend="onnxruntime", device=device, precision="fp32",
                                      threads=threads)
        tokenizer_path = Path(model_dir) / spec.tokenizer_file
        try:
            self._tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception as err:  # tokenizers raises a bare Exception on bad files
            raise ModelLoadError(f"could not load {tokenizer_path}: {err}") from err
        self._tokenizer.enable_truncation(spec.max_length)
        self._tokenizer.enable_padding(length=spec.max_length, pad_id=spec.pad_token_id)
        info = self._model.info
        self.settings = {
            "runtime": f"onnxruntime {info.runtime_version}",
            "device": info.device,
            "provider": info.provider,
            "variant": "fp32",
            "precision": info.precision,
            "model_file": info.model_file,
            "threads": info.threads,
            "batch_size": NAIVE_BATCH_SIZE,
            "padding": f"every row to max_length={spec.max_length}, input order",
        }
        self.label = f"naive onnxruntime loop (fp32, batch {NAIVE_BATCH_SIZE}, pad to {spec.max_length})"

    def score(self, pairs: Sequence[Pair]) -> Scores:
        """Scores of the pairs, in input order."""
        scores = []
        for start in range(0, len(pairs), NAIVE_BATCH_SIZE):
            encodings = self._tokenizer.encode_batch(list(pairs[start:start + NAIVE_BATCH_SIZE]))
            batch = {
                "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
            }
            scores.append(np.asarray(self._model.run(batch), dtype=np.float32)[:, 0])
        return np.concatenate(scores) if scores else np.zeros(0, dtype=np.float32)


class FastembedBaseline:
    """fastembed TextCrossEncoder on one of our files, loaded from the model directory offline.

    Args:
        spec: The exported model's manifest.
        model_dir: Its directory (must hold tokenizer.json and tokenizer_config.json).
        device: Only "cpu" (fastembed's CPU path; the int8 file is CPU-only anyway).
        threads: onnxruntime intra-op threads.
        variant: "int8" (our int8 file) or "fp32" (the plain ``model.onnx``, fastembed's own
            choice for MiniLM cross-encoders).

    Raises:
        MissingDependencyError: fastembed is not installed.
        DeviceUnavailableError: device is not "cpu".
        ModelLoadError: The variant is not exported, or tokenizer files fastembed needs are
            missing.
        ValueError: `variant` is neither "int8" nor "fp32".
    """

    name = "fastembed"

    def __init__(self, spec: ModelSpec, model_dir: Path, *, device: str, threads: int,
                 variant: str = "int8") -> None:
        model_file = fastembed_model_file(spec, Path(model_dir), variant=variant, device=device)
        require("fastembed", extra="fastembed")
        view = fastembed_view(spec, Path(model_dir), model_file)
        # The view lives as long as this baseline (fastembed may reopen files from it).
        weakref.finalize(self, shutil.rmtree, view, ignore_errors=True)
        self._score, settings = peer_worker.load_fastembed(
            str(view), model_file, fastembed_model_name(spec, variant), threads)
        self.settings = {**settings, **fastembed_settings(spec, Path(model_dir), model_file,
                                                           variant=variant)}
        self.label = fastembed_label(variant)

    def score(self, pairs: Sequence[Pair]) -> Scores:
        """Scores of the pairs, in input order."""
        return np.asarray(self._score(list(pairs)), dtype=np.float32)


def fastembed_model_file(spec: ModelSpec, model_dir: Path, *, variant: str, device: str) -> str:
    """The file of `variant` fastembed runs, after the checks every fastembed row makes.

    Raises:
        ValueError: `variant` is neither "int8" nor "fp32".
        DeviceUnavailableError: device is not "cpu".
        ModelLoadError: The variant is not exported, or tokenizer files fastembed needs are
            missing.
    """
    if variant not in FASTEMBED_VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(FASTEMBED_VARIANTS)}, "
                         f"got {variant!r}")
    if device != "cpu":
        raise DeviceUnavailableError(
            f"the fastembed baseline runs our {variant} file on fastembed's CPU path only")
    if variant not in spec.variants:
        raise ModelLoadError(f"fastembed baseline needs the {variant} variant; {model_dir} "
                             f"has {', '.join(spec.variants)}")
    missing = [name for name in FASTEMBED_FILES if not (model_dir / name).is_file()]
    if missing:
        raise ModelLoadError(f"the fastembed baseline needs {', '.join(missing)} in {model_dir}")
    return spec.variants[variant].file


def fastembed_model_name(spec: ModelSpec, variant: str) -> str:
    """The custom model name a fastembed row registers our file as."""
    return f"onnxrank-bench/{spec.name}-{variant}"


def fastembed_settings(spec: ModelSpec, model_dir: Path, model_file: str, *,
                       variant: str) -> dict[str, Any]:
    """A fastembed row's settings beyond what fastembed's loader reports."""
    return {"device": "cpu", "variant": variant, "precision": variant,
            "model_file": str(model_dir / model_file),
            "truncation": f"max_length={spec.max_length}, as the engine"}


def fastembed_label(variant: str) -> str:
    return (f"fastembed TextCrossEncoder ({FASTEMBED_FILE_LABELS[variant]}, batch "
            f"{peer_worker.FASTEMBED_BATCH_SIZE})")


def fastembed_view(spec: ModelSpec, model_dir: Path, model_file: str) -> Path:
    """A directory of links to the model's files whose tokenizer_config truncates at max_length.

    fastembed truncates at the smaller of tokenizer_config.json's ``model_max_length`` and
    ``max_length``; the MiniLM tokenizer config carries ``max_length: 128``, which would let
    fastembed read only a quarter of a long passage while the engine reads 512 tokens.
    """
    target = Path(tempfile.mkdtemp(prefix="onnxrank-bench-fastembed-"))
    for name in (model_file, "tokenizer.json", *FASTEMBED_OPTIONAL_FILES):
        if (model_dir / name).is_file():
            (target / name).symlink_to((model_dir / name).resolve())
    config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    config.update(model_max_length=spec.max_length, max_length=spec.max_length)
    (target / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return target
