"""The export pipeline: load -> ONNX fp32 -> fused -> int8 -> fp16 -> validate -> manifest, atomically."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from onnxrank._optional import require
from onnxrank.engine.spec import VARIANT_NAMES, ModelSpec, VariantSpec, sha256_file, write_manifest
from onnxrank.errors import ExportError, FidelityError
from onnxrank.export.onnx import DEFAULT_OPSET, export_onnx
from onnxrank.export.optimize import convert_fp16, optimize_transformer
from onnxrank.export.quantize import (
    DEFAULT_INT8_RECIPES,
    Int8Settings,
    distinct_recipes,
    quantize_int8,
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
    FidelityThresholds,
    ValidationInputs,
    batch_dependence,
    check_thresholds,
    compare,
    encode_validation,
    load_validation_pairs,
    open_session,
    run_batches,
    session_runner,
)

logger = logging.getLogger(__name__)

VARIANT_FILES = {"fp32": "model.onnx", "opt": "model_opt.onnx", "int8": "model_int8.onnx",
                 "fp16": "model_fp16.onnx"}
VARIANT_PRECISION = {"fp32": "fp32", "opt": "fp32", "int8": "int8", "fp16": "fp16"}
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
        variants: Variants to keep (fp32, opt, int8, fp16).
        thresholds: Fidelity thresholds; a variant below them fails the export.
        int8: int8 recipes, tried in order until one meets the thresholds (the manifest records
            every attempt).
        validation_pairs: Validate on about this many pairs (whole query groups); None = all 320.
        registry_path: models/registry.json.
        seed: Seed for stand-in weights and head fitting.
    """

    model: str = DEFAULT_MODEL
    out_dir: Path | None = None
    task: str | None = None
    max_length: int | None = None
    opset: int = DEFAULT_OPSET
    variants: tuple[str, ...] = VARIANT_NAMES
    thresholds: FidelityThresholds = field(default_factory=FidelityThresholds)
    int8: tuple[Int8Settings, ...] = DEFAULT_INT8_RECIPES
    validation_pairs: int | None = None
    registry_path: Path = DEFAULT_REGISTRY
    seed: int = 0

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
        if self.max_length is not None and self.max_length < 8:
            raise ValueError(f"max_length must be >= 8, got {self.max_length}")


@dataclass(frozen=True, slots=True)
class ExportResult:
    """A finished export: where it is and its manifest."""

    model_dir: Path
    spec: ModelSpec


