"""The export pipeline: load -> ONNX fp32 ([CLS]-pruned) -> fused -> fp16 -> int8 -> OpenVINO int8
-> validate -> manifest, written atomically.

`export_model` runs the steps top to bottom in `_export_into`; each step ticks the progress bar
as it starts.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from onnxrank._optional import require
from onnxrank.engine.runtime import DEFAULT_MODELS_DIR, open_model_file
from onnxrank.engine.spec import VARIANT_NAMES, ModelSpec, VariantSpec, sha256_file, write_manifest
from onnxrank.errors import ExportError, FidelityError, InferenceError, ModelLoadError
from onnxrank.export.families import applicable_variants
from onnxrank.export.onnx import DEFAULT_OPSET
from onnxrank.export.optimize import convert_fp16, optimize_transformer
from onnxrank.export.quantize import (
    DEFAULT_INT8_RECIPES,
    Int8Settings,
    distinct_recipes,
    quantize_int8,
)
from onnxrank.export.quantize_openvino import (
    DEFAULT_OV_INT8_RECIPES,
    OvInt8Settings,
    compress_openvino_int8_weights,
    distinct_ov_recipes,
    quantize_openvino_int8,
    weights_path,
)
from onnxrank.export.source import (
    DEFAULT_MODEL,
    DEFAULT_REGISTRY,
    LoadedModel,
    ModelSource,
    load_checkpoint,
    resolve_source,
)
from onnxrank.export.standin import build_embedder_checkpoint, build_reranker_checkpoint
from onnxrank.export.validate import (
    HELD_OUT,
    FidelityThresholds,
    ValidationInputs,
    batch_dependence,
    check_thresholds,
    compare,
    encode_validation,
    load_calibration_pairs,
    load_validation_pairs,
    run_batches,
    threshold_failures,
)

logger = logging.getLogger(__name__)

VARIANT_FILES = {"fp32": "model.onnx", "opt": "model_opt.onnx", "int8": "model_int8.onnx",
                 "fp16": "model_fp16.onnx", "ov_int8": "model_ov_int8.xml"}
VARIANT_PRECISION = {"fp32": "fp32", "opt": "fp32", "int8": "int8", "fp16": "fp16",
                     "ov_int8": "int8"}
# how validation opens each variant: (backend, precision) as the engine's runtime layer names them
VARIANT_RUNTIME = {"fp32": ("onnxruntime", "fp32"), "opt": ("onnxruntime", "opt"),
                   "int8": ("onnxruntime", "int8"), "fp16": ("onnxruntime", "fp16"),
                   "ov_int8": ("openvino", "int8")}
# OpenVINO bf16 runs model.onnx, so its record lives in the fp32 variant's fidelity under this key
# (onnxrank.engine.runtime reads it)
OPENVINO_BF16_KEY = "openvino_bf16"
# the ov_int8 IR compiled with INFERENCE_PRECISION_HINT=bf16 (the engine's openvino "int8+bf16"),
# recorded in the ov_int8 variant's fidelity under this key
OPENVINO_INT8_BF16_KEY = "openvino_int8_bf16"
OPENVINO_INT8_BF16_PRECISION = "int8+bf16"
# variants that run on a CPU: an export needs at least one of them to pass
CPU_VARIANTS = ("fp32", "opt", "int8", "ov_int8")
TOKENIZER_FILE = "tokenizer.json"
CHECKPOINT_DIR = "checkpoint"
DEFAULT_MAX_LENGTH = 512
STANDIN_NOTES = (
    "Offline stand-in: scores are NOT relevance scores. The encoder was never trained for "
    "reranking; the head is a logistic regression fitted on frozen features (see source.standin.head). "
    "Use it to test and benchmark the machinery, not to judge ranking quality. "
)


@dataclass(frozen=True, slots=True)
class ExportRequest:
    """What to export and how; the CLI builds one from its flags.

    Attributes:
        model: Registry name, Hugging Face Hub id or checkpoint directory.
        out_dir: Target model directory; None = models/<name>.
        task: ``rerank`` or ``embedding``; None = from the registry, else ``rerank``.
        max_length: Token limit per row recorded in the manifest; None = 512 for rerankers, the
            sentence-transformers max_seq_length for embedders; capped by the position embeddings.
        opset: ONNX opset of the export.
        variants: Variants to keep (fp32, opt, int8, fp16, ov_int8).
        thresholds: Fidelity thresholds; a variant below them on the tuning or the held-out
            validation pairs fails the export.
        int8: onnxruntime int8 recipes, tried in order until one meets the thresholds on the
            tuning pairs (the manifest records every attempt).
        ov_int8: OpenVINO int8 recipes, tried the same way.
        cls_only_last_layer: Rerank models: compute the last encoder layer for the [CLS] row only
            (exact up to float rounding; see onnxrank.export.prune). Embedding models are never
            pruned: mean pooling reads every row.
        validation_pairs: Validate on about this many pairs (whole query groups of both parts);
            None = all the shipped pairs.
        registry_path: models/registry.json.
        seed: Seed for stand-in weights and head fitting.
        recipe: Decoder rerankers: a built-in scoring recipe's name or a recipe file (JSON);
            None = the built-in recipe of a known Hub id (onnxrank.export.recipes).
    """

    model: str = DEFAULT_MODEL
    out_dir: Path | None = None
    task: str | None = None
    max_length: int | None = None
    opset: int = DEFAULT_OPSET
    variants: tuple[str, ...] = VARIANT_NAMES
    thresholds: FidelityThresholds = field(default_factory=FidelityThresholds)
    int8: tuple[Int8Settings, ...] = DEFAULT_INT8_RECIPES
    ov_int8: tuple[OvInt8Settings, ...] = DEFAULT_OV_INT8_RECIPES
    cls_only_last_layer: bool = True
    validation_pairs: int | None = None
    registry_path: Path = DEFAULT_REGISTRY
    seed: int = 0
    recipe: str | None = None

    def __post_init__(self) -> None:
        unknown = [name for name in self.variants if name not in VARIANT_NAMES]
        if unknown or not self.variants:
            raise ValueError(
                f"variants must be a non-empty subset of {', '.join(VARIANT_NAMES)}, "
                f"got {', '.join(self.variants) or 'nothing'}"
            )
        if self.task not in (None, "rerank", "embedding"):
            raise ValueError(f"task must be 'rerank' or 'embedding', got {self.task!r}")
        if not self.int8:
            raise ValueError("int8 needs at least one recipe (Int8Settings)")
        if not self.ov_int8:
            raise ValueError("ov_int8 needs at least one recipe (OvInt8Settings)")
        if self.max_length is not None and self.max_length < 8:
            raise ValueError(f"max_length must be >= 8, got {self.max_length}")


@dataclass(frozen=True, slots=True)
class ExportResult:
    """A finished export: where it is and its manifest."""

    model_dir: Path
    spec: ModelSpec


class _Progress:
    """Logs each step as it starts and ticks a tqdm bar (when shown) that names it."""

    def __init__(self, show: bool) -> None:
        self.show = show
        self._bar = None
        if show:
            tqdm = require("tqdm", extra="export").tqdm
            self._bar = tqdm(desc="export", unit="step")

    def step(self, name: str) -> None:
        logger.info("export step: %s", name)
        if self._bar is not None:
            self._bar.set_postfix_str(name, refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _versions() -> dict[str, str]:
    import importlib.metadata as metadata

    versions = {}
    for package in ("onnxrank", "torch", "transformers", "onnx", "onnxruntime",
                    "sentence-transformers", "tokenizers", "openvino", "nncf"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def _prepare_work_dir(out_dir: Path) -> Path:
    """Create a hidden temporary directory beside `out_dir` (same filesystem, so rename is atomic)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"output path {out_dir} exists and is not a directory; choose another --out")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "manifest.json").is_file():
        raise ExportError(
            f"output directory {out_dir} is not empty and holds no manifest.json; refusing to "
            "replace it: choose another --out or empty it"
        )
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    except OSError as err:
        raise ExportError(
            f"cannot write the output directory {out_dir}: {err.strerror or err}; choose a "
            "writable --out"
        ) from err


