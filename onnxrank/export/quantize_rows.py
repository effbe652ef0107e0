"""Per-row int8 (the int8 ladder's first method): onnxruntime's MatMulNBits with 8-bit weights.

Every weight MatMul of the plain fp32 graph becomes a com.microsoft MatMulNBits node with
``bits=8`` and ``accuracy_level=4``: its weights are int8 with one scale per block of
`block_size` inputs of each output channel, and onnxruntime's CPU kernel quantizes the activations
to int8 at run time with one scale per block of each row (per token), then multiplies in int8.
A scale per row instead of dynamic int8's one scale per batch is what keeps a LayerNorm output's
few outlier channels from flattening every other token, and it makes a row's score independent
of its batch mates (results/export-runs.md has the measurements).

With `split_source` position 0 of the MatMuls whose range it sets runs on a float side path
(onnxrank.export.cls_row_split): the row a cross-encoder's head reads is then never rounded to
int8 (on the stand-in, per-query Spearman 0.993-0.996 -> 0.998-0.999, held-out short top-10
0.93 -> 0.97; docs/export.md, "Per-row int8").
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnxrank._optional import require
from onnxrank.export.cls_row_split import SIDE_PATH_SUFFIX, ClsRowSplit, split_cls_row
from onnxrank.export.graph_edit import drop_unused_initializers, tensor_readers

logger = logging.getLogger(__name__)

BITS = 8
# 4 = int8 compute: activations quantized per block of each row at run time
ACCURACY_LEVEL = 4
# the sequence length at which the manifest states the int8 share of a pair's GEMM FLOPs (the
# probe's shape)
FLOP_SHARE_TOKENS = 128
# the fp32 view of a weight store_half keeps in fp16
HALF_SUFFIX = "/fp32"


def int8_blocks(weight: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray]:
    """A ``[K, N]`` weight as MatMulNBits' 8-bit blocks and their scales (symmetric).

    Returns:
        ``[N, blocks, block_size]`` uint8 (the int8 value + 128, MatMulNBits' default zero point
        for 8 bits) and ``[N * blocks]`` float32 scales; K is zero-padded to whole blocks.
    """
    inputs, outputs = weight.shape
    blocks = -(-inputs // block_size)
    padded = np.zeros((outputs, blocks * block_size), np.float32)
    padded[:, :inputs] = weight.T
    grouped = padded.reshape(outputs, blocks, block_size)
    scales = np.abs(grouped).max(axis=2) / 127.0
    scales[scales == 0] = 1.0
    values = np.clip(np.rint(grouped / scales[..., None]), -127, 127) + 128
    return values.astype(np.uint8), scales.astype(np.float32).reshape(-1)


@dataclass
class GemmFlops:
    """A pair's GEMM FLOPs as the graph is read, and the part of them that per-row int8 runs."""

    per_token: float = 0.0  # weight MatMuls
    per_pair: float = 0.0  # weight Gemms (a head)
    activation_products: int = 0  # attention's scores and context MatMuls
    hidden: int = 0  # the first weight MatMul's input width
    int8_per_token: float = 0.0
    float_first_row: float = 0.0  # int8_per_token's MatMuls run position 0 in float (cls_row_split)

    def add(self, op_type: str, weight: list[int] | None, *, per_pair: bool = False) -> None:
        """Count one node: a weight MatMul per token (per pair when `per_pair`: its input is one
        row per pair), a weight Gemm per pair, a MatMul of two activations as attention's."""
        if op_type not in ("MatMul", "Gemm"):
            return
        if weight is None:
            self.activation_products += op_type == "MatMul"
            return
        self.hidden = self.hidden or int(weight[0])
        flops = 2.0 * float(np.prod(weight))
        if op_type == "MatMul" and not per_pair:
            self.per_token += flops
        else:
            self.per_pair += flops

    def int8_share(self, tokens: int) -> float:
        total = (self.per_pair + self.per_token * tokens
                 + self.activation_products * 2.0 * tokens * tokens * self.hidden)
        return (self.int8_per_token * tokens - self.float_first_row) / total if total else 0.0

    def share_record(self) -> dict[str, Any]:
        """The manifest's ``int8_gemm_flops_share``: the int8 share at FLOP_SHARE_TOKENS."""
        return {
            "tokens": FLOP_SHARE_TOKENS, "share": round(self.int8_share(FLOP_SHARE_TOKENS), 4),
            "counted_as": "onnxrank.bench.flops counts them: weight MatMuls per token, weight "
                          "Gemms per pair, attention's activation products (fp32) "
                          "2 x tokens^2 x hidden each",
        }