class _Steps:
    """Named export steps, optionally shown as a tqdm bar."""

    def __init__(self, names: Sequence[str], show_progress: bool) -> None:
        self._bar = None
        if show_progress:
            tqdm = require("tqdm", extra="export").tqdm
            self._bar = tqdm(total=len(names), desc="export", unit="step")

    def __call__(self, name: str) -> None:
        logger.info("export step: %s", name)
        if self._bar is not None:
            self._bar.set_postfix_str(name)

    def done(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _versions() -> dict[str, str]:
    import importlib.metadata as metadata

    versions = {}
    for package in ("onnxrank", "torch", "transformers", "onnx", "onnxruntime", "optimum",
                    "optimum-onnx", "sentence-transformers", "tokenizers"):
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
    config = loaded.config
    # RoBERTa-style models reserve padding_idx + 1 positions
    offset = (config.pad_token_id + 1) if config.model_type in ("roberta", "xlm-roberta") else 0
    limit = int(config.max_position_embeddings) - offset
    wanted = request.max_length
    if wanted is None:
        wanted = DEFAULT_MAX_LENGTH
        if task == "embedding" and loaded.reference is not None and loaded.reference.max_seq_length:
            wanted = int(loaded.reference.max_seq_length)
    if wanted > limit:
        raise ValueError(
            f"--max-length {wanted} exceeds the model's {limit} position embeddings; pass "
            f"--max-length {limit} or less"
        )
    return wanted


def _reference_runner(loaded: LoadedModel, task: str) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    torch = require("torch", extra="export")
    if task == "rerank":
        from onnxrank.export.onnx import graph_module

        wrapper = graph_module(loaded.model, "rerank", loaded.input_names)

        def run_rerank(feeds: dict[str, np.ndarray]) -> np.ndarray:
            with torch.inference_mode():
                tensors = [torch.from_numpy(feeds[name]) for name in loaded.input_names]
                return wrapper(*tensors).float().numpy()

        return run_rerank

    def run_embedding(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            features = {name: torch.from_numpy(array) for name, array in feeds.items()}
            embedding = loaded.reference(features)["sentence_embedding"]
            # the graph always normalises; a reference without a Normalize module does not
            return torch.nn.functional.normalize(embedding, p=2.0, dim=1).float().numpy()

    return run_embedding


def _validate_variant(
    name: str, path: Path, inputs: ValidationInputs, reference: np.ndarray,
    int8: Int8Settings | None = None,
) -> dict[str, Any]:
    try:
        session = open_session(path)
        outputs = run_batches(inputs.batches(), session_runner(session), len(inputs.rows))
    except Exception as err:  # onnxruntime raises untyped errors; fp16 often has no CPU kernels
        if name != "fp16":
            raise ExportError(f"onnxruntime could not run {path.name}: {err}") from err
        reason = str(err).strip().splitlines()[0]
        logger.warning("fp16 variant cannot run on CPU (%s); validate it on a GPU", reason)
        return {"validated": False, "validated_on": None,
                "reason": f"CPUExecutionProvider cannot run it ({reason}); fidelity can only be "
                          "checked on a GPU with onnxruntime-gpu"}
    metrics = compare(inputs, reference, outputs)
    metrics.update({"validated": True, "validated_on": "CPUExecutionProvider"})
    if int8 is not None and int8.method == "dynamic":
        metrics.update(batch_dependence(session, inputs))
    return metrics


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
        show_progress: Show a tqdm bar over the export steps.

    Returns:
        The published directory and its manifest.

    Raises:
        ExportError: Loading, exporting or writing failed (message names the cause and the fix).
        FidelityError: A variant missed its validation thresholds.
        MissingDependencyError: The ``export`` (or ``standin``) extra is not installed.
        ValueError: Bad request values.
    """
    source = resolve_source(request.model, task=request.task, registry_path=request.registry_path)
    out_dir = Path(request.out_dir) if request.out_dir is not None else Path("models") / source.name
    steps = ["checkpoint", "load", "export fp32"]
    steps += [f"build {name}" for name in request.variants if name != "fp32"]
    if "int8" in request.variants and "opt" not in request.variants and any(
            recipe.method == "dynamic" for recipe in request.int8):
        steps.append("build int8 (fused source)")
    steps += ["tokenizer", "reference"] + [f"validate {name}" for name in request.variants]
    steps += ["manifest"]
    progress = _Steps(steps, show_progress)
    work_dir = _prepare_work_dir(out_dir)
    try:
        spec = _export_into(request, source, work_dir, out_dir.name, progress, show_progress)
        _publish(work_dir, out_dir)
    except BaseException:
        shutil.rmtree(work_dir, ignore_errors=True)
        raise
    finally:
        progress.close()
    logger.info("exported %s to %s", request.model, out_dir)
    return ExportResult(out_dir, spec)


def _export_into(
    request: ExportRequest, source: ModelSource, work_dir: Path, name: str,
    step: _Steps, show_progress: bool,
) -> ModelSpec:
    task = source.task
    for label, action in _export_steps(request, source, work_dir, name, task, show_progress):
        step(label)
        result = action()
        step.done()
        if isinstance(result, ModelSpec):
            write_manifest(result, work_dir)
            return result
    raise ExportError("internal error: the export produced no manifest")


def _export_steps(
    request: ExportRequest, source: ModelSource, work_dir: Path, name: str, task: str,
    show_progress: bool,
) -> Iterator[tuple[str, Callable[[], Any]]]:
    """The pipeline as (step name, action) pairs, so progress reporting stays in one place."""
    state: dict[str, Any] = {}
    scratch = work_dir / ".scratch"
    scratch.mkdir()
    yield "checkpoint", lambda: state.update(
        checkpoint=_materialize(source, work_dir, request.seed, show_progress))
    yield "load", lambda: state.update(
        loaded=load_checkpoint(str(state["checkpoint"]) if source.kind != "hub" else source.location,
                               kind="local" if source.kind != "hub" else "hub", task=task))
    loaded: LoadedModel = state["loaded"]
    config = loaded.config
    max_length = _resolve_max_length(request, loaded, task)
    # every intermediate goes to scratch; requested variants are moved up at the end
    paths = {variant: scratch / VARIANT_FILES[variant] for variant in VARIANT_NAMES}
    settings: dict[str, dict[str, Any]] = {variant: {} for variant in VARIANT_NAMES}
    yield "export fp32", lambda: export_onnx(loaded.model, paths["fp32"], task=task,
                                             input_names=loaded.input_names, opset=request.opset)
    num_heads, hidden_size = int(config.num_attention_heads), int(config.hidden_size)
    int8_recipes = distinct_recipes(request.int8, layers=int(config.num_hidden_layers))
    wants = set(request.variants)
    dynamic = any(recipe.method == "dynamic" for recipe in int8_recipes)
    if "opt" in wants or ("int8" in wants and dynamic):
        label = "build opt" if "opt" in wants else "build int8 (fused source)"
        yield label, lambda: settings["opt"].update(optimization=optimize_transformer(
            paths["fp32"], paths["opt"], num_heads=num_heads, hidden_size=hidden_size))
    step_inputs: dict[str, ValidationInputs] = {}

    def tokenizer_step() -> None:
        loaded.tokenizer.save_pretrained(str(work_dir))
        loaded.config.save_pretrained(str(work_dir))
        pairs = load_validation_pairs(request.validation_pairs)
        pad_id = int(loaded.tokenizer.pad_token_id or 0)
        step_inputs["inputs"] = encode_validation(
            pairs, work_dir / TOKENIZER_FILE, task=task, max_length=max_length, pad_id=pad_id,
            input_names=loaded.input_names)

    yield "tokenizer", tokenizer_step
    inputs = step_inputs["inputs"]
    calibration = [feeds for _, feeds in inputs.batches()]

    def build_int8(recipe: Int8Settings) -> None:
        opt_source = paths["opt"] if paths["opt"].is_file() else None
        settings["int8"]["quantization"] = quantize_int8(
            fp32_path=paths["fp32"], opt_path=opt_source, out_path=paths["int8"], settings=recipe,
            calibration=calibration if recipe.method == "static" else None)

    if "int8" in wants:
        yield "build int8", lambda: build_int8(int8_recipes[0])
    if "fp16" in wants:
        yield "build fp16", lambda: settings["fp16"].update(optimization=convert_fp16(
            paths["fp32"], paths["fp16"], num_heads=num_heads, hidden_size=hidden_size))
    yield "reference", lambda: state.update(
        reference=run_batches(inputs.batches(), _reference_runner(loaded, task), len(inputs.rows)))
    fidelity: dict[str, dict[str, Any]] = {}

    def validate_int8() -> None:
        attempts = []
        for index, recipe in enumerate(int8_recipes):
            if index:
                build_int8(recipe)
            metrics = _validate_variant("int8", paths["int8"], inputs, state["reference"], recipe)
            fidelity["int8"] = metrics
            try:
                check_thresholds(task, {"int8": metrics}, request.thresholds)
                passed = True
            except FidelityError:
                passed = False
            attempts.append({**settings["int8"]["quantization"], "passed": passed, **{
                key: metrics[key] for key in ("spearman", "top10_overlap", "cosine_min")
                if key in metrics}})
            if passed:
                break
            logger.info("int8 recipe %s missed the thresholds", recipe)
        settings["int8"]["quantization"] = {**settings["int8"]["quantization"], "attempts": attempts}

    def validator(variant: str) -> Callable[[], None]:
        if variant == "int8":
            return validate_int8
        return lambda: fidelity.update(
            {variant: _validate_variant(variant, paths[variant], inputs, state["reference"])})

    for variant in request.variants:
        yield f"validate {variant}", validator(variant)

    def manifest_step() -> ModelSpec:
        check_thresholds(task, fidelity, request.thresholds)
        variants = {}
        for variant in request.variants:
            final = work_dir / VARIANT_FILES[variant]
            os.replace(paths[variant], final)
            variants[variant] = VariantSpec(
                file=final.name, sha256=sha256_file(final), size_bytes=final.stat().st_size,
                precision=VARIANT_PRECISION[variant], opset=request.opset,  # type: ignore[arg-type]
                quantization=settings[variant].get("quantization"),
                optimization=settings[variant].get("optimization"),
                fidelity={**fidelity[variant], "thresholds": {
                    metric: f"{direction} {threshold:g}" for metric, direction, threshold, _
                    in request.thresholds.checks(task, variant)}},
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
        return ModelSpec(
            name=name,
            task=task,  # type: ignore[arg-type]
            source=source_entry,
            num_labels=int(config.num_labels) if task == "rerank" else 1,
            max_length=max_length,
            activation="sigmoid" if task == "rerank" else "none",
            relevance_trained=loaded.relevance_trained,
            tokenizer_file=TOKENIZER_FILE,
            tokenizer_sha256=sha256_file(work_dir / TOKENIZER_FILE),
            tokenizer_files=tokenizer_files,
            vocab_size=int(config.vocab_size),
            pad_token_id=int(loaded.tokenizer.pad_token_id or 0),
            variants=variants,
            versions=_versions(),
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            model_config={key: getattr(config, key, None) for key in (
                "model_type", "architectures", "hidden_size", "num_hidden_layers",
                "num_attention_heads", "intermediate_size", "max_position_embeddings",
                "type_vocab_size")},
            embedding_dim=int(config.hidden_size) if task == "embedding" else None,
            notes=notes.strip(),
        )

    yield "manifest", manifest_step
