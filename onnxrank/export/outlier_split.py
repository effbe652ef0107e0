"""Outlier input channels of weight MatMuls split off into an fp32 side path, before static int8.

Static int8 (ov_int8) quantizes each weight MatMul's input with one range per tensor. In a
BERT-style encoder a few input channels of the feed-forward up-projection (a LayerNorm output's)
and down-projection (a GELU output's) reach 5-15x the other channels' maxima, and they set that
range for every token. `split_outlier_channels` measures each weight MatMul's per-channel max
|input| on the calibration rows; a channel above ``ratio`` x the median channel's max is an
outlier, and the MatMul becomes

    (X * keep_mask) @ W  +  Gather(X, outliers) @ W[outliers]

so the int8 path never sees the outliers, and the side path (node ``<name>/outliers``) stays fp32
as an NNCF ignored scope. Scores are unchanged in fp32 (the two sums are the same products).
results/export-runs.md has the measurements behind the form and the ratio.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnxrank._optional import require
from onnxrank.export.graph_edit import weight_matmuls
from onnxrank.export.graph_probe import probe_tensors

logger = logging.getLogger(__name__)

SIDE_PATH_SUFFIX = "/outliers"


def split_outlier_channels(fp32_path: Path, out_path: Path, *,
                           calibration: Sequence[dict[str, np.ndarray]], ratio: float,
                           skip: Collection[str]) -> dict[str, int]:
    """Write `fp32_path` with its weight MatMuls' outlier input channels split off to `out_path`
    (weights in one external data file beside it).

    Args:
        fp32_path: The plain fp32 graph.
        out_path: Where the rewritten graph goes.
        calibration: The calibration rows (input name -> array), never validation pairs.
        ratio: A channel whose max |value| exceeds ratio x the median channel's is an outlier.
        skip: MatMul names left as they are (those kept fp32 anyway, such as the head).

    Returns:
        Rewritten MatMul name -> its outlier channel count (MatMuls without outliers are absent).

    Raises:
        ValueError: No calibration rows, or a ratio not above 1 (every channel above the median
            would count as an outlier).
    """
    if not calibration:
        raise ValueError("splitting outlier channels needs calibration rows; got none")
    if not ratio > 1:
        raise ValueError(f"ratio must be > 1, got {ratio}")
    onnx = require("onnx", extra="export")
    model = onnx.load(str(fp32_path))
    weights = {tensor.name: tensor for tensor in model.graph.initializer}
    targets = {node.name: node.input[0] for node in weight_matmuls(model.graph, skip)}
    maxima = _channel_maxima(fp32_path, sorted(set(targets.values())), calibration, out_path)
    outliers = {}
    for name, source in targets.items():
        peak = maxima[source]
        channels = np.flatnonzero(peak > ratio * np.median(peak))
        if channels.size:
            outliers[name] = channels
    _rewrite(model, weights, outliers)
    onnx.save(model, str(out_path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=f"{Path(out_path).name}.data")
    logger.info("outlier channels split off in %d of %d weight MatMuls (%d channels)",
                len(outliers), len(targets), sum(c.size for c in outliers.values()))
    return {name: int(channels.size) for name, channels in outliers.items()}


def _channel_maxima(fp32_path: Path, tensors: list[str],
                    calibration: Sequence[dict[str, np.ndarray]],
                    scratch_path: Path) -> dict[str, np.ndarray]:
    """Per-channel max |value| of each named tensor over the calibration rows."""
    maxima: dict[str, np.ndarray] = {}
    for values in probe_tensors(fp32_path, tensors, calibration, scratch_path):
        for name, value in values.items():
            peak = np.abs(value.reshape(-1, value.shape[-1])).max(axis=0)
            maxima[name] = np.maximum(maxima[name], peak) if name in maxima else peak
    return maxima


def _rewrite(model: Any, weights: dict[str, Any], outliers: dict[str, np.ndarray]) -> None:
    onnx = require("onnx", extra="export")
    helper, numpy_helper = onnx.helper, onnx.numpy_helper
    nodes = []
    for node in model.graph.node:
        channels = outliers.get(node.name)
        if channels is None:
            nodes.append(node)
            continue
        name, source = node.name, node.input[0]
        weight = numpy_helper.to_array(weights[node.input[1]])
        mask = np.ones(weight.shape[0], dtype=np.float32)
        mask[channels] = 0
        model.graph.initializer.extend([
            numpy_helper.from_array(mask, f"{name}/keep_mask"),
            numpy_helper.from_array(channels.astype(np.int64), f"{name}/outlier_channels"),
            numpy_helper.from_array(weight[channels], f"{name}/outlier_weights")])
        side = name + SIDE_PATH_SUFFIX
        # a Mul, not a Gather of the kept channels: OpenVINO runs it for less (results/export-runs.md)
        nodes += [
            helper.make_node("Mul", [source, f"{name}/keep_mask"], [f"{name}/kept"],
                             name=f"{name}/keep"),
            helper.make_node("MatMul", [f"{name}/kept", node.input[1]], [f"{name}/main"], name=name),
            helper.make_node("Gather", [source, f"{name}/outlier_channels"], [f"{side}/x"],
                             name=f"{side}/gather", axis=-1),
            helper.make_node("MatMul", [f"{side}/x", f"{name}/outlier_weights"], [f"{side}/y"],
                             name=side),
            helper.make_node("Add", [f"{name}/main", f"{side}/y"], list(node.output),
                             name=f"{side}/add"),
        ]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
