"""Position 0 of a weight MatMul's input split off into a float side path, before static int8.

Static int8 (ov_int8) gives each weight MatMul's input one range per tensor. In a BERT-style
encoder the first token ([CLS] / ``<s>``) carries massive activations: on the stand-in
(all-MiniLM-L6-v2's encoder), per-token max |input| over 64 calibration pairs is 28.3 for [CLS]
against a median token's 3.7 at layer 0's feed-forward up-projection, and 24.6 against 3.2 at its
down-projection; [CLS] is the largest row at every up-projection and at layers 0-3's
down-projections. So the row the head reads sets the step of every other token's int8 grid, and
then is rounded on that grid itself. `split_cls_row` computes each MatMul whose range position 0
sets as

    Concat(X[:, :1] @ W, X[:, 1:] @ W, axis=1)

The first product (node ``<name>/cls_row``) stays float as an NNCF ignored scope; the second,
named as the original node, is the one NNCF quantizes, calibrated on every row but the first.
Scores are unchanged in fp32 (the same products), and the int8 share of a 128-token pair's weight
FLOPs drops only by 1/128. MatMuls whose input is already one row per pair (the last layer after
`onnxrank.export.prune`) are not rewritten: that row is position 0, so they stay float whole.
docs/export.md ("Position 0 in float") has the measurements.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnxrank._optional import require
from onnxrank.export.graph_edit import weight_matmuls
from onnxrank.export.graph_probe import probe_tensors

logger = logging.getLogger(__name__)

SIDE_PATH_SUFFIX = "/cls_row"
SEQUENCE_AXIS = 1
# elementwise operators: with per-channel or scalar constants they compute each position alone
ROW_WISE_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Erf", "Tanh", "Sigmoid",
                          "Relu", "Gelu", "Cast"})


@dataclass(frozen=True, slots=True)
class ClsRowSplit:
    """What `split_cls_row` did to a graph's weight MatMuls, each list in graph order.

    Attributes:
        ratio: The rule's ratio: a MatMul was split where position 0's max |input| exceeded
            `ratio` x every other position's.
        split: MatMuls rewritten: position 0 on the float side path, the other rows int8.
        first_row_only: MatMuls whose input is position 0 alone (one row per pair): kept float.
    """

    ratio: float
    split: list[str]
    first_row_only: list[str]

    def record(self) -> dict[str, Any]:
        """The manifest's ``float_cls_row`` entry."""
        return {"ratio": self.ratio, "split": self.split, "first_row_only": self.first_row_only}


