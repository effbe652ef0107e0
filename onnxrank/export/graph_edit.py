"""What the graph rewrites before int8 share: which MatMuls carry a weight, which nodes read a
tensor, and the cleanup of weights nothing reads any more (cls_row_split, outlier_split,
hadamard_rotation, quantize_rows; optimize and quantize read the graph the same way)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any


def weight_matmuls(graph: Any, skip: Collection[str] = ()) -> list[Any]:
    """The MatMul nodes of an ONNX graph whose second input is a 2-d initializer (a weight), in
    graph order, less those named in `skip`."""
    weights = {tensor.name for tensor in graph.initializer if len(tensor.dims) == 2}
    return [node for node in graph.node
            if node.op_type == "MatMul" and node.name not in skip and node.input[1] in weights]


def tensor_readers(graph: Any) -> dict[str, list[Any]]:
    """Tensor name -> the nodes of an ONNX graph that read it, in graph order."""
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def drop_unused_initializers(graph: Any) -> None:
    """Remove the initializers no node of `graph` reads (weights a rewrite replaced)."""
    used = {name for node in graph.node for name in node.input}
    kept = [tensor for tensor in graph.initializer if tensor.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
