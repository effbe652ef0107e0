"""int8 quantization for CPU (model_int8.onnx): dynamic or static QDQ, per-tensor or per-channel."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from onnxrank._optional import require
from onnxrank.export.graph_edit import tensor_readers
from onnxrank.export.quantize_rows import quantize_per_row, split_source

logger = logging.getLogger(__name__)

# Int8Settings.method: per-token activation scales, per-batch ones, calibrated ones
INT8_METHODS = ("per_row", "dynamic", "static")


@dataclass(frozen=True, slots=True)
class Int8Settings:
    """How model_int8.onnx is made (see DEFAULT_INT8_RECIPES and docs/export.md for the choice).

    Attributes:
        method: ``"per_row"`` (onnxruntime's MatMulNBits: int8 weights per block, activations
            quantized at run time with one scale per block of each row; see
            onnxrank.export.quantize_rows), ``"dynamic"`` (weights int8 offline, activation scales
            computed per batch at run time) or ``"static"`` (QDQ with activation scales calibrated
            on the shipped calibration pairs, never on validation pairs).
        per_channel: One weight scale per output channel instead of one per tensor.
        reduce_range: 7-bit weights. On CPUs without VNNI (AVX2) the u8 x s8 kernel adds pairs of
            products in int16 (vpmaddubsw), which saturates with full-range weights; the file is run
            on whatever CPU loads it, so 7 bits is the default (on an AVX2 EPYC, tiny test model,
            320 validation pairs: Spearman 0.868 with 8-bit weights, 0.950 with 7).
        op_types: Operator types to quantize; None = onnxruntime's default list for the method.
        fp32_ffn_up_layers: Keep the feed-forward up-projection (the MatMul feeding the GELU) of
            this many top layers in fp32; 0 quantizes every layer's.
        block_size: ``per_row`` only: inputs per weight scale and per activation scale (32 kept
            the stand-in's scores batch-independent; 128 did not, results/export-runs.md).
        search_fp32_groups: ``per_row`` only: when > 0, measure each encoder layer group's effect
            on the gate and keep up to this many of the most sensitive groups in fp32
            (onnxrank.export.sensitivity); 0 puts every encoder MatMul in int8.
        cls_row_ratio: ``per_row`` only: position 0 of every weight MatMul whose input's range it
            sets (its max |value| over the calibration rows above this ratio x every other
            position's) runs on a float side path (onnxrank.export.cls_row_split); None splits
            nothing.
    """

    method: Literal["per_row", "dynamic", "static"] = "dynamic"
    per_channel: bool = False
    reduce_range: bool = True
    op_types: tuple[str, ...] | None = None
    fp32_ffn_up_layers: int = 0
    block_size: int = 32
    search_fp32_groups: int = 0
    cls_row_ratio: float | None = None

    def __post_init__(self) -> None:
        if self.method not in INT8_METHODS:
            raise ValueError(f"int8 method must be one of {', '.join(map(repr, INT8_METHODS))}, "
                             f"got {self.method!r}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two >= 16, got {self.block_size!r}")
        if not isinstance(self.fp32_ffn_up_layers, int) or self.fp32_ffn_up_layers < 0:
            raise ValueError(
                f"fp32_ffn_up_layers must be an int >= 0, got {self.fp32_ffn_up_layers!r}"
            )
        per_row_only = {"search_fp32_groups": self.search_fp32_groups != 0,
                        "cls_row_ratio": self.cls_row_ratio is not None}
        for name, set_here in per_row_only.items():
            if set_here and self.method != "per_row":
                raise ValueError(f"{name} applies to the per_row method only, got "
                                 f"method={self.method!r}")
        if self.cls_row_ratio is not None and not self.cls_row_ratio >= 0:
            raise ValueError(f"cls_row_ratio must be None or >= 0, got {self.cls_row_ratio}")
        if self.method != "dynamic" and self.fp32_ffn_up_layers:
            raise ValueError(
                "fp32_ffn_up_layers applies to dynamic quantization of the fused graph only, "
                f"got method={self.method!r} with fp32_ffn_up_layers={self.fp32_ffn_up_layers}"
            )


# Tried in order; the first whose int8 file meets the fidelity thresholds is kept.
# 0. Per-row: every encoder MatMul in int8 with per-token activation scales, the score head in
#    fp32, and position 0 in float where it sets a MatMul's range (ratio 1: the row the head
#    reads). On the stand-in it passes the gate where every dynamic rung with feed-forward int8
#    fails, and a row's score no longer moves with its batch mates (docs/export.md); without
#    position 0 in float it met the tuning part and missed held-out short lists (top-10 0.93).
#    The dynamic rungs below are its fallback (a graph whose projections are not plain MatMuls).
#    When it misses, the same with up to 3 of the most sensitive encoder layer groups in fp32,
#    measured one group at a time (onnxrank.export.sensitivity).
# 1. Every supported op, per-channel weights: ~4x smaller (docs/export.md).
# 2. The same with the feed-forward up-projections of the top 1, 2, 3, 6, then 12 layers left in
#    fp32: their input is a LayerNorm output whose few outlier channels set the per-batch int8
#    scale, so they lose the most (measured one layer at a time on the stand-in; docs/export.md).
#    Each step gives up about a sixth of recipe 1's speed-up on a 6-layer model.
# 3. Only the fused Attention (QKV projections) and the embedding table in int8: the last resort.
FFN_UP_FP32_LADDER = (1, 2, 3, 6, 12)
DEFAULT_INT8_RECIPES = (
    Int8Settings("per_row", cls_row_ratio=1.0),
    Int8Settings("per_row", search_fp32_groups=3, cls_row_ratio=1.0),
    Int8Settings("dynamic", per_channel=True),
    *(Int8Settings("dynamic", per_channel=True, fp32_ffn_up_layers=layers)
      for layers in FFN_UP_FP32_LADDER),
    Int8Settings("dynamic", per_channel=True, op_types=("Attention", "EmbedLayerNormalization")),
)
# fused GELUs, and Erf: the core of the GELU that the plain fp32 export spells out
# (x * 0.5 * (1 + erf(x / sqrt(2))))
GELU_OPS = ("Gelu", "BiasGelu", "FastGelu", "Erf")
# ops between a feed-forward up-projection and its GELU: the bias Add, the plain graph's Div, and
# the Slice/Split of a gated layer's fused projection (ModernBERT's Wi: GELU(input) * gate)
GELU_PATH_OPS = ("Add", "Div", "Mul", "Slice", "Split")
# what onnxruntime's quantizer writes for an int8 operator (dynamic: MatMulInteger and the fused
# ops; static: QDQ pairs)
QUANTIZED_OPS = frozenset({"MatMulInteger", "DynamicQuantizeMatMul", "QAttention",
                           "QEmbedLayerNormalization", "QGemm", "QLinearMatMul", "QuantizeLinear",
                           "DynamicQuantizeLSTM", "ConvInteger", "QLinearConv"})


def distinct_recipes(recipes: Sequence[Int8Settings], *, layers: int,
                     reads_position_0: bool) -> tuple[Int8Settings, ...]:
    """`recipes` as they apply to this model, repeats dropped.

    fp32_ffn_up_layers is capped at the model's layer count (on a 6-layer model the ladder's 6
    and 12 make the same file: trying both would only repeat a quantization and a validation),
    and cls_row_ratio is cleared where the output does not read position 0 alone
    (Family.reads_position_0): per-row scales already keep that row's range to itself, so a
    float side path only helps where it is the row the score reads (on the mean-pooled embedder
    it grew the int8 file from 59.8 to 94.7 MB).
    """
    capped = (replace(recipe, fp32_ffn_up_layers=min(recipe.fp32_ffn_up_layers, layers),
                      cls_row_ratio=recipe.cls_row_ratio if reads_position_0 else None)
              for recipe in recipes)
    return tuple(dict.fromkeys(capped))


def ffn_up_projections(model_path: Path) -> list[str]:
    """Names of the MatMuls that feed a GELU (directly, or through a bias Add and the plain
    graph's Div by sqrt(2)), in graph order.

    In a BERT-style encoder that is one feed-forward up-projection per layer, bottom layer first,
    in the fused graph (MatMul -> BiasGelu) and in the plain one (MatMul -> Add -> Div -> Erf)
    alike, and ModernBERT's fused Wi (MatMul -> Slice -> Div -> Erf); a head with a GELU
    (ModernBERT's) comes last. OpenVINO keeps the ONNX node names, so the same names select nodes
    for NNCF.
    """
    onnx = require("onnx", extra="export")
    graph = onnx.load(str(model_path), load_external_data=False).graph
    consumers = tensor_readers(graph)

    def feeds_gelu(tensor: str, hops: int) -> bool:
        for node in consumers.get(tensor, []):
            if node.op_type in GELU_OPS:
                return True
            if hops and node.op_type in GELU_PATH_OPS and feeds_gelu(node.output[0], hops - 1):
                return True
        return False

    return [node.name for node in graph.node
            if node.op_type == "MatMul" and feeds_gelu(node.output[0], hops=2)]


def ffn_down_projections(model_path: Path) -> list[str]:
    """Names of the MatMuls fed by a GELU (directly, or through the plain graph's Add and Muls
    after its Erf, and a GLU's gate), in graph order: one feed-forward down-projection per layer,
    bottom first."""
    onnx = require("onnx", extra="export")
    graph = onnx.load(str(model_path), load_external_data=False).graph
    producer = {output: node for node in graph.node for output in node.output}

    def from_gelu(tensor: str, hops: int) -> bool:
        node = producer.get(tensor)
        if node is None:
            return False
        if node.op_type in GELU_OPS:
            return True
        return bool(hops) and node.op_type in GELU_PATH_OPS and any(
            from_gelu(name, hops - 1) for name in node.input)

    # 3 hops from BERT's Erf (Add, Mul by x, Mul by 0.5); ModernBERT's GLU multiplies by its
    # gate once more
    return [node.name for node in graph.node
            if node.op_type == "MatMul" and from_gelu(node.input[0], hops=4)]


def activation_matmuls(model_path: Path) -> list[str]:
    """Names of the MatMuls whose two inputs are both activations (no weight), in graph order.

    In a BERT-style encoder these are attention's query x key and probabilities x value products,
    two per layer.
    """
    onnx = require("onnx", extra="export")
    graph = onnx.load(str(model_path), load_external_data=False).graph
    constants = {tensor.name for tensor in graph.initializer}
    constants |= {output for node in graph.node if node.op_type == "Constant" for output in node.output}
    return [node.name for node in graph.node
            if node.op_type == "MatMul" and not constants.intersection(node.input)]


def head_projections(model_path: Path, count: int = 2) -> list[str]:
    """Names of the last `count` weight MatMul/Gemm nodes in graph order: a cross-encoder's head
    (BERT's pooler dense and classifier; RoBERTa's and ELECTRA's dense and out_proj)."""
    onnx = require("onnx", extra="export")
    graph = onnx.load(str(model_path), load_external_data=False).graph
    constants = {tensor.name for tensor in graph.initializer}
    weighted = [node.name for node in graph.node
                if node.op_type in ("MatMul", "Gemm") and constants.intersection(node.input[1:])]
    return weighted[-count:]


def quantized_nodes(model_path: Path) -> int:
    """How many int8 operators (QUANTIZED_OPS) a graph holds: 0 means a recipe's op types are
    absent from it and the file is still fp32."""
    onnx = require("onnx", extra="export")
    graph = onnx.load(str(model_path), load_external_data=False).graph
    return sum(node.op_type in QUANTIZED_OPS for node in graph.node)


def quantize_int8(
    *,
    fp32_path: Path,
    opt_path: Path | None,
    out_path: Path,
    settings: Int8Settings,
    calibration: Iterable[dict[str, np.ndarray]] | None = None,
    keep_fp32: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Write the int8 variant and return the manifest's ``quantization`` entry.

    0. Per-row: MatMulNBits on the plain fp32 graph (onnxrank.export.quantize_rows), position 0
       split off in float first when `settings.cls_row_ratio` is set.
    1. Dynamic: quantizes the fused graph (`opt_path`) when given, so fused Attention becomes
       QAttention; else the plain fp32 graph. The top `fp32_ffn_up_layers` feed-forward
       up-projections stay fp32 (see ffn_up_projections).
    2. Static: quantizes the plain fp32 graph (QDQ around MatMul/Gemm/...), calibrated with MinMax
       on `calibration` batches (required).

    Args:
        fp32_path: The plain fp32 export.
        opt_path: The fused graph, or None if it was not built.
        out_path: Target file.
        settings: Method and granularity.
        calibration: Input batches (name -> int64 array) for static calibration; for per_row
            with a cls_row_ratio, one unpadded row per item (the split reads position 0's range).
        keep_fp32: Node name -> why it stays fp32 whatever the settings (a decoder's score head;
            per_row: a cross-encoder's head too).

    Raises:
        ValueError: Static quantization, or per_row with a cls_row_ratio, without calibration.
    """
    keep_fp32 = dict(keep_fp32 or {})
    if settings.method == "per_row":
        rows = None if calibration is None else list(calibration)
        with split_source(fp32_path, out_path, cls_row_ratio=settings.cls_row_ratio,
                          calibration=rows, skip=list(keep_fp32)) as (source, cls_rows):
            return quantize_per_row(source, out_path, block_size=settings.block_size,
                                    keep_fp32=keep_fp32, cls_rows=cls_rows)
    quantization = require("onnxruntime.quantization", extra="export")
    if settings.method == "dynamic":
        source = opt_path if opt_path is not None else fp32_path
        layers = settings.fp32_ffn_up_layers
        kept_fp32 = (ffn_up_projections(source)[-layers:] if layers else []) + list(keep_fp32)
        quantization.quantize_dynamic(
            str(source),
            str(out_path),
            op_types_to_quantize=list(settings.op_types) if settings.op_types else None,
            per_channel=settings.per_channel,
            reduce_range=settings.reduce_range,
            weight_type=quantization.QuantType.QInt8,
            nodes_to_exclude=kept_fp32,
            # ONNX shape inference cannot type the outputs of fused com.microsoft ops; every
            # tensor in these graphs is float32, so say so instead of failing
            extra_options={"DefaultTensorType": 1},  # onnx.TensorProto.FLOAT
        )
        return {
            "method": "dynamic",
            "per_channel": settings.per_channel,
            "reduce_range": settings.reduce_range,
            "weight_type": "QInt8",
            "activation_type": "QUInt8 (dynamic, per batch)",
            "source_variant": "opt" if opt_path is not None else "fp32",
            "op_types": list(settings.op_types) if settings.op_types else "default",
            "fp32_ffn_up_layers": settings.fp32_ffn_up_layers,
            "nodes_kept_fp32": kept_fp32,
            "quantized_nodes": quantized_nodes(out_path),
        }
    if calibration is None:
        raise ValueError("static int8 quantization needs calibration batches; got None")
    return _quantize_static(fp32_path, out_path, settings, list(calibration), list(keep_fp32))


def _quantize_static(fp32_path: Path, out_path: Path, settings: Int8Settings,
                     batches: list[dict[str, np.ndarray]], keep_fp32: list[str]) -> dict[str, Any]:
    """Static QDQ int8 of the plain fp32 graph, MinMax-calibrated on `batches`."""
    quantization = require("onnxruntime.quantization", extra="export")

    class Reader(quantization.CalibrationDataReader):  # type: ignore[name-defined]
        def __init__(self) -> None:
            self._iterator = iter(batches)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self._iterator, None)

    quantization.quantize_static(
        str(fp32_path),
        str(out_path),
        Reader(),
        op_types_to_quantize=list(settings.op_types) if settings.op_types else None,
        quant_format=quantization.QuantFormat.QDQ,
        per_channel=settings.per_channel,
        reduce_range=settings.reduce_range,
        activation_type=quantization.QuantType.QUInt8,
        weight_type=quantization.QuantType.QInt8,
        calibrate_method=quantization.CalibrationMethod.MinMax,
        nodes_to_exclude=keep_fp32,
    )
    return {
        "method": "static",
        "format": "QDQ",
        "per_channel": settings.per_channel,
        "reduce_range": settings.reduce_range,
        "weight_type": "QInt8",
        "activation_type": "QUInt8",
        "calibration": {"method": "MinMax", "batches": len(batches),
                        "rows": int(sum(len(batch["input_ids"]) for batch in batches))},
        "source_variant": "fp32",
        "op_types": list(settings.op_types) if settings.op_types else "default",
        "nodes_kept_fp32": keep_fp32,
        "quantized_nodes": quantized_nodes(out_path),
    }
