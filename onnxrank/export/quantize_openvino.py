"""OpenVINO int8 (variant ov_int8): NNCF post-training quantization of the fp32 graph, saved as IR.

The fp32 ``model.onnx`` is read by the OpenVINO runtime, quantized by ``nncf.quantize`` with
``model_type=nncf.ModelType.TRANSFORMER`` (SmoothQuant on by default), calibrated on the shipped
calibration pairs (never on validation pairs), and saved with ``openvino.save_model`` as
``model_ov_int8.xml`` + ``model_ov_int8.bin``. Activation scales are static (calibrated), so a
row's score does not depend on which rows share its batch, unlike onnxruntime's dynamic int8.
"""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxrank._optional import require
from onnxrank.export.calibration_statistics import StatisticsReuse
from onnxrank.export.cls_row_split import SIDE_PATH_SUFFIX as CLS_ROW_SUFFIX
from onnxrank.export.cls_row_split import ClsRowSplit, split_cls_row
from onnxrank.export.dependency_logs import dependency_logs_quieted
from onnxrank.export.hadamard_rotation import Rotation, hadamard_matrix, rotate_matmul_inputs
from onnxrank.export.outlier_split import SIDE_PATH_SUFFIX as OUTLIER_SUFFIX
from onnxrank.export.outlier_split import split_outlier_channels
from onnxrank.export.quantize import (
    activation_matmuls,
    ffn_down_projections,
    ffn_up_projections,
    head_projections,
)
from onnxrank.export.quantize_rows import GemmFlops

if TYPE_CHECKING:
    from onnxrank.export.tasks import ExportTask

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OvInt8Settings:
    """How model_ov_int8.xml is made (see DEFAULT_OV_INT8_RECIPES and docs/export.md).

    Attributes:
        smooth_quant_alpha: SmoothQuant's migration strength for MatMuls; None = NNCF's default
            for transformers; a negative value switches SmoothQuant off.
        fp32_ffn_up_layers: Keep the feed-forward up-projection (the MatMul feeding the GELU) of
            this many top layers in fp32 (an NNCF ignored scope); 0 quantizes every layer's.
        fp32_ffn_down_layers: The same for the down-projection (the MatMul fed by the GELU).
        fp32_attention_products: Keep attention's query x key and probabilities x value MatMuls
            (both inputs activations) in fp32 in every layer.
        fp32_head: Keep the classification head (the last two weight MatMul/Gemm nodes: BERT's
            pooler dense and classifier) in fp32; rerank models only.
        outlier_channel_ratio: Split off every quantized weight MatMul's outlier input channels
            (calibration max above this x the median channel's) into an fp32 side path
            (onnxrank.export.outlier_split); None leaves the graph as it is.
        cls_row_ratio: Split position 0 ([CLS]) of a quantized weight MatMul's input off into a
            float side path where its calibration max exceeds this x the other positions'
            (onnxrank.export.cls_row_split): its massive activations set no int8 range, and the
            row the head reads is not rounded; None leaves the graph as it is. Not with
            outlier_channel_ratio (one rewrite per recipe).
        hadamard_block: Rotate the input of every weight MatMul NNCF quantizes by block
            Hadamard matrices of this many channels (onnxrank.export.hadamard_rotation), after
            the position-0 split where there is one: large channels are spread over their block
            before the per-tensor range is set; None leaves the inputs as they are. Not with
            outlier_channel_ratio (both rewrite what the int8 path reads).
        overflow_fix_all_layers: 7-bit weights in every layer (NNCF OverflowFix.ENABLE; NNCF's
            default fixes the first layer only). Without VNNI (AVX2) OpenVINO's u8 x s8 kernel
            saturates int16 pair sums with full-range weights, and the IR runs on whatever CPU
            loads it (on an AVX2 EPYC, tiny test model, 320 validation pairs: Spearman 0.840
            first layer only, 0.950 every layer).
    """

    smooth_quant_alpha: float | None = None
    fp32_ffn_up_layers: int = 0
    fp32_ffn_down_layers: int = 0
    fp32_attention_products: bool = False
    fp32_head: bool = False
    outlier_channel_ratio: float | None = None
    cls_row_ratio: float | None = None
    hadamard_block: int | None = None
    overflow_fix_all_layers: bool = True

    def __post_init__(self) -> None:
        if self.smooth_quant_alpha is not None and self.smooth_quant_alpha > 1:
            raise ValueError(
                f"smooth_quant_alpha must be None, negative (off) or in [0, 1], got "
                f"{self.smooth_quant_alpha}"
            )
        if self.outlier_channel_ratio is not None and not self.outlier_channel_ratio > 1:
            raise ValueError(f"outlier_channel_ratio must be None or > 1, got "
                             f"{self.outlier_channel_ratio}")
        if self.cls_row_ratio is not None and not self.cls_row_ratio >= 0:
            raise ValueError(f"cls_row_ratio must be None or >= 0, got {self.cls_row_ratio}")
        if self.cls_row_ratio is not None and self.outlier_channel_ratio is not None:
            raise ValueError("cls_row_ratio and outlier_channel_ratio are two rewrites of the same "
                             "MatMuls; a recipe takes one")
        if self.hadamard_block is not None and self.outlier_channel_ratio is not None:
            raise ValueError("hadamard_block and outlier_channel_ratio both rewrite what the int8 "
                             "path reads; a recipe takes one")
        if self.hadamard_block is not None:
            hadamard_matrix(self.hadamard_block)  # its ValueError names the rule
        for name in ("fp32_ffn_up_layers", "fp32_ffn_down_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")