def _publish(work_dir: Path, out_dir: Path) -> None:
    """Move the finished work directory to `out_dir`, replacing an earlier export."""
    backup = None
    if out_dir.exists():
        backup = out_dir.with_name(f".{out_dir.name}.previous-{os.getpid()}")
        os.replace(out_dir, backup)
    os.replace(work_dir, out_dir)
    if backup is not None:
        shutil.rmtree(backup)


def _resolve_max_length(request: ExportRequest, loaded: LoadedModel, task: str) -> int:
    """The manifest's max_length: --max-length, else the family's real limit (rerank: positions,
    capped by the tokenizer's own limit) or the sentence-transformers max_seq_length (embedding)."""
    limit = loaded.family.max_positions(loaded.config)
    wanted = request.max_length
    if wanted is None:
        wanted = loaded.family.max_length(loaded.config, loaded.tokenizer)
        if task == "embedding":
            wanted = min(wanted, DEFAULT_MAX_LENGTH)
            if loaded.reference is not None and loaded.reference.max_seq_length:
                wanted = int(loaded.reference.max_seq_length)
    if wanted > limit:
        raise ValueError(
            f"--max-length {wanted} exceeds the model's {limit} position embeddings; pass "
            f"--max-length {limit} or less"
        )
    return wanted


def _reference_runner(loaded: LoadedModel, task: str) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """The unpruned PyTorch model as a run(feeds) callable: the reference every variant meets."""
    if task == "rerank":
        return loaded.family.reference_runner(loaded)
    torch = require("torch", extra="export")
    names = loaded.input_names

    def run_embedding(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            features = {name: torch.from_numpy(feeds[name]) for name in names}
            embedding = loaded.reference(features)["sentence_embedding"]
            # the graph always normalises; a reference without a Normalize module does not
            return torch.nn.functional.normalize(embedding, p=2.0, dim=1).float().numpy()

    return run_embedding


def _graph_model(loaded: LoadedModel, task: str, wanted: bool) -> tuple[Any, dict[str, Any]]:
    """The module to export and the manifest's ``graph_rewrites`` entry.

    1. Embedding models: unpruned (mean pooling reads every row).
    2. Rerank models with the rewrite switched off: unpruned.
    3. Rerank models whose head reads only [CLS]: the last layer pruned to that row.
    4. Other rerank models: unpruned, with the reason logged and recorded.
    """
    if task == "embedding":
        return loaded.model, {"cls_only_last_layer": {
            "applied": False, "reason": "embedding model: mean pooling reads every row"}}
    if not wanted:
        return loaded.model, {"cls_only_last_layer": {
            "applied": False, "reason": "switched off (--no-cls-only-last-layer)"}}
    reason = loaded.family.cls_only_support(loaded.model)
    if reason is not None:
        logger.warning("the last layer is not pruned to [CLS]: %s", reason)
        return loaded.model, {"cls_only_last_layer": {"applied": False, "reason": reason}}
    layers = int(loaded.config.num_hidden_layers)
    return loaded.family.cls_only_model(loaded.model), {"cls_only_last_layer": {
        "applied": True,
        "layer": layers,
        "of_layers": layers,
        "computed_for": "the [CLS] row (position 0) only: query projection, attention output, "
                        "feed-forward and LayerNorms; keys and values from every token",
        "method": f"the {loaded.family.name} family's cls_only_model (onnxrank.export.families), "
                  "in PyTorch before torch.onnx.export",
        "checked_by": "every variant's gate against the unpruned PyTorch model "
                      "(fp32: max_abs_diff)",
    }}


def _validate_file(
    variant: str, path: Path, inputs: ValidationInputs, reference: np.ndarray,
) -> tuple[dict[str, Any], Any]:
    """Run one variant's file through the engine's runtime layer and compare it with the reference.

    Returns:
        The fidelity metrics and the runner (None when the CPU cannot run fp16).
    """
    backend, precision = VARIANT_RUNTIME[variant]
    try:
        runner = open_model_file(path, backend=backend, precision=precision)
        outputs = run_batches(inputs.batches(), runner.run, len(inputs.rows))
    except (ModelLoadError, InferenceError) as err:
        if variant != "fp16":
            raise ExportError(f"{backend} could not run {path.name}: {err}") from err
        reason = str(err).strip().splitlines()[0]
        logger.warning("fp16 variant cannot run on CPU (%s); validate it on a GPU", reason)
        return {"validated": False, "validated_on": None,
                "reason": f"CPUExecutionProvider cannot run it ({reason}); fidelity can only be "
                          "checked on a GPU with onnxruntime-gpu"}, None
    metrics = compare(inputs, reference, outputs)
    metrics.update({"validated": True,
                    "validated_on": f"{runner.info.backend} {runner.info.provider}"})
    return metrics, runner


def _tuning_failures(task: str, variant: str, metrics: dict[str, Any],
                     thresholds: FidelityThresholds) -> list[str]:
    """Threshold misses on the tuning pairs only: what a ladder may choose by."""
    tuning = {key: value for key, value in metrics.items() if key != HELD_OUT}
    return threshold_failures(task, variant, tuning, thresholds)


def _attempt(settings: dict[str, Any], metrics: dict[str, Any], passed: bool) -> dict[str, Any]:
    kept = ("spearman", "spearman_per_query_mean", "top10_overlap", "top10_overlap_min",
            "max_abs_diff", "cosine_min")
    return {**settings, "passed_on_tuning": passed, "part": metrics.get("part"),
            **{key: metrics[key] for key in kept if key in metrics}}


def _openvino_bf16(path: Path, inputs: ValidationInputs, reference: np.ndarray, task: str,
                   thresholds: FidelityThresholds, *, precision: str = "bf16",
                   key: str = OPENVINO_BF16_KEY) -> dict[str, Any]:
    """One OpenVINO file compiled with INFERENCE_PRECISION_HINT=bf16 (model.onnx as ``bf16``, the
    int8 IR as ``int8+bf16``), gated like int8 (it is not bit-faithful either)."""
    try:
        runner = open_model_file(path, backend="openvino", precision=precision)
    except (ValueError, ImportError, ModelLoadError) as err:
        return {"validated": False, "passed": False, "reason": str(err)}
    outputs = run_batches(inputs.batches(), runner.run, len(inputs.rows))
    metrics = compare(inputs, reference, outputs)
    failures = threshold_failures(task, key, metrics, thresholds)
    metrics.update({
        "validated": True, "validated_on": f"openvino {runner.info.provider}, "
        "INFERENCE_PRECISION_HINT=bf16", "passed": not failures, "failures": failures,
        "thresholds": _threshold_text(task, key, thresholds)})
    return metrics


def _threshold_text(task: str, variant: str, thresholds: FidelityThresholds) -> dict[str, str]:
    return {metric: f"{direction} {threshold:g}"
            for metric, direction, threshold, _ in thresholds.checks(task, variant)}


def _materialize(source: ModelSource, work_dir: Path, seed: int, show_progress: bool) -> Path:
    if source.kind != "standin":
        return Path(source.location)
    checkpoint = work_dir / CHECKPOINT_DIR
    if source.location == "rerank":
        build_reranker_checkpoint(checkpoint, size="full", seed=seed, show_progress=show_progress)
    else:
        build_embedder_checkpoint(checkpoint, size="full", seed=seed)
    return checkpoint


def _source_entry(source: ModelSource, loaded: LoadedModel, seed: int) -> dict[str, Any]:
    entry = dict(loaded.source)
    if source.kind == "standin":
        entry.pop("path", None)
        entry.update({"kind": "standin", "model_id": source.name, "builder": source.location,
                      "checkpoint_dir": CHECKPOINT_DIR, "seed": seed})
    if source.registry_entry:
        entry["registry_name"] = source.name
    return entry


def export_model(request: ExportRequest, *, show_progress: bool = False) -> ExportResult:
    """Export, validate and publish one model directory (see onnxrank.engine.spec for the layout).

    Everything is written to a hidden directory beside the target and renamed into place at the
    end; on any error that directory is removed and an earlier export at the target is untouched.

    Args:
        request: What to export.
        show_progress: Show a tqdm bar that ticks at each export step.

    Returns:
        The published directory and its manifest.

    Raises:
        ExportError: Loading, exporting or writing failed (message names the cause and the fix).
        FidelityError: A variant missed its validation thresholds on the tuning or held-out pairs.
        MissingDependencyError: The ``export`` (or ``standin``, or for ov_int8 ``openvino``)
            extra is not installed.
        ValueError: Bad request values.
    """
    source = resolve_source(request.model, task=request.task, registry_path=request.registry_path)
    out_dir = Path(request.out_dir) if request.out_dir is not None else Path(DEFAULT_MODELS_DIR) / source.name
    progress = _Progress(show_progress)
    work_dir = _prepare_work_dir(out_dir)
    try:
        spec = _export_into(request, source, work_dir, out_dir.name, progress)
        _publish(work_dir, out_dir)
    except BaseException:
        shutil.rmtree(work_dir, ignore_errors=True)
        raise
    finally:
        progress.close()
    logger.info("exported %s to %s", request.model, out_dir)
    return ExportResult(out_dir, spec)


class _VariantFailed(Exception):
    """A variant's build or gate failed: it is recorded in failed_variants and left out."""

    def __init__(self, stage: str, reason: str, **details: Any) -> None:
        super().__init__(reason)
        self.entry = {"stage": stage, "reason": reason, **details}


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else 'no message'}"


