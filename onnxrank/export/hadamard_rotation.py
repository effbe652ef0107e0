"""Weight MatMul inputs rotated by block Hadamard matrices, before static int8.

Static int8 (ov_int8) gives each weight MatMul's input one range per tensor, so the channel with
the largest values sets the step of every other channel's grid. An orthonormal rotation spreads a
large channel over the channels it is mixed with, and the product is unchanged in exact
arithmetic: with ``R`` block-diagonal (Sylvester Hadamard blocks of ``block`` channels, scaled
by 1/sqrt(block), so ``R @ R = I``),

    X @ W  =  (X @ R) @ (R @ W)

`rotate_matmul_inputs` rewrites each target MatMul to read ``X @ R`` (one rotation per input
tensor, shared by the MatMuls that read it: a layer's query, key and value) and stores ``R @ W``
as its weight. The rotation (node ``<input>/hadamard``) is a float MatMul of ``block`` columns
that NNCF leaves out (an ignored scope); it costs 2 x block FLOPs per input value, 2.4% of the
stand-in's weight GEMM FLOPs at blocks of 16. The idea is QuaRot's (Ashkboos et al., 2024), done
online because a post-LayerNorm encoder cannot fold it into its weights. Blocks of 16 were chosen
for that cost: on the stand-in's tuning part they held the fidelity of blocks of 32 to 128
(results/export-runs.md). docs/export.md ("Rotated inputs") has the measurements.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnxrank._optional import require
from onnxrank.export.graph_edit import drop_unused_initializers, weight_matmuls

logger = logging.getLogger(__name__)

ROTATION_SUFFIX = "/hadamard"


@dataclass(frozen=True, slots=True)
class Rotation:
    """What `rotate_matmul_inputs` did, each list in graph order.

    Attributes:
        block: Channels per Hadamard block.
        rotated: MatMuls that read a rotated input.
        rotations: The float rotation MatMuls (one per rotated input tensor) and each one's input
            width, which with `block` gives its FLOPs per row.
        not_a_multiple: Target MatMuls left as they are: their input width is not a multiple of
            `block`.
    """

    block: int
    rotated: list[str]
    rotations: dict[str, int]
    not_a_multiple: list[str]


def hadamard_matrix(block: int) -> np.ndarray:
    """The orthonormal Sylvester Hadamard matrix of `block` rows (a power of two >= 2)."""
    if block < 2 or block & (block - 1):
        raise ValueError(f"a Hadamard block is a power of two >= 2, got {block}")
    matrix = np.ones((1, 1), np.float64)
    while matrix.shape[0] < block:
        matrix = np.block([[matrix, matrix], [matrix, -matrix]])
    return matrix / np.sqrt(block)


def rotate_matmul_inputs(source_path: Path, out_path: Path, *, block: int,
                         skip: Collection[str]) -> Rotation:
    """Write `source_path` with the inputs of its weight MatMuls rotated to `out_path` (weights
    in one external data file beside it).

    Args:
        source_path: An fp32 graph (model.onnx, or a rewrite of it).
        out_path: Where the rewritten graph goes.
        block: Channels per Hadamard block (a power of two >= 2).
        skip: MatMul names left as they are (those that stay float: the head, side paths).

    Returns:
        The rotated MatMuls, the rotations and the MatMuls whose width `block` does not divide.

    Raises:
        ValueError: `block` is not a power of two >= 2.
    """
    rotation = hadamard_matrix(block)
    onnx = require("onnx", extra="export")
    numpy_helper = onnx.numpy_helper
    model = onnx.load(str(source_path))
    graph = model.graph
    weights = {tensor.name: tensor for tensor in graph.initializer}
    targets = weight_matmuls(graph, skip)
    rotated = [node for node in targets if weights[node.input[1]].dims[0] % block == 0]
    done = Rotation(
        block=block, rotated=[node.name for node in rotated],
        rotations={node.input[0] + ROTATION_SUFFIX: int(weights[node.input[1]].dims[0])
                   for node in rotated},
        not_a_multiple=[node.name for node in targets if weights[node.input[1]].dims[0] % block])
    turned = {}
    for node in rotated:
        weight = numpy_helper.to_array(weights[node.input[1]]).astype(np.float64)
        # R is block-diagonal and symmetric: R @ W rotates each block of W's input rows
        turned[f"{node.name}{ROTATION_SUFFIX}/weight"] = (
            rotation @ weight.reshape(-1, block, weight.shape[1])).reshape(weight.shape)
        node.input[1] = f"{node.name}{ROTATION_SUFFIX}/weight"
    graph.initializer.extend([
        numpy_helper.from_array(rotation.astype(np.float32), f"hadamard_{block}"),
        numpy_helper.from_array(np.array([-1, block], np.int64), f"hadamard_{block}/rows"),
        *(numpy_helper.from_array(value.astype(np.float32), name) for name, value in turned.items())])
    _insert_rotations(model, rotated, block)
    drop_unused_initializers(graph)
    onnx.save(model, str(out_path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=f"{Path(out_path).name}.data")
    logger.info("inputs of %d of %d weight MatMuls rotated in blocks of %d (%d rotations)",
                len(done.rotated), len(targets), block, len(done.rotations))
    return done


def _insert_rotations(model: Any, rotated: list[Any], block: int) -> None:
    """Rotate each rotated MatMul's input once, just before the first node that reads it:
    Reshape to rows of `block` channels, MatMul by the block, Reshape back to the input's shape."""
    helper = require("onnx", extra="export").helper
    readers = {id(node) for node in rotated}
    sources = {node.input[0] for node in rotated}
    nodes: list[Any] = []
    for node in model.graph.node:
        if id(node) in readers:
            source = node.input[0]
            name = source + ROTATION_SUFFIX
            if source in sources:
                sources.discard(source)
                nodes += [
                    helper.make_node("Shape", [source], [f"{name}/shape"], name=f"{name}/shape"),
                    helper.make_node("Reshape", [source, f"hadamard_{block}/rows"],
                                     [f"{name}/rows"], name=f"{name}/rows"),
                    helper.make_node("MatMul", [f"{name}/rows", f"hadamard_{block}"],
                                     [f"{name}/turned"], name=name),
                    helper.make_node("Reshape", [f"{name}/turned", f"{name}/shape"], [name],
                                     name=f"{name}/back"),
                ]
            node.input[0] = name
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