# Tried in order, choosing on the tuning part of the validation pairs; the first that meets the
# int8 thresholds there is kept, and every attempt is recorded in the manifest. No rung quantizes a
# cross-encoder's classification head (pooler dense and classifier): it runs once per pair, under
# 0.1% of a 128-token pair's FLOPs, so int8 there buys no speed, and it turns small [CLS]
# differences into the score (on the stand-in, tuning pairs, NNCF's defaults: pooled Spearman
# 0.961 with it in int8, 0.981 in fp32; research/ov_int8_study.py).
# 1. NNCF's transformer defaults (SmoothQuant at its default alpha) for the encoder.
# 2. Every weight MatMul int8 but for position 0 where it sets the input's range (ratio 1: the
#    [CLS] row's massive activations), which runs float (onnxrank.export.cls_row_split); about
#    93% of the stand-in's GEMM FLOPs int8. On the stand-in its int8 run holds per-query Spearman
#    0.985-0.992 (rung 1: 0.955) and top-10 0.95-0.96 on the tuning part against the gate's 0.95,
#    but its int8+bf16 run reads 0.925 and its held-out short lists 0.920 (docs/export.md,
#    "Position 0 in float"). SmoothQuant off: on the split graph it moved no score and costs a
#    calibration pass.
# 3. Rung 2 with every quantized MatMul's input rotated by Hadamard blocks of 16 channels
#    (onnxrank.export.hadamard_rotation): 91% of the stand-in's GEMM FLOPs int8. On the stand-in
#    both its runs pass on both parts (per-query Spearman 0.991-0.995, top-10 0.95-0.99) where
#    rung 2's miss; on `amx` it runs int8+bf16 at 0.83-0.85x of OpenVINO bf16, 1.02x rung 4
#    (docs/export.md, "Rotated inputs").
# 4. Rung 2 with every feed-forward down-projection in fp32 (on the stand-in neither their outlier
#    channels nor the top layers' alone explain the rest of the loss; results/export-runs.md):
#    60% of the stand-in's GEMM FLOPs int8. On
#    the stand-in both its runs pass on both parts (top-10 0.95-0.975) where rung 2's int8+bf16
#    run misses short lists (0.925); on `amx` it runs int8+bf16 at 0.72-0.81x of OpenVINO bf16.
# 5. Every feed-forward down-projection in fp32, the outlier input channels of the other weight
#    MatMuls split off in fp32 (ratio 6): 63% of the stand-in's GEMM FLOPs stay int8 (rung 7:
#    32%). On the stand-in its int8 run passes (per-query Spearman 0.984) where the same without
#    the split (0.975) and the split with every down-projection int8 (0.972) do not; its
#    int8+bf16 run misses (0.979).
# 6. The top 3 layers' feed-forward blocks (up- and down-projection) in fp32.
# 7. Every feed-forward block in fp32.
# 8. The last resort: also attention's activation products in fp32, leaving the QKV and attention
#    output projections int8.
# Rungs 1, 6, 7 and 8 quantize one graph, so they share NNCF's calibration passes
# (onnxrank.export.calibration_statistics); rungs 2-5 rewrite it and collect their own.
DEFAULT_OV_INT8_RECIPES = (
    OvInt8Settings(fp32_head=True),
    OvInt8Settings(fp32_head=True, cls_row_ratio=1.0, smooth_quant_alpha=-1.0),
    OvInt8Settings(fp32_head=True, cls_row_ratio=1.0, smooth_quant_alpha=-1.0, hadamard_block=16),
    OvInt8Settings(fp32_head=True, cls_row_ratio=1.0, smooth_quant_alpha=-1.0,
                   fp32_ffn_down_layers=12),
    OvInt8Settings(fp32_head=True, fp32_ffn_down_layers=12, outlier_channel_ratio=6.0),
    OvInt8Settings(fp32_head=True, fp32_ffn_up_layers=3, fp32_ffn_down_layers=3),
    OvInt8Settings(fp32_head=True, fp32_ffn_up_layers=12, fp32_ffn_down_layers=12),
    OvInt8Settings(fp32_head=True, fp32_ffn_up_layers=12, fp32_ffn_down_layers=12,
                   fp32_attention_products=True),
)
IR_WEIGHTS_SUFFIX = ".bin"