def split_cls_row(fp32_path: Path, out_path: Path, *,
                  calibration: Sequence[Mapping[str, np.ndarray]], ratio: float,
                  skip: Collection[str]) -> ClsRowSplit:
    """Write `fp32_path` with position 0 of its weight MatMuls' inputs on a side path to
    `out_path` (weights in one external data file beside it).

    A MatMul is split where position 0 sets its input's range: its max |value| over the
    calibration rows is above `ratio` x every other position's (1: position 0 is the largest).
    MatMuls that share an input share its two slices.

    Args:
        fp32_path: The plain fp32 graph.
        out_path: Where the rewritten graph goes.
        calibration: The calibration rows (input name -> [1, tokens] array), never validation
            pairs; they also show which MatMuls see every position ([1, tokens, hidden]).
        ratio: How far position 0's max must exceed the other positions' for a split (>= 0).
        skip: MatMul names left as they are (those kept fp32 anyway, such as the head).

    Returns:
        The rewritten MatMuls and those that see position 0 only.

    Raises:
        ValueError: A negative ratio, or no calibration row of at least two tokens (a MatMul
            that sees every position could not be told from one that sees position 0 only).
    """
    if not ratio >= 0:
        raise ValueError(f"ratio must be >= 0, got {ratio}")
    rows = [item for item in calibration if _tokens(item) >= 2]
    if not rows:
        raise ValueError("splitting position 0 off needs calibration rows of at least 2 tokens; "
                         "got none")
    onnx = require("onnx", extra="export")
    model = onnx.load(str(fp32_path))
    candidates = {node.name: node.input[0] for node in weight_matmuls(model.graph, skip)}
    sources = sorted(set(candidates.values()))
    every_row: set[str] = set()
    first_only: set[str] = set()
    first_peak = dict.fromkeys(sources, 0.0)
    rest_peak = dict.fromkeys(sources, 0.0)
    for item, values in zip(rows, probe_tensors(fp32_path, sources, rows, out_path)):
        for source, value in values.items():
            if value.ndim != 3 or value.shape[SEQUENCE_AXIS] not in (1, _tokens(item)):
                continue
            (first_only if value.shape[SEQUENCE_AXIS] == 1 else every_row).add(source)
            magnitude = np.abs(value)
            first_peak[source] = max(first_peak[source], float(magnitude[:, 0].max()))
            if value.shape[SEQUENCE_AXIS] > 1:
                rest_peak[source] = max(rest_peak[source], float(magnitude[:, 1:].max()))
    split_sources = {source for source in every_row - first_only
                     if first_peak[source] > ratio * rest_peak[source]}
    done = ClsRowSplit(
        ratio=ratio,
        split=[name for name, source in candidates.items() if source in split_sources],
        first_row_only=[name for name, source in candidates.items()
                        if source in first_only - every_row])
    _rewrite(model, done.split)
    onnx.save(model, str(out_path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=f"{Path(out_path).name}.data")
    logger.info("position 0 split off in %d of %d weight MatMuls (%d see position 0 only)",
                len(done.split), len(candidates), len(done.first_row_only))
    return done


def _tokens(item: Mapping[str, np.ndarray]) -> int:
    return max((value.shape[-1] for value in item.values()), default=0)


def _rewrite(model: Any, targets: Collection[str]) -> None:
    """Split `targets` and carry the two halves on through row-wise operators.

    A tensor with halves (``<name>/first_rows``, ``<name>/rest_rows``) feeds a row-wise node (an
    elementwise op with per-channel or scalar constants, a LayerNormalization over the last axis)
    whose other activation inputs have halves too: the node runs once per half. Anywhere else it
    is joined once by a Concat that takes its name. So a feed-forward block runs up-projection,
    bias, GELU and down-projection per half, and OpenVINO still fuses the bias, the GELU and the
    int8 quantization into the products; the join comes where attention needs every row.
    """
    onnx = require("onnx", extra="export")
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    graph = model.graph
    bounds = {"first": (0, 1), "rest": (1, np.iinfo(np.int64).max)}
    graph.initializer.extend(
        numpy_helper.from_array(np.array([value], np.int64), f"cls_row_split/{part}_{end}")
        for part, pair in bounds.items() for end, value in zip(("start", "end"), pair))
    graph.initializer.append(
        numpy_helper.from_array(np.array([SEQUENCE_AXIS], np.int64), "cls_row_split/axis"))
    per_channel = {tensor.name for tensor in graph.initializer if len(tensor.dims) <= 1}
    per_channel |= {node.output[0] for node in graph.node if node.op_type == "Constant"
                    and len(helper.get_attribute_value(node.attribute[0]).dims) <= 1}
    halved: set[str] = set()  # tensors that exist as two halves
    joined: set[str] = set()  # of those, the ones joined back by a Concat already
    nodes: list[Any] = []

    def half(tensor: str, part: str) -> str:
        return f"{tensor}/{part}_rows"

    def split(tensor: str) -> None:
        if tensor not in halved:
            halved.add(tensor)
            joined.add(tensor)
            nodes.extend(helper.make_node(
                "Slice", [tensor, f"cls_row_split/{part}_start", f"cls_row_split/{part}_end",
                          "cls_row_split/axis"], [half(tensor, part)],
                name=half(tensor, part)) for part in bounds)

    def join(tensor: str) -> None:
        if tensor in halved and tensor not in joined:
            joined.add(tensor)
            nodes.append(helper.make_node("Concat", [half(tensor, part) for part in bounds],
                                          [tensor], name=f"{tensor}/join", axis=SEQUENCE_AXIS))

    for node in graph.node:
        activations = [tensor for tensor in node.input if tensor and tensor not in per_channel]
        if node.name in targets:
            split(node.input[0])
        elif not (_row_wise(node) and activations
                  and all(tensor in halved for tensor in activations)):
            for tensor in node.input:
                join(tensor)
            nodes.append(node)
            continue
        for part in bounds:
            twin = onnx.NodeProto()
            twin.CopyFrom(node)
            twin.input[:] = [half(tensor, part) if tensor in halved else tensor
                             for tensor in node.input]
            twin.output[:] = [half(node.output[0], part)]
            # the rest rows keep the node's name: NNCF's ignored scope names the first row's
            twin.name = node.name + SIDE_PATH_SUFFIX if part == "first" else node.name
            nodes.append(twin)
        halved.add(node.output[0])
    for output in graph.output:
        join(output.name)
    del graph.node[:]
    graph.node.extend(nodes)


def _row_wise(node: Any) -> bool:
    """Whether `node` computes each position from that position alone (one output)."""
    if len(node.output) != 1:
        return False
    if node.op_type == "LayerNormalization":
        axis = next((attribute.i for attribute in node.attribute if attribute.name == "axis"), -1)
        return axis == -1
    return node.op_type in ROW_WISE_OPS
