"""The gate every variant passes: run its file through the engine's runtime layer, compare it
with the PyTorch reference, and check the fidelity thresholds."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from functools import cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxrank.engine.backends.base import ModelRunner
from onnxrank.engine.batching import plan_batches
from onnxrank.engine.execution import RowPlan, run_in_order
from onnxrank.engine.prefix import PrefixGraph, plan_prefix_batches, run_with_prefix
from onnxrank.engine.runtime import open_model_file
from onnxrank.engine.variants import VARIANTS, RunAs
from onnxrank.errors import ExportError, InferenceError, ModelLoadError
from onnxrank.export.context import BuiltVariant, ExportContext, Progress, VariantFailed
from onnxrank.export.fidelity import FidelityThresholds
from onnxrank.export.validate import (
    BATCH_ROW_TOKENS,
    BATCH_SIZE,
    HELD_OUT,
    compare,
    run_batches,
    threshold_failures,
)

if TYPE_CHECKING:
    from onnxrank.export.tasks import ExportTask

logger = logging.getLogger(__name__)

# a prefix graph's scores may differ from its variant's whole-row graph by this share of the
# whole-row scores' standard deviation on the validation rows (float rounding only)
PREFIX_TOLERANCE = 1e-4
# the metrics of a ladder's attempt that its manifest record keeps
ATTEMPT_METRICS = ("spearman", "spearman_per_query_mean", "top10_overlap", "top10_overlap_min",
                   "max_abs_diff", "cosine_min")


def open_variant(context: ExportContext, variant: str) -> ModelRunner:
    """One variant's file opened as its gate runs it (the first of its facts' ``runs_as``).

    Raises:
        ModelLoadError: The file cannot be opened that way on this machine.
    """
    run = VARIANTS[variant].runs_as[0]
    return open_model_file(context.paths[variant], backend=run.backend, precision=run.precision)


def validate_file(context: ExportContext, variant: str) -> tuple[
        dict[str, Any], dict[RunAs, np.ndarray]]:
    """Run one variant's file as its gate runs it (`open_variant`) and compare it with the
    reference. The runner is not returned: a ladder validates rung after rung, and a compiled
    model kept past its rung holds its memory while the next rung quantizes.

    Returns:
        The fidelity metrics and the outputs keyed by the RunAs it ran as (BuiltVariant's
        ``outputs``); no outputs when the CPU cannot run the file and the variant does not run
        on a CPU (fp16).

    Raises:
        ExportError: A CPU variant's file could not be opened or run.
    """
    facts = VARIANTS[variant]
    run = facts.runs_as[0]
    path = context.paths[variant]
    inputs = context.inputs
    try:
        runner = open_variant(context, variant)
        outputs = run_batches(inputs.batches(), runner.run, len(inputs.rows))
    except (ModelLoadError, InferenceError) as err:
        if facts.cpu:
            raise ExportError(f"{run.backend} could not run {path.name}: {err}") from err
        reason = str(err).strip().splitlines()[0]
        logger.warning("%s variant cannot run on CPU (%s); validate it on a GPU", variant, reason)
        return {"validated": False, "validated_on": None,
                "reason": f"CPUExecutionProvider cannot run it ({reason}); fidelity can only be "
                          "checked on a GPU with onnxruntime-gpu"}, {}
    metrics = compare(inputs, context.reference, outputs)
    metrics.update({"validated": True,
                    "validated_on": f"{runner.info.backend} {runner.info.provider}"})
    return metrics, {run: outputs}


def gate_on_thresholds(context: ExportContext, variant: str, built: BuiltVariant) -> None:
    """Every variant's gate: its fidelity meets the thresholds on both parts.

    Raises:
        VariantFailed: A metric misses its threshold (stage ``validation``).
    """
    failures = threshold_failures(context.task, variant, built.fidelity, context.thresholds)
    if failures:
        raise VariantFailed("validation", "; ".join(failures), fidelity=built.fidelity,
                            **built.attempts())


def tuning_failures(context: ExportContext, variant: str, metrics: dict[str, Any]) -> list[str]:
    """Threshold misses on the tuning pairs only: what a ladder may choose by."""
    tuning = {key: value for key, value in metrics.items() if key != HELD_OUT}
    return threshold_failures(context.task, variant, tuning, context.thresholds)


def attempt_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """The tuning metrics (ATTEMPT_METRICS) a ladder attempt records of a fidelity record, over
    the part and per regime (``regimes``, where the record has them)."""
    kept = {key: metrics[key] for key in ATTEMPT_METRICS if key in metrics}
    if metrics.get("regimes"):
        kept["regimes"] = {regime: attempt_metrics(values)
                           for regime, values in metrics["regimes"].items()}
    return kept


def attempt_record(quantization: dict[str, Any], metrics: dict[str, Any],
                   passed: bool) -> dict[str, Any]:
    """One ladder rung's manifest record: its quantization record and its tuning metrics."""
    return {**quantization, "passed_on_tuning": passed, "part": metrics.get("part"),
            **attempt_metrics(metrics)}