def distinct_ov_recipes(recipes: Sequence[OvInt8Settings], *, task: ExportTask,
                        layers: int) -> tuple[OvInt8Settings, ...]:
    """`recipes` as they apply to this model, repeats dropped.

    Layer counts are capped at the model's layers (on a model of 3 layers or fewer, "the top 3
    layers' blocks" and "every block" are one rung, tried once), and a task without a
    classification head (embedding) clears ``fp32_head``.
    """
    fitted = (replace(recipe, fp32_head=recipe.fp32_head and task.has_head,
                      fp32_ffn_up_layers=min(recipe.fp32_ffn_up_layers, layers),
                      fp32_ffn_down_layers=min(recipe.fp32_ffn_down_layers, layers))
              for recipe in recipes)
    return tuple(dict.fromkeys(fitted))


def _kept_fp32(fp32_path: Path, settings: OvInt8Settings, *, up: int, down: int) -> list[str]:
    """The node names a recipe keeps in fp32 (NNCF's ignored scope)."""
    return ((ffn_up_projections(fp32_path)[-up:] if up else [])
            + (ffn_down_projections(fp32_path)[-down:] if down else [])
            + (activation_matmuls(fp32_path) if settings.fp32_attention_products else [])
            + (head_projections(fp32_path) if settings.fp32_head else []))