def _export_into(
    request: ExportRequest, source: ModelSource, work_dir: Path, name: str, progress: _Progress,
) -> ModelSpec:
    """Every export step, top to bottom; intermediates go to a scratch directory.

    fp32 is the reference graph: if it cannot be built or misses its gate, the export fails. Every
    other variant is built and validated on its own: a crash or a missed gate is recorded in
    ``failed_variants`` with its reason and the variant is left out, keeping the others.
    """
    task = source.task
    scratch = work_dir / ".scratch"
    scratch.mkdir()
    paths = {variant: scratch / VARIANT_FILES[variant] for variant in VARIANT_NAMES}
    settings: dict[str, dict[str, Any]] = {variant: {} for variant in VARIANT_NAMES}
    fidelity: dict[str, dict[str, Any]] = {}
    failed: dict[str, dict[str, Any]] = {}
    if "ov_int8" in request.variants:  # fail before minutes of work, naming the extra to install
        require("openvino", extra="openvino")
        require("nncf", extra="export")

    progress.step("checkpoint")
    checkpoint = _materialize(source, work_dir, request.seed, progress.show)

    progress.step("load")
    loaded = load_checkpoint(str(checkpoint) if source.kind != "hub" else source.location,
                             kind="local" if source.kind != "hub" else "hub", task=task,
                             recipe=request.recipe)
    config, family = loaded.config, loaded.family
    wanted, not_applicable = applicable_variants(family, config, request.variants)
    for variant, reason in not_applicable.items():
        logger.warning("variant %s left out: %s", variant, reason)
        failed[variant] = {"stage": "not applicable", "reason": reason}
    layers = int(config.num_hidden_layers)
    max_length = _resolve_max_length(request, loaded, task)
    pad_id = int(loaded.tokenizer.pad_token_id or 0)

    progress.step("export fp32")
    graph_model, graph_rewrites = _graph_model(loaded, task, request.cls_only_last_layer)
    try:
        # external data files of a graph over protobuf's 2 GB (they move and hash with fp32)
        graph_files = family.export_graph(family.graph_module(loaded, graph_model, task),
                                          paths["fp32"], task=task,
                                          input_names=loaded.input_names, opset=request.opset)
    except Exception as err:
        raise ExportError(
            f"could not export the fp32 graph of {request.model} ({family.name} family, "
            f"model_type {config.model_type!r}, inputs {', '.join(loaded.input_names)}): "
            f"{_first_line(err)}; this model type needs a family module in "
            "onnxrank.export.families that says how to trace it"
        ) from err
    del graph_model

    progress.step("tokenizer and data")
    loaded.tokenizer.save_pretrained(str(work_dir))
    loaded.config.save_pretrained(str(work_dir))
    prompt = family.prompt(loaded)
    inputs = encode_validation(load_validation_pairs(request.validation_pairs),
                               work_dir / TOKENIZER_FILE, task=task, max_length=max_length,
                               pad_id=pad_id, prompt=prompt)
    calibration = encode_validation(load_calibration_pairs(), work_dir / TOKENIZER_FILE, task=task,
                                    max_length=max_length, pad_id=pad_id, prompt=prompt)
    # the exporter drops an input the graph never reads (DeBERTa-v3's token_type_ids with
    # type_vocab_size 0): what the file declares is what every step feeds
    graph_inputs = _declared_inputs(paths["fp32"])

    def only_graph_inputs(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # every step that feeds a graph feeds what the graph declares (ModernBERT has no
        # token_type_ids even when the pair encoder makes them)
        return {key: feeds[key] for key in graph_inputs}

    progress.step("reference")
    reference = run_batches(inputs.batches(), _reference_runner(loaded, task), len(inputs.rows))
    # the PyTorch weights are not needed past here: a 0.6B decoder's 2.4 GB would otherwise stay
    # resident through every variant's session and the OpenVINO conversion
    loaded = replace(loaded, model=None, reference=None)
    gc.collect()

    progress.step("validate fp32")
    fidelity["fp32"], _ = _validate_file("fp32", paths["fp32"], inputs, reference)
    fp32_failures = threshold_failures(task, "fp32", fidelity["fp32"], request.thresholds)
    if fp32_failures:
        check_thresholds(task, {"fp32": fidelity["fp32"]}, request.thresholds)
    fidelity["fp32"][OPENVINO_BF16_KEY] = _openvino_bf16(paths["fp32"], inputs, reference, task,
                                                         request.thresholds)

    def gate(variant: str) -> None:
        failures = threshold_failures(task, variant, fidelity[variant], request.thresholds)
        if failures:
            raise _VariantFailed("validation", "; ".join(failures), fidelity=fidelity.pop(variant))

    # only the fused optimizer reads attention shapes: an unknown family may have no attention heads
    def attention_shape() -> tuple[int, int]:
        return int(config.num_attention_heads), int(config.hidden_size)

    def build_opt() -> None:
        if paths["opt"].is_file():
            return
        progress.step("build opt")
        num_heads, hidden_size = attention_shape()
        settings["opt"]["optimization"] = optimize_transformer(
            paths["fp32"], paths["opt"], num_heads=num_heads, hidden_size=hidden_size,
            model_type=family.ort_model_type or "bert")

    def variant_opt() -> None:
        build_opt()
        progress.step("validate opt")
        fidelity["opt"], _ = _validate_file("opt", paths["opt"], inputs, reference)
        gate("opt")

    def variant_fp16() -> None:
        progress.step("build fp16")
        num_heads, hidden_size = attention_shape()
        settings["fp16"]["optimization"] = convert_fp16(
            paths["fp32"], paths["fp16"], num_heads=num_heads, hidden_size=hidden_size,
            model_type=family.ort_model_type)
        progress.step("validate fp16")
        fidelity["fp16"], _ = _validate_file("fp16", paths["fp16"], inputs, reference)
        gate("fp16")

    def variant_int8() -> None:
        int8_recipes = family.int8_recipes(distinct_recipes(request.int8, layers=layers))
        if any(r.method == "dynamic" for r in int8_recipes) and family.ort_model_type is not None:
            build_opt()  # the dynamic recipes quantize the fused graph when there is one
        calibration_batches = [only_graph_inputs(feeds) for feeds in calibration.padded_batches()]
        attempts = []
        for index, recipe in enumerate(int8_recipes):
            progress.step(f"int8 recipe {index + 1} of {len(int8_recipes)}")
            quantization = quantize_int8(
                fp32_path=paths["fp32"], opt_path=paths["opt"] if paths["opt"].is_file() else None,
                out_path=paths["int8"], settings=recipe,
                calibration=calibration_batches if recipe.method == "static" else None)
            if not quantization["quantized_nodes"]:
                # the recipe's op types are not in this graph (a fused Attention in a family
                # the optimizer does not fuse): the file is fp32 and must not pass as int8
                attempts.append({**quantization, "passed_on_tuning": False,
                                 "skipped": "no operator of this graph was quantized"})
                continue
            metrics, runner = _validate_file("int8", paths["int8"], inputs, reference)
            passed = not _tuning_failures(task, "int8", metrics, request.thresholds)
            attempts.append(_attempt(quantization, metrics, passed))
            if passed:
                break
            logger.info("int8 recipe %s missed the thresholds on the tuning pairs", recipe)
        if "skipped" in attempts[-1]:
            raise _VariantFailed("quantization", "the last int8 recipe quantized no operator of "
                                 "this graph and every earlier one missed the thresholds on the "
                                 "tuning pairs", attempts=attempts)
        if recipe.method == "dynamic":
            metrics.update(batch_dependence(runner.run, inputs))
        fidelity["int8"] = metrics
        settings["int8"]["quantization"] = {**quantization, "attempts": attempts}
        gate("int8")

    def variant_ov_int8() -> None:
        if family.ov_int8_mode == "weight_only":  # no activation scales: no calibration, no ladder
            progress.step("ov_int8 weight-only")
            settings["ov_int8"]["quantization"] = compress_openvino_int8_weights(
                paths["fp32"], paths["ov_int8"])
            fidelity["ov_int8"], _ = _validate_file("ov_int8", paths["ov_int8"], inputs, reference)
            gate("ov_int8")
            return
        items = [only_graph_inputs(feeds) for feeds in calibration.single_rows()]
        ov_recipes = distinct_ov_recipes(request.ov_int8, task=task, layers=layers)
        attempts = []
        for index, ov_recipe in enumerate(ov_recipes):
            progress.step(f"ov_int8 recipe {index + 1} of {len(ov_recipes)}")
            quantization = quantize_openvino_int8(
                fp32_path=paths["fp32"], out_path=paths["ov_int8"], settings=ov_recipe,
                calibration=items, layers=layers)
            metrics, runner = _validate_file("ov_int8", paths["ov_int8"], inputs, reference)
            passed = not _tuning_failures(task, "ov_int8", metrics, request.thresholds)
            attempts.append(_attempt(quantization, metrics, passed))
            if passed:
                break
            logger.info("ov_int8 recipe %s missed the thresholds on the tuning pairs", ov_recipe)
        # static scales: a row's score should not depend on its batch mates; measured, not assumed
        metrics.update(batch_dependence(runner.run, inputs))
        fidelity["ov_int8"] = metrics
        settings["ov_int8"]["quantization"] = {**quantization, "attempts": attempts}
        gate("ov_int8")
        progress.step("validate ov_int8 with bf16")
        from onnxrank.engine.backends.openvino import cpu_capabilities

        capabilities = cpu_capabilities()
        metrics[OPENVINO_INT8_BF16_KEY] = _openvino_bf16(
            paths["ov_int8"], inputs, reference, task, request.thresholds,
            precision=OPENVINO_INT8_BF16_PRECISION, key=OPENVINO_INT8_BF16_KEY,
        ) if "BF16" in capabilities else {
            "validated": False, "passed": False,
            "reason": "the CPU reports no BF16 (OpenVINO's CPU capabilities: "
                      f"{', '.join(capabilities)}); validate on a CPU with AVX-512 BF16 or AMX"}

    steps: dict[str, Callable[[], None]] = {
        "opt": variant_opt, "fp16": variant_fp16, "int8": variant_int8, "ov_int8": variant_ov_int8}
    for variant in ("opt", "fp16", "int8", "ov_int8"):
        if variant not in wanted:
            continue
        try:
            steps[variant]()
        except _VariantFailed as failure:
            failed[variant] = {**failure.entry, **_recorded_attempts(settings[variant])}
        except (ImportError, KeyboardInterrupt):
            raise
        except Exception as err:  # one variant's crash (NNCF, OpenVINO, onnxruntime) loses only it
            logger.debug("variant %s crashed", variant, exc_info=True)
            failed[variant] = {"stage": "build", "reason": _first_line(err),
                               **_recorded_attempts(settings[variant])}
        if variant in failed:
            fidelity.pop(variant, None)
            logger.warning("variant %s left out: %s", variant, failed[variant]["reason"])

    progress.step("manifest")
    kept_names = [variant for variant in request.variants if variant in fidelity]
    if not any(variant in CPU_VARIANTS for variant in kept_names) and (
            set(request.variants) & set(CPU_VARIANTS)):
        raise FidelityError(
            "no CPU variant passed validation: "
            + "; ".join(f"{variant}: {entry['reason']}" for variant, entry in failed.items())
            + ". Nothing was written")
    variants = {}
    for variant in kept_names:
        final = work_dir / VARIANT_FILES[variant]
        os.replace(paths[variant], final)
        extra_files, size = {}, final.stat().st_size
        for data_name in graph_files if variant == "fp32" else ():
            os.replace(scratch / data_name, work_dir / data_name)
            extra_files[data_name] = sha256_file(work_dir / data_name)
            size += (work_dir / data_name).stat().st_size
        if variant == "ov_int8":
            weights = weights_path(final)
            os.replace(weights_path(paths[variant]), weights)
            extra_files[weights.name] = sha256_file(weights)
            size += weights.stat().st_size
        variants[variant] = VariantSpec(
            file=final.name, sha256=sha256_file(final), size_bytes=size,
            precision=VARIANT_PRECISION[variant], opset=request.opset,  # type: ignore[arg-type]
            quantization=settings[variant].get("quantization"),
            optimization=settings[variant].get("optimization"),
            fidelity={**fidelity[variant],
                      "thresholds": _threshold_text(task, variant, request.thresholds)},
            extra_files=extra_files,
        )
    shutil.rmtree(scratch)
    tokenizer_files = {
        path.name: sha256_file(path) for path in sorted(work_dir.iterdir())
        if path.is_file() and path.suffix in (".json", ".txt", ".model")
        and path.name != TOKENIZER_FILE and not path.name.endswith(".onnx")
    }
    source_entry = _source_entry(source, loaded, request.seed)
    notes = STANDIN_NOTES if "standin" in source_entry and task == "rerank" else ""
    if task == "embedding":
        notes += ("Embedding model: the graph outputs mean-pooled, L2-normalised embeddings "
                  "(output 'embeddings'); num_labels is unused.")
    spec = ModelSpec(
        name=name,
        task=task,  # type: ignore[arg-type]
        source=source_entry,
        # a decoder's graph has one output (yes - no) whatever its config's num_labels says
        num_labels=int(config.num_labels) if task == "rerank" and prompt is None else 1,
        max_length=max_length,
        activation="sigmoid" if task == "rerank" else "none",
        relevance_trained=loaded.relevance_trained,
        tokenizer_file=TOKENIZER_FILE,
        tokenizer_sha256=sha256_file(work_dir / TOKENIZER_FILE),
        tokenizer_files=tokenizer_files,
        vocab_size=int(config.vocab_size),
        pad_token_id=pad_id,
        variants=variants,
        versions=_versions(),
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        model_config={key: getattr(config, key, None) for key in (
            "model_type", "architectures", "hidden_size", "num_hidden_layers",
            "num_attention_heads", "intermediate_size", "max_position_embeddings",
            "type_vocab_size")},
        embedding_dim=int(config.hidden_size) if task == "embedding" else None,
        graph_rewrites=graph_rewrites,
        prompt=prompt,
        family=family.describe(config),
        failed_variants=failed,
        notes=notes.strip(),
    )
    write_manifest(spec, work_dir)
    return spec


def _declared_inputs(path: Path) -> tuple[str, ...]:
    """The input names an ONNX file declares (weights in external files are not read)."""
    onnx = require("onnx", extra="export")
    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {tensor.name for tensor in graph.initializer}
    return tuple(node.name for node in graph.input if node.name not in initializers)


def _recorded_attempts(settings: dict[str, Any]) -> dict[str, Any]:
    """The ladder attempts a failed variant made, for its failed_variants entry."""
    quantization = settings.get("quantization") or {}
    return {"attempts": quantization["attempts"]} if "attempts" in quantization else {}