# scores a variant's file, opened one way, against the reference: its metrics and its outputs
# (None where the caller keeps none)
MeasureRun = Callable[[ModelRunner], tuple[dict[str, Any], "np.ndarray | None"]]

# a bf16 way of running a variant's file: the run, its fidelity record, its outputs (None when
# the file could not be opened that way)
BF16Run = tuple[RunAs, dict[str, Any], "np.ndarray | None"]


def measured_bf16_runs(variant: str, path: Path, measure: MeasureRun, *, task: ExportTask,
                       thresholds: FidelityThresholds, progress: Progress,
                       measured: Collection[str] = ()) -> dict[str, BF16Run]:
    """Each bf16 precision that runs `variant`'s file at `path` under a record of its own (its
    facts' runs_as with a fidelity key, not in `measured`), by that key: the run, its record and
    its outputs. The file is opened as the engine opens it (OpenVINO's CPU plugin with
    INFERENCE_PRECISION_HINT=bf16: model.onnx as ``bf16``, the int8 IR as ``int8+bf16``) and
    gated like int8 (it is not bit-faithful either); where the engine could not open it so here
    (a CPU without BF16, no openvino) the record says the engine's reason and is not validated,
    so ``precision="auto"`` never picks that run."""
    runs: dict[str, BF16Run] = {}
    for run in VARIANTS[variant].runs_as:
        key = run.fidelity_key
        if key is None or key in measured:
            continue
        progress.step(f"validate {variant} with {run.precision}")
        try:
            runner = open_model_file(path, backend=run.backend, precision=run.precision)
        except (ValueError, ImportError, ModelLoadError) as err:
            runs[key] = run, {"validated": False, "passed": False, "reason": str(err)}, None
            continue
        metrics, outputs = measure(runner)
        failures = threshold_failures(task, key, metrics, thresholds)
        runs[key] = run, {
            **metrics, "validated": True,
            "validated_on": f"{runner.info.backend} {runner.info.provider}, "
                            "INFERENCE_PRECISION_HINT=bf16",
            "passed": not failures, "failures": failures,
            "thresholds": threshold_text(task, key, thresholds)}, outputs
    return runs


def bf16_runs(context: ExportContext, variant: str, *,
              measured: Collection[str] = ()) -> dict[str, BF16Run]:
    """`measured_bf16_runs` of a variant this export built (context.paths), on the validation
    rows: its logits against the reference."""

    def measure(runner: ModelRunner) -> tuple[dict[str, Any], np.ndarray]:
        inputs = context.inputs
        outputs = run_batches(inputs.batches(), runner.run, len(inputs.rows))
        return compare(inputs, context.reference, outputs), outputs

    return measured_bf16_runs(variant, context.paths[variant], measure, task=context.task,
                              thresholds=context.thresholds, progress=context.progress,
                              measured=measured)


def threshold_text(task: ExportTask, variant: str, thresholds: FidelityThresholds) -> dict[str, str]:
    """The manifest's ``thresholds`` of a fidelity record: metric -> "<= 0.01" / ">= 0.98"."""
    return {metric: f"{direction} {threshold:g}"
            for metric, direction, threshold, _ in task.threshold_checks(thresholds, variant)}