@contextmanager
def split_source(fp32_path: Path, out_path: Path, *, cls_row_ratio: float | None,
                 calibration: Sequence[Mapping[str, np.ndarray]] | None,
                 skip: Sequence[str]) -> Iterator[tuple[Path, ClsRowSplit | None]]:
    """The graph per-row int8 quantizes, for the duration: `fp32_path` itself, or with
    `cls_row_ratio` its position-0 split (split_cls_row) in a scratch directory beside `out_path`.

    Raises:
        ValueError: A ratio without calibration rows (the split reads position 0's range there).
    """
    if cls_row_ratio is None:
        yield fp32_path, None
        return
    if not calibration:
        raise ValueError("per-row int8 with position 0 in float needs calibration rows (one "
                         "unpadded row per item); got none")
    with tempfile.TemporaryDirectory(dir=Path(out_path).parent, prefix=".per-row-") as scratch:
        source = Path(scratch) / "cls_row.onnx"
        yield source, split_cls_row(fp32_path, source, calibration=calibration,
                                    ratio=cls_row_ratio, skip=skip)


def quantize_per_row(fp32_path: Path, out_path: Path, *, block_size: int,
                     keep_fp32: Mapping[str, str],
                     cls_rows: ClsRowSplit | None = None) -> dict[str, Any]:
    """Write the per-row int8 graph of `fp32_path` and return the manifest's ``quantization``.

    Args:
        fp32_path: The plain fp32 export (every projection a visible MatMul), or its
            position-0 split (`split_source`).
        out_path: Target file.
        block_size: Inputs per weight and activation scale (a power of two, at least 16).
        keep_fp32: Node name -> why it stays fp32 (the score head, a family's own nodes).
        cls_rows: What the split did to `fp32_path`, if it is split: its side paths and the
            MatMuls that see position 0 only compute in fp32 on their own weights, stored fp16
            (`store_half`; on the stand-in, computing them on their twin's int8 weights instead
            moved held-out short top-10 from 0.97 to 0.95).

    Returns:
        The record: method, kernel, block size, every weight GEMM left in fp32 with its reason,
        the position-0 split, and the int8 share of a pair's GEMM FLOPs.
    """
    onnx = require("onnx", extra="export")
    numpy_helper = require("onnx.numpy_helper", extra="export")
    model = onnx.load(str(fp32_path))
    graph = model.graph
    weights = {tensor.name: tensor for tensor in graph.initializer}
    split = set() if cls_rows is None else set(cls_rows.split)
    side_paths = {name + SIDE_PATH_SUFFIX for name in split}
    first_row_only = set() if cls_rows is None else set(cls_rows.first_row_only)
    keep_fp32 = {**keep_fp32,
                 **dict.fromkeys(side_paths, "position 0 of a split MatMul (float side path)"),
                 **dict.fromkeys(first_row_only, "sees position 0 only (one row per pair)")}
    kept: dict[str, str] = {}
    flops = GemmFlops()
    nodes = []
    for node in graph.node:
        weight = weights.get(node.input[1]) if node.op_type in ("MatMul", "Gemm") else None
        if node.name not in side_paths:  # a side path's FLOPs are its twin's position 0
            flops.add(node.op_type, None if weight is None else list(weight.dims),
                      per_pair=node.name in first_row_only)
        if weight is None:
            nodes.append(node)
            continue
        if node.name in keep_fp32 or node.op_type == "Gemm" or len(weight.dims) != 2:
            kept[node.name] = keep_fp32.get(node.name) or (
                "a Gemm (once per pair, with its bias): MatMulNBits replaces MatMul only"
                if node.op_type == "Gemm" else f"a {len(weight.dims)}-d weight")
            nodes.append(node)
            continue
        values, scales = int8_blocks(numpy_helper.to_array(weight).astype(np.float32), block_size)
        packed = numpy_helper.from_array(values, f"{weight.name}_int8")
        scale = numpy_helper.from_array(scales, f"{weight.name}_scales")
        graph.initializer.extend([packed, scale])
        inputs, outputs = weight.dims
        nodes.append(onnx.helper.make_node(
            "MatMulNBits", [node.input[0], packed.name, scale.name], list(node.output),
            name=node.name, domain="com.microsoft", K=inputs, N=outputs, bits=BITS,
            block_size=block_size, accuracy_level=ACCURACY_LEVEL))
        flops.int8_per_token += 2.0 * inputs * outputs
        if node.name in split:
            flops.float_first_row += 2.0 * inputs * outputs
    del graph.node[:]
    graph.node.extend(nodes)
    drop_unused_initializers(graph)
    half = store_half(graph, matmuls=side_paths | first_row_only)
    if not any(opset.domain == "com.microsoft" for opset in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(out_path))
    converted = sum(node.op_type == "MatMulNBits" for node in nodes)
    logger.info("per-row int8: %d MatMuls -> MatMulNBits, %d kept fp32", converted, len(kept))
    return {
        "method": "per_row",
        "kernel": f"com.microsoft MatMulNBits (bits={BITS}, accuracy_level={ACCURACY_LEVEL}: "
                  "int8 compute)",
        "weight_type": f"int8, symmetric, one scale per {block_size} inputs of each output channel",
        "activation_type": f"int8, dynamic, one scale per {block_size} values of each row "
                           "(per token)",
        "block_size": block_size,
        "source_variant": "fp32",
        "quantized_nodes": converted,
        "nodes_kept_fp32": kept,
        "float_cls_row": None if cls_rows is None else cls_rows.record(),
        "float_weights_stored_fp16": half,
        "int8_gemm_flops_share": flops.share_record(),
    }