def quantize_openvino_int8(
    *,
    fp32_path: Path,
    out_path: Path,
    settings: OvInt8Settings,
    calibration: Sequence[dict[str, np.ndarray]],
    layers: int,
    statistics: StatisticsReuse | None = None,
) -> dict[str, Any]:
    """Write ``out_path`` (.xml) and its .bin and return the manifest's ``quantization`` entry.

    Args:
        fp32_path: The plain fp32 export (model.onnx).
        out_path: Target IR file, ending in .xml; the weights go beside it with .bin.
        settings: SmoothQuant strength and fp32 layers.
        calibration: Calibration inputs, one unpadded row per item (name -> int64 [1, length]).
        layers: The model's encoder layers (caps fp32_ffn_up_layers).
        statistics: The ladder's calibration statistics, reused from its earlier rungs where
            the graph is the same (None: a fresh one, collecting every pass).

    Raises:
        ValueError: No calibration items, or `out_path` does not end in .xml.
        MissingDependencyError: openvino (extra ``openvino``) or nncf (extra ``export``) is missing.
    """
    if not calibration:
        raise ValueError("OpenVINO int8 quantization needs calibration items; got none")
    if Path(out_path).suffix != ".xml":
        raise ValueError(f"out_path must end in .xml (OpenVINO IR), got {out_path}")
    openvino = require("openvino", extra="openvino")
    require("nncf", extra="export")  # before the split's work
    up = min(settings.fp32_ffn_up_layers, layers)
    down = min(settings.fp32_ffn_down_layers, layers)
    kept_fp32 = _kept_fp32(fp32_path, settings, up=up, down=down)
    statistics = statistics or StatisticsReuse()
    with tempfile.TemporaryDirectory(dir=Path(out_path).parent, prefix=".ov-int8-") as scratch:
        source, outliers, cls_rows = Path(fp32_path), None, None
        rotation: Rotation | None = None
        if settings.outlier_channel_ratio is not None:
            source = Path(scratch) / "split.onnx"
            outliers = split_outlier_channels(fp32_path, source, calibration=calibration,
                                              ratio=settings.outlier_channel_ratio, skip=kept_fp32)
            kept_fp32 += [name + OUTLIER_SUFFIX for name in outliers]
        if settings.cls_row_ratio is not None:
            source = Path(scratch) / "cls_row.onnx"
            cls_rows = split_cls_row(fp32_path, source, calibration=calibration,
                                     ratio=settings.cls_row_ratio, skip=kept_fp32)
            kept_fp32 += [name + CLS_ROW_SUFFIX for name in cls_rows.split] + cls_rows.first_row_only
        if settings.hadamard_block is not None:
            rotated = Path(scratch) / "rotated.onnx"
            rotation = rotate_matmul_inputs(source, rotated, block=settings.hadamard_block,
                                            skip=kept_fp32)
            source = rotated
            kept_fp32 += list(rotation.rotations)
        overflow_fix = _quantize(openvino.Core().read_model(str(source)), out_path, settings,
                                 calibration, kept_fp32, statistics)
    logger.info("quantized %s -> %s with NNCF (%s)", fp32_path.name, out_path.name, settings)
    return {
        "method": "static (NNCF post-training quantization)",
        "tool": "nncf.quantize",
        "model_type": "TRANSFORMER",
        "preset": "default for TRANSFORMER (mixed: symmetric weights, asymmetric activations)",
        "smooth_quant_alpha": ("default" if settings.smooth_quant_alpha is None
                               else "off" if settings.smooth_quant_alpha < 0
                               else settings.smooth_quant_alpha),
        "fp32_ffn_up_layers": up,
        "fp32_ffn_down_layers": down,
        "fp32_attention_products": settings.fp32_attention_products,
        "fp32_head": settings.fp32_head,
        "outlier_channels": None if outliers is None else {
            "ratio": settings.outlier_channel_ratio, "channels_per_matmul": outliers},
        "float_cls_row": None if cls_rows is None else cls_rows.record(),
        "hadamard_rotation": None if rotation is None else {
            "block": rotation.block, "rotated": rotation.rotated,
            "rotation_input_widths": rotation.rotations,
            "not_a_multiple_of_block": rotation.not_a_multiple},
        "overflow_fix": overflow_fix,
        "nodes_kept_fp32": kept_fp32,
        "int8_gemm_flops_share": _int8_flops(fp32_path, kept_fp32, outliers or {},
                                             cls_rows, rotation).share_record(),
        "source_variant": "fp32",
        "format": "OpenVINO IR (openvino.save_model, compress_to_fp16=False)",
        "calibration": {
            "data": "onnxrank/data/calibration_pairs.jsonl (disjoint from the validation pairs)",
            "items": len(calibration),
            "rows_per_item": 1,
            # NNCF's passes over the items: run here, or taken from an earlier rung on the same
            # graph (onnxrank.export.calibration_statistics)
            "statistics_passes": dict(statistics.passes),
        },
    }


def _int8_flops(fp32_path: Path, kept_fp32: Sequence[str], outliers: dict[str, int],
                cls_rows: ClsRowSplit | None, rotation: Rotation | None) -> GemmFlops:
    """A pair's GEMM FLOPs and the int8 part: every weight MatMul NNCF quantizes, less its
    outlier channels and its position-0 row (NNCF's TRANSFORMER preset leaves attention's
    activation products float). MatMuls that see position 0 only count once per pair. The float
    rotations count per token (also on position 0, which they skip when it is split off: a
    share lower by a 128th of theirs at most)."""
    onnx = require("onnx", extra="export")
    graph = onnx.load(str(fp32_path), load_external_data=False).graph
    shapes = {tensor.name: list(tensor.dims) for tensor in graph.initializer}
    flops = GemmFlops()
    for node in graph.node:
        weight = shapes.get(node.input[1]) if node.op_type in ("MatMul", "Gemm") else None
        first_row_only = cls_rows is not None and node.name in cls_rows.first_row_only
        flops.add(node.op_type, weight, per_pair=first_row_only)
        if node.op_type == "MatMul" and weight is not None and node.name not in kept_fp32:
            int8 = 2.0 * (weight[0] - outliers.get(node.name, 0)) * weight[-1]
            flops.int8_per_token += int8
            if cls_rows is not None and node.name in cls_rows.split:
                flops.float_first_row += int8
    if rotation is not None:
        for width in rotation.rotations.values():
            flops.add("MatMul", [width, rotation.block])
    return flops