def gate_prefix_graph(context: ExportContext, variant: str, path: Path,
                      built: BuiltVariant) -> dict[str, Any]:
    """A prefix graph against its variant's whole-row graph, on the validation rows grouped by
    query as the engine groups them (onnxrank.engine.prefix): the record for its manifest entry.

    fp32 passes when the largest score difference is at most PREFIX_TOLERANCE x the whole-row
    scores' standard deviation; an int8 or fp16 variant (whose kernels round differently with
    other shapes: fp16's prefix scores differ from its whole rows' by about 3e-3 x their std on
    the tiny decoder stand-in) when ``vs_pytorch``, the usual fidelity metrics against the reference, meets
    the variant's own thresholds. A variant the CPU could not run (fp16 on an onnxruntime
    without its CPU kernels) leaves its prefix graph not validated and kept, as the variant is.
    Each precision that runs the variant's file under a record of its own (OpenVINO
    bf16) and passed it (`built`'s fidelity) gets a record under the same key, gated like the
    variant's: its thresholds against the reference. The whole-row outputs are those the
    variant's own gates measured (`built`'s ``outputs``).

    Raises:
        ModelLoadError, InferenceError: A graph could not be opened or run.
    """
    facts = VARIANTS[variant]
    first = facts.runs_as[0]
    if first not in built.outputs:  # the CPU could not run the variant (validate_file): as it
        return {"validated": False, "passed": True, "gate": "not run",
                "reason": f"{facts.file} was not validated here: {built.fidelity.get('reason')}"}
    whole = built.outputs[first]
    outputs, batches, runner = _prefix_outputs(context, variant, path, first)
    difference = float(np.abs(outputs - whole).max())
    spread = float(whole.std())
    prefix_tokens = {batch.prefix_length for batch in batches}
    vs_pytorch = compare(context.inputs, context.reference, outputs)
    if facts.precision == "fp32":
        gate = f"max_abs_diff <= {PREFIX_TOLERANCE:g} x score_std"
        passed = difference <= PREFIX_TOLERANCE * spread
    else:  # int8 and fp16 kernels round differently with other shapes: the variant's own gate
        gate = f"the {variant} thresholds against the PyTorch reference (vs_pytorch)"
        failures = threshold_failures(context.task, variant, vs_pytorch, context.thresholds)
        passed = not failures
    record: dict[str, Any] = {
        "compared_with": f"{facts.file} on the same rows", "gate": gate, "passed": passed,
        "max_abs_diff": difference, "score_std": spread,
        "max_abs_diff_limit": PREFIX_TOLERANCE * spread,
        "rows": len(context.inputs.rows), "batches": len(batches),
        "prefix_tokens": [min(prefix_tokens), max(prefix_tokens)],
        "row_tokens_mean": float(np.mean([len(row.ids) for row in context.inputs.rows])),
        "vs_pytorch": vs_pytorch,
        "validated_on": f"{runner.info.backend} {runner.info.provider}",
    }
    if facts.precision != "fp32":
        record["failures"] = failures
    for run in facts.runs_as:
        own = built.fidelity.get(run.fidelity_key or "")
        if run.fidelity_key is None or not (isinstance(own, dict) and own.get("passed") is True):
            continue  # the whole-row graph was not validated this way: neither is this one
        whole = built.outputs[run]
        outputs, _, _ = _prefix_outputs(context, variant, path, run)
        metrics = compare(context.inputs, context.reference, outputs)
        failures = threshold_failures(context.task, run.fidelity_key, metrics, context.thresholds)
        record[run.fidelity_key] = {
            **metrics, "max_abs_diff_vs_whole_rows": float(np.abs(outputs - whole).max()),
            "passed": not failures, "failures": failures,
            "thresholds": threshold_text(context.task, run.fidelity_key, context.thresholds)}
    return record


def _prefix_outputs(context: ExportContext, variant: str, path: Path,
                    run: RunAs) -> tuple[np.ndarray, list[Any], Any]:
    """The prefix graph's outputs on the validation rows (grouped by query; a group that shares
    no token runs through the whole-row graph), run as `run` says; the prefix plan's batches
    and the prefix graph's runner."""
    backend, precision = run.backend, run.precision
    inputs = context.inputs
    prefix_graph = PrefixGraph(open_model_file(path, backend=backend, precision=precision))

    def plan(lengths: list[int], prefix: int) -> list[Any]:
        # the validation batches' bound (onnxrank.export.validate.length_batches)
        return plan_batches(lengths, max_batch_tokens=BATCH_ROW_TOKENS * BATCH_SIZE,
                            max_batch_size=BATCH_SIZE)

    batches = plan_prefix_batches(inputs.rows, [inputs.groups[row.item_index]
                                                for row in inputs.rows], plan)
    # opened on first use: only a query whose rows share no token runs whole, and a decoder's
    # whole-row graph is as large as its prefix graph
    whole_graph = cache(partial(open_model_file, context.paths[variant],
                                          backend=backend, precision=precision))
    outputs = run_in_order(RowPlan(inputs.rows, batches, inputs.pad_id),
                           run_with_prefix(prefix_graph.plan_run(),
                                           lambda feeds: whole_graph().run(feeds)), finite=None)
    return outputs, batches, prefix_graph.runner