def store_half(graph: Any, *, matmuls: set[str]) -> dict[str, Any]:
    """Store the float weights of `matmuls` in fp16, each read through a Cast to float, which
    onnxruntime folds back into an fp32 constant when the session loads: they still compute in
    fp32 and the file shrinks by half of them (the stand-in's per-row file: 96.6 -> 77.7 MB,
    its scores as before). A weight something else also reads keeps fp32. The embedding tables
    keep fp32 too: stored fp16 they saved 23 MB more and cost the stand-in per-query Spearman
    0.0010 on held-out short lists (results/export-runs.md).

    Returns:
        The manifest's record: the tensors stored in fp16 and the bytes saved.
    """
    onnx = require("onnx", extra="export")
    numpy_helper = require("onnx.numpy_helper", extra="export")
    weights = {tensor.name: tensor for tensor in graph.initializer
               if tensor.data_type == onnx.TensorProto.FLOAT}
    readers = tensor_readers(graph)
    halved = sorted({node.input[1] for node in graph.node if node.name in matmuls
                     and node.input[1] in weights
                     and all(reader.name in matmuls for reader in readers[node.input[1]])})
    saved = 0
    for name in reversed(halved):
        values = numpy_helper.to_array(weights[name])
        graph.initializer.remove(weights[name])
        graph.initializer.append(numpy_helper.from_array(values.astype(np.float16), name))
        saved += values.nbytes // 2
        for reader in readers[name]:
            reader.input[1] = name + HALF_SUFFIX
        graph.node.insert(0, onnx.helper.make_node("Cast", [name], [name + HALF_SUFFIX],
                                                   name=name + HALF_SUFFIX,
                                                   to=onnx.TensorProto.FLOAT))
    return {"tensors": halved, "bytes_saved": saved,
            "how": "stored fp16, cast to fp32 where read (folded to an fp32 constant at load): "
                   "the side paths' and one-row products' weights; computed in fp32 as before"}
