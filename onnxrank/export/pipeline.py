"""The export pipeline, as its stages: resolve -> load -> trace fp32 -> reference -> gate fp32 ->
for each variant: build + gate -> manifest, written atomically.

`export_model` resolves the source and publishes the finished directory; `_export_into` runs the
stages top to bottom. Each variant's build step and gate are onnxrank.export.variants.VARIANT_STEPS;
its facts (file, precision, how it runs) onnxrank.engine.variants.VARIANTS. The weight-compressed
route (onnxrank.export.direct_openvino) runs the same stages with one change: its trace stage
converts the checkpoint, in its own dtype, straight to the ov_int8 IR, which is then gated like a
built variant; there is no fp32 file.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from onnxrank._optional import require
from onnxrank.engine.runtime import DEFAULT_MODELS_DIR
from onnxrank.engine.spec import VARIANT_NAMES, ModelSpec, VariantSpec, sha256_file, write_manifest
from onnxrank.engine.variants import VARIANTS
from onnxrank.errors import ExportError, FidelityError
from onnxrank.export import late_interaction
from onnxrank.export.colbert_checkpoint import TASK as LATE_INTERACTION_TASK
from onnxrank.export.context import (
    SCRATCH_DIR,
    TOKENIZER_FILE,
    BuiltVariant,
    ExportContext,
    Progress,
    VariantFailed,
    first_line,
    package_versions,
)
from onnxrank.export.direct_openvino import DIRECT_VARIANT, convert_compressed, takes_direct_route
from onnxrank.export.families import Family, applicable_variants
from onnxrank.export.gate import gate_prefix_graph, threshold_text, validate_file
from onnxrank.export.loaded import LoadedModel
from onnxrank.export.onnx import exporter_opset
from onnxrank.export.request import ExportRequest
from onnxrank.export.source import ModelSource, load_checkpoint, resolve_source
from onnxrank.export.standin import build_embedder_checkpoint, build_reranker_checkpoint
from onnxrank.export.tasks import ExportTask, export_task
from onnxrank.export.validate import (
    ValidationInputs,
    check_thresholds,
    encode_validation,
    load_calibration_pairs,
    load_validation_pairs,
    run_batches,
    threshold_failures,
)
from onnxrank.export.variants import (
    VARIANT_STEPS,
    VariantStep,
    converted_step,
    record_bf16_runs,
)

logger = logging.getLogger(__name__)

# Tasks whose checkpoints export through stages of their own rather than the ExportTask stages
# below: request, source, work directory, model name, progress -> the manifest written there.
# Its keys are onnxrank.export.request.ROUTED_TASKS.
ExportRoute = Callable[[ExportRequest, ModelSource, Path, str, Progress], ModelSpec]
EXPORT_ROUTES: dict[str, ExportRoute] = {LATE_INTERACTION_TASK: late_interaction.export_into}

CHECKPOINT_DIR = "checkpoint"
# the config fields the manifest's model_config copies
MODEL_CONFIG_KEYS = ("model_type", "architectures", "hidden_size", "num_hidden_layers",
                     "num_attention_heads", "intermediate_size", "max_position_embeddings",
                     "type_vocab_size")


@dataclass(frozen=True, slots=True)
class ExportResult:
    """A finished export: where it is and its manifest."""

    model_dir: Path
    spec: ModelSpec


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
    # a task with stages of its own (EXPORT_ROUTES), else the one place the task's name is read
    route = EXPORT_ROUTES.get(source.task) or _task_route(export_task(source.task))
    request = replace(request, opset=exporter_opset(request.exporter, request.opset))
    out_dir = Path(request.out_dir) if request.out_dir is not None else Path(DEFAULT_MODELS_DIR) / source.name
    progress = Progress(show_progress)
    work_dir = _prepare_work_dir(out_dir)
    try:
        with _no_loading_bars():
            spec = route(request, source, work_dir, out_dir.name, progress)
        _publish(work_dir, out_dir)
    except BaseException:
        shutil.rmtree(work_dir, ignore_errors=True)
        raise
    finally:
        progress.close()
    logger.info("exported %s to %s", request.model, out_dir)
    return ExportResult(out_dir, spec)


def _task_route(task: ExportTask) -> ExportRoute:
    """The stages of `_export_into` for `task`, as a route."""

    def export(request: ExportRequest, source: ModelSource, work_dir: Path, name: str,
               progress: Progress) -> ModelSpec:
        return _export_into(request, source, task, work_dir, name, progress)

    return export


@contextlib.contextmanager
def _no_loading_bars() -> Iterator[None]:
    """transformers 5 draws a 'Loading weights' bar on stderr for every checkpoint it loads (the
    model, the reference, the stand-in's parts); the export's own progress names its stages, so
    those bars are off for its duration and restored after."""
    transformers_logging = require("transformers.utils.logging", extra="export")
    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            transformers_logging.enable_progress_bar()


@dataclass(frozen=True, slots=True)
class _Traced:
    """The trace stage's results: the model's loaded checkpoint and family, the graph it wrote
    (`variant`'s file: fp32's, or the weight-compressed route's ov_int8) and the variant steps
    that follow it."""

    loaded: LoadedModel
    family: Family
    max_length: int
    graph_files: tuple[str, ...]  # external data files beside the traced file
    graph_rewrites: dict[str, Any]
    # the family's prefix graph (decoders): its extra files, or its failed_variants entry when
    # it could not be exported; None for families without one
    prefix_graph: tuple[str, ...] | dict[str, Any] | None = None
    variant: str = "fp32"
    steps: dict[str, VariantStep] = field(default_factory=lambda: dict(VARIANT_STEPS))
    # what wrote the traced file: a torch exporter, or OpenVINO's converter on the direct route
    exporter: str = "torchscript"


def _export_into(
    request: ExportRequest, source: ModelSource, task: ExportTask, work_dir: Path, name: str,
    progress: Progress,
) -> ModelSpec:
    """Every export stage, top to bottom; intermediates go to a scratch directory.

    fp32 is the reference graph: if it cannot be built or misses its gate, the export fails. Every
    other variant is built and gated on its own: a crash or a missed gate is recorded in
    ``failed_variants`` with its stage and reason and the variant is left out, keeping the others.
    On the weight-compressed route the converted IR is the one variant, so its miss fails too.
    """
    if "ov_int8" in request.variants:  # fail before minutes of work, naming the extra to install
        require("openvino", extra="openvino")
        require("nncf", extra="export")
    scratch = work_dir / SCRATCH_DIR
    scratch.mkdir()
    progress.step("checkpoint")
    checkpoint = _materialize(source, work_dir, request.seed, progress.show)
    progress.step("load")
    loaded, family = load_checkpoint(str(checkpoint) if source.kind != "hub" else source.location,
                                     kind="local" if source.kind != "hub" else "hub",
                                     task=task, recipe=request.recipe, variants=request.variants)
    wanted, failed = _applicable_variants(request, loaded, family)
    if takes_direct_route(family, request.variants):
        progress.step(f"convert to {DIRECT_VARIANT}")
        traced = _convert_direct(request, loaded, family, task, scratch)
    else:
        progress.step("export fp32")
        traced = _trace_fp32(request, loaded, family, task, scratch)
    progress.step("tokenizer and data")
    prompt = family.prompt(loaded)
    inputs, calibration = _encode_data(request, traced, work_dir, task, prompt)
    progress.step("reference")
    reference = run_batches(inputs.batches(), task.reference_runner(loaded, family),
                            len(inputs.rows))
    # the PyTorch weights are not needed past here: a 0.6B decoder's 2.4 GB would otherwise stay
    # resident through every variant's session and the OpenVINO conversion
    traced = replace(traced, loaded=replace(loaded, model=None, reference=None))
    del loaded
    gc.collect()
    context = ExportContext(
        task=task, family=family, config=traced.loaded.config,
        input_names=traced.loaded.input_names,
        paths={variant: scratch / VARIANTS[variant].file for variant in VARIANT_NAMES},
        inputs=inputs, calibration=calibration, reference=reference,
        thresholds=request.thresholds, int8=request.int8, ov_int8=request.ov_int8,
        progress=progress)
    built = {}
    if traced.variant == "fp32":  # the reference graph: a miss fails the export
        progress.step("validate fp32")
        built["fp32"] = _gate_fp32(context)
    for variant, step in traced.steps.items():
        if variant in wanted:
            outcome = _build_variant(context, variant, step)
            if isinstance(outcome, BuiltVariant):
                built[variant] = outcome
            else:
                failed[variant] = outcome
                logger.warning("variant %s left out: %s", variant, outcome["reason"])
    gated_prefixes = _gate_prefix_graphs(context, traced, built, failed)
    progress.step("manifest")
    prefix_graphs = _publish_prefix_graphs(request, gated_prefixes, work_dir)
    variants = _publish_variants(request, context, built, failed, traced, work_dir)
    spec = _model_spec(request, source, task, traced, name=name, variants=variants, failed=failed,
                       prompt=prompt, work_dir=work_dir, prefix_graphs=prefix_graphs)
    write_manifest(spec, work_dir)
    return spec


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


def _materialize(source: ModelSource, work_dir: Path, seed: int, show_progress: bool) -> Path:
    if source.kind != "standin":
        return Path(source.location)
    checkpoint = work_dir / CHECKPOINT_DIR
    if source.location == "rerank":
        build_reranker_checkpoint(checkpoint, size="full", seed=seed, show_progress=show_progress)
    else:
        build_embedder_checkpoint(checkpoint, size="full", seed=seed)
    return checkpoint


def _applicable_variants(request: ExportRequest, loaded: LoadedModel, family: Family) -> tuple[
        tuple[str, ...], dict[str, dict[str, Any]]]:
    """The wanted variants the family builds, and failed_variants entries for the others."""
    wanted, not_applicable = applicable_variants(family, loaded.config, request.variants)
    failed = {}
    for variant, reason in not_applicable.items():
        logger.warning("variant %s left out: %s", variant, reason)
        failed[variant] = {"stage": "not applicable", "reason": reason}
    return wanted, failed


def _trace_fp32(request: ExportRequest, loaded: LoadedModel, family: Family, task: ExportTask,
                scratch: Path) -> _Traced:
    """Trace the (possibly [CLS]-pruned) PyTorch model to the scratch model.onnx."""
    max_length = _resolve_max_length(request, loaded, family, task)
    exporter = request.exporter or family.exporters[0]
    if exporter not in family.exporters:
        raise ExportError(f"the {family.name} family's graphs export with "
                          f"{', '.join(family.exporters)} only, not {exporter}: drop --exporter")
    graph_model, graph_rewrites = _graph_model(loaded, family, task, request.cls_only_last_layer)
    try:
        # external data files of a graph over protobuf's 2 GB (they move and hash with fp32)
        graph_files = family.export_graph(family.graph_module(loaded, graph_model, task),
                                          scratch / VARIANTS["fp32"].file, task=task,
                                          input_names=loaded.input_names, opset=request.opset,
                                          exporter=exporter)
    except Exception as err:
        raise ExportError(
            f"could not export the fp32 graph of {request.model} ({family.name} family, "
            f"model_type {loaded.config.model_type!r}, inputs {', '.join(loaded.input_names)}, "
            f"{exporter} exporter): "
            f"{first_line(err)}; this model type needs a family module in "
            "onnxrank.export.families that says how to trace it"
        ) from err
    prefix_graph: tuple[str, ...] | dict[str, Any] | None = None
    prefix_file = VARIANTS["fp32"].prefix_file
    try:
        if prefix_file is not None:
            prefix_graph = family.export_prefix_graph(loaded, graph_model, scratch / prefix_file,
                                                      opset=request.opset)
    except Exception as err:  # the whole-row graph still serves: record and go on
        logger.debug("the prefix graph could not be exported", exc_info=True)
        prefix_graph = {"stage": "build", "reason": first_line(err)}
    return _Traced(loaded, family, max_length, tuple(graph_files), graph_rewrites, prefix_graph,
                   exporter=exporter)


def _convert_direct(request: ExportRequest, loaded: LoadedModel, family: Family,
                    task: ExportTask, scratch: Path) -> _Traced:
    """The weight-compressed route's trace stage: the ov_int8 IR and its prefix graph's,
    converted from the checkpoint as loaded (onnxrank.export.direct_openvino)."""
    max_length = _resolve_max_length(request, loaded, family, task)
    _, graph_rewrites = _graph_model(loaded, family, task, request.cls_only_last_layer)
    facts = VARIANTS[DIRECT_VARIANT]
    try:
        converted = convert_compressed(
            loaded, family, scratch / facts.file,
            scratch / facts.prefix_file if facts.prefix_file is not None else None)
    except Exception as err:
        raise ExportError(
            f"could not convert {request.model} ({family.name} family, model_type "
            f"{loaded.config.model_type!r}) to OpenVINO: {first_line(err)}; export its fp32 "
            "graph instead (--variants fp32,ov_int8) on a machine with the memory for it"
        ) from err
    return _Traced(loaded, family, max_length, (), graph_rewrites, converted.prefix_graph,
                   variant=DIRECT_VARIANT,
                   steps={DIRECT_VARIANT: converted_step(DIRECT_VARIANT, converted.quantization)},
                   exporter="openvino.convert_model")


def _resolve_max_length(request: ExportRequest, loaded: LoadedModel, family: Family,
                        task: ExportTask) -> int:
    """The manifest's max_length: --max-length, else the task's rule over the family's real limit
    (positions, capped by the tokenizer's own limit; ExportTask.max_length)."""
    limit = family.max_positions(loaded.config)
    wanted = request.max_length
    if wanted is None:
        wanted = task.max_length(family.max_length(loaded.config, loaded.tokenizer), loaded)
    if wanted > limit:
        raise ValueError(
            f"--max-length {wanted} exceeds the model's {limit} position embeddings; pass "
            f"--max-length {limit} or less"
        )
    return wanted


def _graph_model(loaded: LoadedModel, family: Family, task: ExportTask,
                 wanted: bool) -> tuple[Any, dict[str, Any]]:
    """The module to export and the manifest's ``graph_rewrites`` entry.

    1. A task whose output reads every row (embedding: mean pooling): unpruned.
    2. The rewrite switched off: unpruned.
    3. A head that reads only [CLS]: the last layer pruned to that row.
    4. Other heads: unpruned, with the reason logged and recorded.
    """
    if task.cls_only_blocker is not None:
        return loaded.model, {"cls_only_last_layer": {
            "applied": False, "reason": task.cls_only_blocker}}
    if not wanted:
        return loaded.model, {"cls_only_last_layer": {
            "applied": False, "reason": "switched off (--no-cls-only-last-layer)"}}
    reason = family.cls_only_support(loaded.model)
    if reason is not None:
        logger.warning("the last layer is not pruned to [CLS]: %s", reason)
        return loaded.model, {"cls_only_last_layer": {"applied": False, "reason": reason}}
    layers = int(loaded.config.num_hidden_layers)
    return family.cls_only_model(loaded.model), {"cls_only_last_layer": {
        "applied": True,
        "layer": layers,
        "of_layers": layers,
        "computed_for": "the [CLS] row (position 0) only: query projection, attention output, "
                        "feed-forward and LayerNorms; keys and values from every token",
        "method": f"the {family.name} family's cls_only_model (onnxrank.export.families), "
                  "in PyTorch before torch.onnx.export",
        "checked_by": "every variant's gate against the unpruned PyTorch model "
                      "(fp32: max_abs_diff)",
    }}


def _encode_data(request: ExportRequest, traced: _Traced, work_dir: Path, task: ExportTask,
                 prompt: dict[str, Any] | None) -> tuple[ValidationInputs, ValidationInputs]:
    """Save the tokenizer and config beside the graph; encode the validation and calibration
    pairs with the saved tokenizer, as the engine will."""
    loaded = traced.loaded
    loaded.tokenizer.save_pretrained(str(work_dir))
    loaded.config.save_pretrained(str(work_dir))
    pad_id = int(loaded.tokenizer.pad_token_id or 0)
    validation, calibration = (
        encode_validation(pairs, work_dir / TOKENIZER_FILE, task=task,
                          max_length=traced.max_length, pad_id=pad_id, prompt=prompt)
        for pairs in (load_validation_pairs(request.validation_pairs),
                      load_calibration_pairs(request.calibration_pairs)))
    return validation, calibration


def _gate_fp32(context: ExportContext) -> BuiltVariant:
    """fp32 against the reference: a miss fails the whole export. Adds OpenVINO bf16's record
    (it runs model.onnx)."""
    fidelity, outputs = validate_file(context, "fp32")
    if threshold_failures(context.task, "fp32", fidelity, context.thresholds):
        check_thresholds(context.task, {"fp32": fidelity}, context.thresholds)
    built = BuiltVariant(fidelity, outputs=outputs)
    record_bf16_runs(context, "fp32", built)
    return built


@dataclass(frozen=True, slots=True)
class _GatedPrefix:
    """A prefix graph that passed its gate: its gate record and the files beside it."""

    record: dict[str, Any]
    extra_files: tuple[str, ...]


def _gate_prefix_graphs(context: ExportContext, traced: _Traced, built: dict[str, BuiltVariant],
                        failed: dict[str, dict[str, Any]]) -> dict[str, _GatedPrefix]:
    """Each built variant's prefix graph (its facts' ``prefix_file``), gated against the
    variant's whole-row graph: fp32's is the traced file, another variant's is made from it by
    its step's ``prefix_graph``. Returns those that passed; a failure (build or gate) is added
    to `failed` as ``prefix_graph:<variant>``, and the whole-row graphs stay."""
    traced_file = VARIANTS[traced.variant].prefix_file
    if traced.prefix_graph is None or traced_file is None:
        return {}
    if isinstance(traced.prefix_graph, dict):
        failed[f"prefix_graph:{traced.variant}"] = traced.prefix_graph
        return {}
    scratch = context.paths["fp32"].parent
    traced_files = traced.prefix_graph

    def traced_graph(context: ExportContext, source: Path, out: Path) -> tuple[str, ...]:
        return traced_files

    makers = {traced.variant: traced_graph, **{variant: step.prefix_graph
                                               for variant, step in traced.steps.items()
                                               if step.prefix_graph is not None}}
    source = scratch / traced_file
    gated = {}
    for variant, make in makers.items():
        prefix_file = VARIANTS[variant].prefix_file
        if variant not in built or prefix_file is None:
            continue
        path = scratch / prefix_file
        try:
            extra_files = make(context, source, path)
            if extra_files is None:  # this export's variant has no prefix graph
                continue
            context.progress.step(f"validate {variant} prefix graph")
            record = gate_prefix_graph(context, variant, path, built[variant])
        except (ImportError, KeyboardInterrupt):
            raise
        except Exception as err:
            logger.debug("the %s prefix graph failed", variant, exc_info=True)
            failed[f"prefix_graph:{variant}"] = {"stage": "build", "reason": first_line(err)}
            continue
        if not record["passed"]:
            failed[f"prefix_graph:{variant}"] = {
                "stage": "validation", "fidelity": record,
                "reason": f"missed its gate ({record['gate']}): max_abs_diff "
                          f"{record['max_abs_diff']:.3g} against {VARIANTS[variant].file}; "
                          + "; ".join(record.get("failures", []))}
            continue
        gated[variant] = _GatedPrefix(record, extra_files)
    return gated


def _publish_prefix_graphs(request: ExportRequest, gated: dict[str, _GatedPrefix],
                           work_dir: Path) -> dict[str, VariantSpec]:
    """Move the passing prefix graphs of the kept variants out of scratch (with their extra
    files: fp32's external data, the IR's .bin); their manifest entries, keyed by variant."""
    specs = {}
    for variant, graph in gated.items():
        file_name = VARIANTS[variant].prefix_file
        if variant not in request.variants or file_name is None:
            continue
        names = (file_name, *graph.extra_files)
        for name in names:
            os.replace(work_dir / SCRATCH_DIR / name, work_dir / name)
        specs[variant] = VariantSpec(
            file=file_name, sha256=sha256_file(work_dir / file_name),
            size_bytes=sum((work_dir / name).stat().st_size for name in names),
            precision=VARIANTS[variant].precision, opset=request.opset, fidelity=graph.record,
            extra_files={name: sha256_file(work_dir / name) for name in graph.extra_files})
    return specs


def _build_variant(context: ExportContext, variant: str,
                   step: VariantStep) -> BuiltVariant | dict[str, Any]:
    """Build and gate one variant: the BuiltVariant, or its failed_variants entry.

    One variant's crash (NNCF, OpenVINO, onnxruntime) or missed gate loses only it.
    """
    built = None
    try:
        built = step.build(context)
        step.gate(context, variant, built)
        if step.after_gate is not None:
            step.after_gate(context, variant, built)
    except VariantFailed as failure:
        return failure.entry
    except (ImportError, KeyboardInterrupt):
        raise
    except Exception as err:
        logger.debug("variant %s crashed", variant, exc_info=True)
        return {"stage": "build", "reason": first_line(err),
                **(built.attempts() if built is not None else {})}
    return built


def _publish_variants(request: ExportRequest, context: ExportContext,
                      built: dict[str, BuiltVariant], failed: dict[str, dict[str, Any]],
                      traced: _Traced, work_dir: Path) -> dict[str, VariantSpec]:
    """Move the kept variants' files (and their extra files) out of scratch; their manifest entries.

    Raises:
        FidelityError: CPU variants were asked for and none passed.
    """
    kept = [variant for variant in request.variants if variant in built]
    if not any(VARIANTS[variant].cpu for variant in kept) and any(
            VARIANTS[variant].cpu for variant in request.variants):
        raise FidelityError(
            "no CPU variant passed validation: "
            + "; ".join(f"{variant}: {entry['reason']}" for variant, entry in failed.items())
            + ". Nothing was written")
    scratch = work_dir / SCRATCH_DIR
    specs = {}
    for variant in kept:
        facts = VARIANTS[variant]
        made = built[variant]
        extra_names = (*facts.extra_files, *made.extra_files,
                       *(traced.graph_files if variant == traced.variant else ()))
        for file_name in (facts.file, *extra_names):
            os.replace(scratch / file_name, work_dir / file_name)
        specs[variant] = VariantSpec(
            file=facts.file, sha256=sha256_file(work_dir / facts.file),
            size_bytes=sum((work_dir / file_name).stat().st_size
                           for file_name in (facts.file, *extra_names)),
            precision=facts.precision, opset=request.opset,
            quantization=made.quantization, optimization=made.optimization,
            fidelity={**made.fidelity,
                      "thresholds": threshold_text(context.task, variant, request.thresholds)},
            extra_files={file_name: sha256_file(work_dir / file_name) for file_name in extra_names},
        )
    shutil.rmtree(scratch)
    return specs


def _model_spec(request: ExportRequest, source: ModelSource, task: ExportTask, traced: _Traced, *,
                name: str,
                variants: dict[str, VariantSpec], failed: dict[str, dict[str, Any]],
                prompt: dict[str, Any] | None, work_dir: Path,
                prefix_graphs: dict[str, VariantSpec]) -> ModelSpec:
    """The manifest of the finished export."""
    loaded, family = traced.loaded, traced.family
    config = loaded.config
    tokenizer_files = {
        path.name: sha256_file(path) for path in sorted(work_dir.iterdir())
        if path.is_file() and path.suffix in (".json", ".txt", ".model")
        and path.name != TOKENIZER_FILE and not path.name.endswith(".onnx")
    }
    source_entry = _source_entry(source, loaded, request.seed)
    notes = task.notes(standin="standin" in source_entry)
    return ModelSpec(
        name=name,
        task=task.name,
        source=source_entry,
        num_labels=family.num_labels(config, task),
        max_length=traced.max_length,
        activation=family.activation(loaded, task),
        relevance_trained=loaded.relevance_trained,
        tokenizer_file=TOKENIZER_FILE,
        tokenizer_sha256=sha256_file(work_dir / TOKENIZER_FILE),
        tokenizer_files=tokenizer_files,
        vocab_size=int(config.vocab_size),
        pad_token_id=int(loaded.tokenizer.pad_token_id or 0),
        variants=variants,
        versions=package_versions(),
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        model_config={key: getattr(config, key, None) for key in MODEL_CONFIG_KEYS},
        embedding_dim=task.embedding_dim(config),
        graph_rewrites=traced.graph_rewrites,
        prompt=prompt,
        prefix_graphs=prefix_graphs,
        family={**family.describe(config), "exporter": traced.exporter},
        failed_variants=failed,
        notes=notes.strip(),
    )


def _source_entry(source: ModelSource, loaded: LoadedModel, seed: int) -> dict[str, Any]:
    entry = dict(loaded.source)
    if source.kind == "standin":
        entry.pop("path", None)
        entry.update({"kind": "standin", "model_id": source.name, "builder": source.location,
                      "checkpoint_dir": CHECKPOINT_DIR, "seed": seed})
    if source.registry_entry:
        entry["registry_name"] = source.name
    return entry

