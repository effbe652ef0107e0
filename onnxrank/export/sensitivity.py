"""The per-row int8 rung's search: keep in fp32 only the encoder layers the gate needs.

When every encoder MatMul in per-row int8 misses the gate, each layer group is measured on its
own (that group's MatMuls fp32, every other int8) by the gate's metric on the tuning pairs; the
groups are then put back in fp32 in order of measured gain, one at a time, until the gate passes
or `Int8Settings.search_fp32_groups` groups are fp32. Deterministic (graph order, stable sort)
and bounded: at most MAX_GROUPS + search_fp32_groups quantize rounds, one validation fewer (the
best group alone is measured once).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from onnxrank._optional import require
from onnxrank.export.cls_row_split import SIDE_PATH_SUFFIX, ClsRowSplit
from onnxrank.export.context import ExportContext
from onnxrank.export.gate import tuning_failures, validate_file
from onnxrank.export.quantize import Int8Settings
from onnxrank.export.quantize_rows import quantize_per_row, split_source

logger = logging.getLogger(__name__)

# layers are measured in at most this many groups of adjacent layers (a 24-layer model: 12 pairs)
MAX_GROUPS = 12
# what the groups are ranked by: the gate's per-query rank correlation on the tuning pairs
METRIC = "spearman_per_query_mean"
_LAYER = re.compile(r"layers?[./_](\d+)[./]")


def layer_groups(model_path: Any, keep_fp32: Mapping[str, str]) -> list[list[str]]:
    """The weight MatMuls of each group of adjacent encoder layers, bottom first (a layer is the
    number after ``layer.``/``layers.`` in the node name)."""
    onnx = require("onnx", extra="export")
    graph = onnx.load(str(model_path), load_external_data=False).graph
    weights = {tensor.name for tensor in graph.initializer}
    by_layer: dict[int, list[str]] = {}
    for node in graph.node:
        match = _LAYER.search(node.name)
        if (node.op_type == "MatMul" and node.input[1] in weights and match
                and node.name not in keep_fp32):
            by_layer.setdefault(int(match.group(1)), []).append(node.name)
    layers = sorted(by_layer)
    return [[name for layer in chunk for name in by_layer[int(layer)]]
            for chunk in np.array_split(np.array(layers), min(len(layers), MAX_GROUPS))
            if len(chunk)]


def search_per_row(context: ExportContext, settings: Int8Settings,
                   keep_fp32: Mapping[str, str]) -> dict[str, Any]:
    """Write the per-row int8 file with the fewest layer groups in fp32 that pass the gate on the
    tuning pairs (or the search's last split) and return its ``quantization`` record, with the
    measured ``sensitivity`` table."""
    out = context.paths["int8"]
    rows = None if settings.cls_row_ratio is None else context.calibration_rows()
    with split_source(context.paths["fp32"], out, cls_row_ratio=settings.cls_row_ratio,
                      calibration=rows, skip=list(keep_fp32)) as (path, cls_rows):
        return _search(context, settings, keep_fp32, path, cls_rows)


def _search(context: ExportContext, settings: Int8Settings, keep_fp32: Mapping[str, str],
            path: Path, cls_rows: ClsRowSplit | None) -> dict[str, Any]:
    """search_per_row on the graph `path` (the fp32 export, or its position-0 split)."""
    out = context.paths["int8"]
    # position 0's float products are not the search's to choose
    float_rows = [] if cls_rows is None else cls_rows.first_row_only + [
        name + SIDE_PATH_SUFFIX for name in cls_rows.split]
    groups = layer_groups(path, {**keep_fp32, **dict.fromkeys(float_rows, "position 0")})
    if not groups:  # nothing to choose between: the ladder skips this rung
        return {"method": "per_row", "quantized_nodes": 0,
                "search_fp32_groups": settings.search_fp32_groups}

    def quantize(fp32_groups: list[int]) -> dict[str, Any]:
        kept = {**keep_fp32, **{name: f"sensitivity search: layer group {index} fp32"
                                for index in fp32_groups for name in groups[index]}}
        return quantize_per_row(path, out, block_size=settings.block_size, keep_fp32=kept,
                                cls_rows=cls_rows)

    measured = []  # each group alone fp32: the gate's metrics on the tuning pairs
    for index in range(len(groups)):
        context.progress.step(f"int8 sensitivity {index + 1} of {len(groups)}")
        quantize([index])
        measured.append(validate_file(context, "int8")[0])
    sensitivity = [{"group": index, "nodes": len(groups[index]), METRIC: metrics[METRIC]}
                   for index, metrics in enumerate(measured)]
    order = [row["group"] for row in sorted(sensitivity, key=lambda row: -row[METRIC])]
    # the best group alone was measured above: write its file again, not its metrics
    record, metrics = quantize(order[:1]), measured[order[0]]
    for count in range(2, min(settings.search_fp32_groups, len(order)) + 1):
        if not tuning_failures(context, "int8", metrics):
            break
        record = quantize(sorted(order[:count]))
        metrics, _ = validate_file(context, "int8")
    logger.info("int8 sensitivity search: %s", sensitivity)
    return {**record, "search_fp32_groups": settings.search_fp32_groups,
            "sensitivity": {"metric": f"{METRIC} on the tuning pairs with one group fp32",
                            "groups": sensitivity}}
