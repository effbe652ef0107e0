"""How the export builds and gates each variant after fp32: one table entry per variant.

VARIANT_STEPS maps a variant name to its build step (writes the file, measures it: a
BuiltVariant), its gate (default: the fidelity thresholds on both parts), what it records
after passing and, for a variant with a prefix graph (decoder rerankers), how that graph is made
from the traced fp32 one. The facts of each variant (file, precision, how it runs) are
onnxrank.engine.variants.VARIANTS; fp32, the reference graph every step starts from, is traced
and gated by onnxrank.export.pipeline itself. Steps run in the table's order. The
weight-compressed route (onnxrank.export.direct_openvino) writes its one variant itself, and
`converted_step` gates it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from onnxrank.export.calibration_statistics import StatisticsReuse
from onnxrank.export.context import BuiltVariant, ExportContext
from onnxrank.export.gate import bf16_runs, gate_on_thresholds, validate_file
from onnxrank.export.ladder import Rung, run_ladder
from onnxrank.export.optimize import convert_fp16, optimize_transformer
from onnxrank.export.quantize import distinct_recipes, head_projections, quantize_int8
from onnxrank.export.quantize_openvino import (
    compress_openvino_int8_weights,
    distinct_ov_recipes,
    quantize_openvino_int8,
)
from onnxrank.export.sensitivity import search_per_row


@dataclass(frozen=True, slots=True)
class VariantStep:
    """How one variant is made.

    Attributes:
        build: Writes the variant's file (context.paths[name]) and measures it.
        gate: Raises VariantFailed when the built variant must be left out.
        after_gate: Adds records to a variant that passed (OpenVINO's int8+bf16 run of the IR).
        prefix_graph: Writes the variant's prefix graph (its facts' ``prefix_file``, the second
            path) from the traced fp32 one (the first) and returns the extra files it wrote
            beside it, or None where this export's variant has no prefix graph; None: the
            variant never has one. fp32's prefix graph is the traced file itself.
    """

    build: Callable[[ExportContext], BuiltVariant]
    gate: Callable[[ExportContext, str, BuiltVariant], None] = gate_on_thresholds
    after_gate: Callable[[ExportContext, str, BuiltVariant], None] | None = None
    prefix_graph: Callable[[ExportContext, Path, Path], tuple[str, ...] | None] | None = None


def _attention_shape(context: ExportContext) -> tuple[int, int]:
    # only the fused optimizer reads attention shapes: an unknown family may have no attention heads
    return int(context.config.num_attention_heads), int(context.config.hidden_size)


def write_opt(context: ExportContext) -> dict[str, Any]:
    """Write model_opt.onnx (onnxruntime's transformer fusions) and return its optimization record."""
    context.progress.step("build opt")
    num_heads, hidden_size = _attention_shape(context)
    return optimize_transformer(context.paths["fp32"], context.paths["opt"], num_heads=num_heads,
                                hidden_size=hidden_size,
                                model_type=context.family.ort_model_type or "bert")


def build_opt(context: ExportContext) -> BuiltVariant:
    """The fused fp32 graph, validated like fp32."""
    optimization = write_opt(context)
    context.progress.step("validate opt")
    fidelity, outputs = validate_file(context, "opt")
    return BuiltVariant(fidelity, optimization=optimization, outputs=outputs)


def build_fp16(context: ExportContext) -> BuiltVariant:
    """fp16 through the transformer optimizer (validated only where the CPU can run it)."""
    context.progress.step("build fp16")
    optimization, extra_files = write_fp16(context, context.paths["fp32"], context.paths["fp16"])
    context.progress.step("validate fp16")
    fidelity, outputs = validate_file(context, "fp16")
    return BuiltVariant(fidelity, optimization=optimization, outputs=outputs,
                        extra_files=extra_files)


def write_fp16(context: ExportContext, source: Path, out: Path) -> tuple[dict[str, Any],
                                                                        tuple[str, ...]]:
    """The fp16 graph of the fp32 graph `source` at `out`, the family's fp32 nodes (a decoder's
    score head) kept: its ``optimization`` record and its external data files."""
    num_heads, hidden_size = _attention_shape(context)
    return convert_fp16(source, out, num_heads=num_heads, hidden_size=hidden_size,
                        model_type=context.family.ort_model_type,
                        keep_fp32=context.family.fp32_nodes(source))


def fp16_prefix_graph(context: ExportContext, source: Path, out: Path) -> tuple[str, ...]:
    """The traced prefix graph converted exactly as fp16 was; its external data files."""
    return write_fp16(context, source, out)[1]


def int8_rungs(context: ExportContext) -> list[Rung]:
    """The onnxruntime int8 ladder: the request's recipes that apply to this family's graph."""
    recipes = context.family.int8_recipes(distinct_recipes(
        context.int8, layers=context.layers,
        reads_position_0=context.family.reads_position_0(context.config, context.task)))
    paths = context.paths
    if any(recipe.method == "dynamic" for recipe in recipes) and context.family.ort_model_type \
            is not None and not paths["opt"].is_file():
        write_opt(context)  # the dynamic recipes quantize the fused graph when there is one
    opt_path = paths["opt"] if paths["opt"].is_file() else None
    batches = [context.graph_feeds(feeds) for feeds in context.calibration.padded_batches()]
    rows = context.calibration_rows()
    family_fp32 = dict.fromkeys(context.family.fp32_nodes(paths["fp32"]),
                                f"the {context.family.name} family keeps it fp32 (score head)")
    # a cross-encoder's head turns small [CLS] differences into the score: per-row int8 keeps it
    # fp32 (a pair's one row; its FLOPs are a rounding error next to the encoder's)
    head = dict.fromkeys(head_projections(paths["fp32"]) if context.task.has_head else [],
                         "classification head: its int8 rounding moves the score itself")
    return [Rung(recipe, partial(search_per_row, context, recipe, {**head, **family_fp32})
                 if recipe.search_fp32_groups else
                 partial(quantize_int8, fp32_path=paths["fp32"], opt_path=opt_path,
                         out_path=paths["int8"], settings=recipe,
                         calibration=batches if recipe.method == "static" else rows,
                         keep_fp32={**head, **family_fp32} if recipe.method == "per_row"
                         else family_fp32),
                 # dynamic scales follow each batch, static ones do not; per-row ones should
                 # not either, and the gate checks it (batch_1_vs_64_max_abs_diff)
                 batch_dependent=recipe.method != "static")
            for recipe in recipes]


def build_int8(context: ExportContext) -> BuiltVariant:
    """onnxruntime int8: the first rung of its ladder that meets the thresholds."""
    return run_ladder(context, "int8", int8_rungs(context))


def ov_int8_rungs(context: ExportContext) -> list[Rung]:
    """The OpenVINO int8 ladder (NNCF, calibrated one row per item)."""
    items = context.calibration_rows()
    recipes = distinct_ov_recipes(context.ov_int8, task=context.task, layers=context.layers)
    statistics = StatisticsReuse()  # the rungs on one graph share NNCF's calibration passes
    # static scales do not follow the batch; what still moves with the padded shape is float
    # rounding, as in OpenVINO's bf16 on model.onnx, which the fidelity gate judges
    # (onnxrank.engine.runtime.gate_refusal)
    return [Rung(recipe, partial(quantize_openvino_int8, fp32_path=context.paths["fp32"],
                                 out_path=context.paths["ov_int8"], settings=recipe,
                                 calibration=items, layers=context.layers,
                                 statistics=statistics),
                 batch_dependent=False)
            for recipe in recipes]


def compress_ov_int8(context: ExportContext, source: Path, out: Path) -> dict[str, Any]:
    """The weight-only int8 IR of `source` at `out` (the family's fp32 nodes kept); its
    ``quantization`` record."""
    return compress_openvino_int8_weights(source, out,
                                          keep_fp32=context.family.fp32_nodes(source))


def build_ov_int8(context: ExportContext) -> BuiltVariant:
    """OpenVINO int8: weight-only compression or the static ladder, as the family says."""
    if context.family.ov_int8_mode == "weight_only":  # no activation scales: no calibration, no ladder
        context.progress.step("ov_int8 weight-only")
        quantization = compress_ov_int8(context, context.paths["fp32"], context.paths["ov_int8"])
        fidelity, outputs = validate_file(context, "ov_int8")
        return BuiltVariant(fidelity, quantization=quantization, outputs=outputs)
    return run_ladder(context, "ov_int8", ov_int8_rungs(context))


def ov_int8_prefix_graph(context: ExportContext, source: Path, out: Path) -> tuple[str, ...] | None:
    """The traced prefix graph compressed exactly as ov_int8 was, so its weights are the same
    int8 numbers: weight-only families only (a static IR's scales were calibrated on whole
    rows). Returns the IR's weights file."""
    if context.family.ov_int8_mode != "weight_only":
        return None
    compress_ov_int8(context, source, out)
    return (out.with_suffix(".bin").name,)


def validate_converted(variant: str, quantization: dict[str, Any],
                       context: ExportContext) -> BuiltVariant:
    """A variant the weight-compressed route already wrote (onnxrank.export.direct_openvino),
    measured like a built one."""
    context.progress.step(f"validate {variant}")
    fidelity, outputs = validate_file(context, variant)
    return BuiltVariant(fidelity, quantization=quantization, outputs=outputs)


def converted_step(variant: str, quantization: dict[str, Any]) -> VariantStep:
    """The step of a variant the weight-compressed route wrote: validated, gated and recorded
    like the built one; its prefix graph was written with it."""
    return VariantStep(partial(validate_converted, variant, quantization),
                       after_gate=record_bf16_runs)


def record_bf16_runs(context: ExportContext, variant: str, built: BuiltVariant) -> None:
    """Add the record of each bf16 precision that runs `variant`'s file (its facts' runs_as with
    a fidelity key) to its fidelity, and its outputs to its outputs; a record its ladder already
    measured on the kept file stays."""
    for key, (run, record, outputs) in bf16_runs(context, variant, measured=built.fidelity).items():
        built.fidelity[key] = record
        if outputs is not None:
            built.outputs[run] = outputs


VARIANT_STEPS: dict[str, VariantStep] = {
    "opt": VariantStep(build_opt),
    "fp16": VariantStep(build_fp16, prefix_graph=fp16_prefix_graph),
    "int8": VariantStep(build_int8),
    "ov_int8": VariantStep(build_ov_int8, after_gate=record_bf16_runs,
                           prefix_graph=ov_int8_prefix_graph),
}
