"""The model directory contract: `manifest.json` as written by `onnxrank export` and read by the engine.

Layout of an exported model directory (``models/NAME/``)::

    manifest.json        this file's schema (ModelSpec.to_dict)
    model.onnx           fp32, dynamic batch and sequence axes          variant "fp32"
    model_opt.onnx       fp32, onnxruntime transformer-optimizer fused   variant "opt"
    model_int8.onnx      int8 for CPU                                    variant "int8"
    model_fp16.onnx      fp16 for CUDA                                   variant "fp16"
    model_ov_int8.xml    OpenVINO IR, NNCF static int8 for CPU           variant "ov_int8"
    model_ov_int8.bin    its weights (VariantSpec.extra_files)
    model_prefix.onnx    decoder rerankers: fp32 prefix graph            prefix_graphs["fp32"]
    model_prefix_ov_int8.xml/.bin  its weight-only int8 IR               prefix_graphs["ov_int8"]
    tokenizer.json       Rust `tokenizers` file, plus the HF config files it came with

Each variant's facts (file, precision, how it runs, extra files) are onnxrank.engine.variants.VARIANTS.

Graph contract: inputs are a subset of ``input_ids``, ``attention_mask``, ``token_type_ids`` (int64,
shape [batch, sequence]). A rerank model's first output is the logits [batch, num_labels]; an
embedding model's first output is the mean-pooled, L2-normalised embedding [batch, dim].
A rerank graph may have its last encoder layer pruned to the [CLS] row (``graph_rewrites``); its
logits are the same up to float rounding.

Manifests written before ``extra_files``, ``graph_rewrites`` and ``prefix_graphs`` existed load with
them empty.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from onnxrank.engine.late_rows import LateInteractionSettings
from onnxrank.engine.recipe import PromptRecipe
from onnxrank.engine.variants import VARIANTS
from onnxrank.errors import ModelLoadError

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT = 1
VARIANT_NAMES = tuple(VARIANTS)
Task = Literal["rerank", "embedding", "late_interaction"]
Activation = Literal["sigmoid", "softmax", "none"]


class ModelKind(Enum):
    """What an exported model is, decided once from its manifest by `model_kind`; each kind is
    one engine class (onnxrank.engine.kinds)."""

    CROSS_ENCODER = "a cross-encoder reranker"
    DECODER_RERANKER = "a decoder reranker"
    EMBEDDER = "an embedding model"
    LATE_INTERACTION = "a late-interaction (ColBERT) model"


# The one table from manifest facts to a kind: (task, whether a prompt recipe is recorded).
_KINDS: dict[tuple[str, bool], ModelKind] = {
    ("rerank", False): ModelKind.CROSS_ENCODER,
    ("rerank", True): ModelKind.DECODER_RERANKER,
    ("embedding", False): ModelKind.EMBEDDER,
    ("late_interaction", False): ModelKind.LATE_INTERACTION,
}


def model_kind(task: str, recipe: PromptRecipe | None) -> ModelKind:
    """The kind of a model of `task`, with or without a prompt recipe.

    Raises:
        ValueError: No kind has this task with (or without) a recipe.
    """
    try:
        return _KINDS[(task, recipe is not None)]
    except KeyError as err:
        raise ValueError(
            f"no model kind is a {task!r} model {'with' if recipe else 'without'} a prompt "
            "recipe; prompt recipes are for decoder rerankers (task 'rerank')"
        ) from err


def kind_task(kind: ModelKind) -> str:
    """The task a model of `kind` is exported as (the inverse of `model_kind`'s table)."""
    return next(task for (task, _), known in _KINDS.items() if known is kind)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class VariantSpec:
    """One model file (ONNX, or OpenVINO IR for ov_int8) and how it was made."""

    file: str
    sha256: str
    size_bytes: int  # on disk, extra_files included
    precision: Literal["fp32", "fp16", "int8"]
    opset: int
    # e.g. {"method": "dynamic", "per_channel": False, "weight_type": "QInt8"}; None when not quantized
    quantization: dict[str, Any] | None = None
    # e.g. {"optimizer": "onnxruntime.transformers", "fusions": {...}}; None for the plain export
    optimization: dict[str, Any] | None = None
    # validation against the PyTorch reference: the tuning part's max_abs_diff, pearson, spearman,
    # top10_overlap, ... at the top level, the held-out part's under "held_out"
    fidelity: dict[str, Any] = field(default_factory=dict)
    # other files the variant needs, name -> sha256 (the .bin of an OpenVINO IR)
    extra_files: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Everything the engine needs to know about an exported model, validated on construction."""

    name: str
    task: Task
    source: dict[str, Any]
    num_labels: int
    max_length: int
    activation: Activation
    relevance_trained: bool
    tokenizer_file: str
    tokenizer_sha256: str
    tokenizer_files: dict[str, str]
    vocab_size: int
    pad_token_id: int
    variants: dict[str, VariantSpec]
    versions: dict[str, str]
    created_at: str
    model_config: dict[str, Any] = field(default_factory=dict)
    # embedding models only: "mean" pooling + L2 normalisation inside the graph
    embedding_dim: int | None = None
    # rewrites applied to the graph before every variant was built, e.g.
    # {"cls_only_last_layer": {"applied": True, ...}}
    graph_rewrites: dict[str, Any] = field(default_factory=dict)
    # decoder rerankers only: the prompt recipe as written (PromptRecipe.to_manifest); None for
    # cross-encoders and embedding models. The engine reads it parsed, as `recipe`.
    prompt: dict[str, Any] | None = None
    # decoder rerankers: the prefix graph of a variant (its name -> the graph's file and its gate
    # against the variant's own graph under ``fidelity``; onnxrank.engine.prefix); empty when
    # none was exported or none passed
    prefix_graphs: dict[str, VariantSpec] = field(default_factory=dict)
    # the model family that exported it (onnxrank.export.families: name, model_type, known, ...)
    family: dict[str, Any] = field(default_factory=dict)
    # variants asked for but left out, name -> {"stage": ..., "reason": ...} (a crash, a missed
    # gate, or not applicable to the family); the variants that passed are kept
    failed_variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    # late-interaction models only: how rows are made and which count (LateInteractionSettings
    # .to_manifest, onnxrank.engine.late_rows); None for every other kind
    late_interaction: dict[str, Any] | None = None
    notes: str = ""
    format_version: int = MANIFEST_FORMAT
    # `prompt` parsed once, here; not a manifest field of its own (to_dict leaves it out)
    recipe: PromptRecipe | None = field(init=False, repr=False, compare=False)
    # `late_interaction` parsed once, here (to_dict leaves it out too)
    late_settings: LateInteractionSettings | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.task not in {task for task, _ in _KINDS}:
            raise ValueError(f"task must be one of {sorted({task for task, _ in _KINDS})}, "
                             f"got {self.task!r}")
        if self.num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {self.num_labels}")
        if self.max_length < 8:
            raise ValueError(f"max_length must be >= 8, got {self.max_length}")
        if self.activation not in ("sigmoid", "softmax", "none"):
            raise ValueError(
                f"activation must be 'sigmoid', 'softmax' or 'none', got {self.activation!r}"
            )
        unknown = set(self.variants) - set(VARIANT_NAMES)
        if unknown:
            raise ValueError(
                f"unknown variant names {sorted(unknown)}; allowed: {', '.join(VARIANT_NAMES)}"
            )
        if set(self.prefix_graphs) - set(self.variants):
            raise ValueError(f"prefix graphs of variants that were not exported: "
                             f"{sorted(set(self.prefix_graphs) - set(self.variants))}")
        if not self.variants:
            raise ValueError(
                f"a model needs at least one variant; allowed: {', '.join(VARIANT_NAMES)}")
        object.__setattr__(self, "recipe", None if self.prompt is None else PromptRecipe.from_dict(
            self.prompt, origin="the manifest's prompt recipe"))
        model_kind(self.task, self.recipe)
        if (self.late_interaction is None) == (self.kind is ModelKind.LATE_INTERACTION):
            raise ValueError("late_interaction settings are required for a late-interaction "
                             f"model and only there; task {self.task!r} has "
                             f"{'none' if self.late_interaction is None else 'some'}")
        object.__setattr__(self, "late_settings", None if self.late_interaction is None
                           else LateInteractionSettings.from_manifest(self.late_interaction))

    @property
    def kind(self) -> ModelKind:
        """What this model is (model_kind of its task and recipe)."""
        return model_kind(self.task, self.recipe)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict, the exact content of manifest.json."""
        data = asdict(self)
        del data["recipe"], data["late_settings"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        """Build a spec from manifest.json content (raises ValueError/TypeError on bad fields)."""
        fields = dict(data)
        fields["variants"] = {
            name: VariantSpec(**variant) for name, variant in data["variants"].items()
        }
        fields["prefix_graphs"] = {
            name: VariantSpec(**graph) for name, graph in data.get("prefix_graphs", {}).items()
        }
        return cls(**fields)

    def manifest_hash(self) -> str:
        """Stable hash of the manifest content: identifies this exact model build (cache keys, indexes)."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def write_manifest(spec: ModelSpec, model_dir: Path) -> Path:
    """Write `spec` as model_dir/manifest.json (indented, sorted keys) and return the path."""
    path = Path(model_dir) / MANIFEST_NAME
    path.write_text(json.dumps(spec.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def load_model_spec(model_dir: str | Path) -> ModelSpec:
    """Read and validate model_dir/manifest.json.

    Raises:
        ModelLoadError: The directory or manifest is missing, unreadable or malformed.
    """
    directory = Path(model_dir)
    path = directory / MANIFEST_NAME
    if not directory.is_dir():
        raise ModelLoadError(f"model directory {directory} does not exist or is not a directory")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise ModelLoadError(
            f"could not find {MANIFEST_NAME} in {directory}; export a model with `onnxrank export`"
        ) from err
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"could not read {path}: {err}") from err
    try:
        return ModelSpec.from_dict(data)
    except (KeyError, TypeError, ValueError) as err:
        raise ModelLoadError(f"malformed manifest {path}: {err}") from err


def verify_files(spec: ModelSpec, model_dir: str | Path, variants: list[str] | None = None, *,
                 prefix_graphs: tuple[str, ...] = ()) -> None:
    """Check the tokenizer files and the given variants (default: all), each with its extra files
    (an OpenVINO IR's .bin), and the prefix graphs of `prefix_graphs` (variant names) against
    their manifest hashes.

    Raises:
        ModelLoadError: A file is missing, unreadable, or its sha256 differs from the manifest.
    """
    directory = Path(model_dir)
    expected = dict(spec.tokenizer_files)
    expected[spec.tokenizer_file] = spec.tokenizer_sha256
    for name in variants if variants is not None else list(spec.variants):
        if name not in spec.variants:
            raise ModelLoadError(
                f"variant {name!r} is not in the manifest of {directory}; "
                f"available: {', '.join(spec.variants)}"
            )
        expected[spec.variants[name].file] = spec.variants[name].sha256
        expected.update(spec.variants[name].extra_files)
    for name in prefix_graphs:
        expected[spec.prefix_graphs[name].file] = spec.prefix_graphs[name].sha256
        expected.update(spec.prefix_graphs[name].extra_files)
    for file_name, digest in expected.items():
        path = directory / file_name
        try:
            actual = sha256_file(path)
        except OSError as err:
            raise ModelLoadError(f"could not read {file_name} in {directory}: {err}") from err
        if actual != digest:
            raise ModelLoadError(
                f"{path} does not match its manifest hash (expected sha256 {digest[:12]}…, "
                f"got {actual[:12]}…); the file was modified or corrupted: re-export the model"
            )