def _quantize(model: Any, out_path: Path, settings: OvInt8Settings,
              calibration: Sequence[dict[str, np.ndarray]], kept_fp32: list[str],
              statistics: StatisticsReuse) -> str:
    """nncf.quantize `model` with `settings`, `kept_fp32` as its ignored scope (through
    `statistics`); save the IR. Returns the overflow fix used (NNCF's name)."""
    openvino = require("openvino", extra="openvino")
    nncf = require("nncf", extra="export")
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
        OverflowFix,
    )

    overflow_fix = OverflowFix.ENABLE if settings.overflow_fix_all_layers else OverflowFix.FIRST_LAYER
    advanced = AdvancedQuantizationParameters(overflow_fix=overflow_fix)
    if settings.smooth_quant_alpha is not None:
        advanced = AdvancedQuantizationParameters(
            overflow_fix=overflow_fix,
            smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=settings.smooth_quant_alpha))
    with dependency_logs_quieted("nncf"):
        quantized = statistics.quantize(
            model,
            calibration,
            model_type=nncf.ModelType.TRANSFORMER,
            # OpenVINO keeps ONNX node names, except that a Gemm becomes "<name>/WithoutBiases"
            # (MatMul) plus an Add: the pattern matches either form
            ignored_scope=nncf.IgnoredScope(patterns=[
                f"^{re.escape(name)}(/WithoutBiases)?$" for name in kept_fp32]) if kept_fp32 else None,
            advanced_parameters=advanced,
        )
    # compress_to_fp16=False: the float constants left (LayerNorm, biases, fp32 layers) stay fp32
    openvino.save_model(quantized, str(out_path), compress_to_fp16=False)
    return str(overflow_fix.value)


def weights_path(xml_path: Path) -> Path:
    """The .bin file that openvino.save_model writes beside an .xml."""
    return Path(xml_path).with_suffix(IR_WEIGHTS_SUFFIX)


def compress_openvino_int8_weights(fp32_path: Path, out_path: Path, *,
                                   keep_fp32: Sequence[str] = ()) -> dict[str, Any]:
    """Weight-only int8 OpenVINO IR (ov_int8 of the ``weight_only`` families) of an fp32 ONNX
    file: `compress_int8_weights`, saved at `out_path`. The nodes of `keep_fp32` (ONNX node
    names: a decoder's score head) keep fp32 weights.

    Returns:
        The manifest's ``quantization`` entry.

    Raises:
        ValueError: `out_path` does not end in .xml.
        MissingDependencyError: openvino (extra ``openvino``) or nncf (extra ``export``) is missing.
    """
    if Path(out_path).suffix != ".xml":
        raise ValueError(f"out_path must end in .xml (OpenVINO IR), got {out_path}")
    openvino = require("openvino", extra="openvino")
    model = openvino.Core().read_model(str(fp32_path))
    # OpenVINO's ONNX frontend names each op after its ONNX node's output tensor
    onnx = require("onnx", extra="export")
    graph = onnx.load(str(fp32_path), load_external_data=False).graph
    kept_ops = [output for node in graph.node if node.name in set(keep_fp32)
                for output in node.output]
    openvino.save_model(compress_int8_weights(model, kept_ops), str(out_path),
                        compress_to_fp16=False)
    logger.info("compressed %s -> %s with NNCF (weight-only int8)", fp32_path.name, out_path.name)
    return weight_only_record(kept_ops, source="fp32", nodes_kept_fp32=list(keep_fp32))


def compress_int8_weights(model: Any, kept_ops: Sequence[str]) -> Any:
    """NNCF compress_weights of an ``openvino.Model``: one asymmetric int8 scale per output
    channel, activations left in float, the ops named `kept_ops` left in float.

    Decoder activations have outlier channels that static int8 scales clip (what nncf.quantize
    does for the cross-encoders); weight-only compression keeps them in float.
    """
    nncf = require("nncf", extra="export")
    ignored = nncf.IgnoredScope(names=list(kept_ops), validate=False)
    with dependency_logs_quieted("nncf"):
        return nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM,
                                     ignored_scope=ignored)


def weight_only_record(kept_ops: Sequence[str], *, source: str,
                       **details: Any) -> dict[str, Any]:
    """The ``quantization`` entry of a `compress_int8_weights` IR made from `source` (a variant
    name, or what it was converted from)."""
    return {
        "method": "weight-only (NNCF compress_weights)",
        "tool": "nncf.compress_weights",
        "mode": "INT8_ASYM (per output channel)",
        "activations": "float (not quantized)",
        **details,
        "ops_kept_fp32": list(kept_ops),
        "source_variant": source,
        "format": "OpenVINO IR (openvino.save_model, compress_to_fp16=False)",
    }
