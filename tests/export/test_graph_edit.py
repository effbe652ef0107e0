"""The graph rewrites' shared reading and cleanup, on a hand-built ONNX graph."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from onnxrank.export.graph_edit import drop_unused_initializers, tensor_readers, weight_matmuls


def _graph() -> object:
    weight = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    other = numpy_helper.from_array(np.ones((4, 4), np.float32), "w2")
    vector = numpy_helper.from_array(np.ones(4, np.float32), "v")
    unread = numpy_helper.from_array(np.ones((4, 4), np.float32), "unread")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"], name="first"),
        helper.make_node("MatMul", ["a", "x"], ["b"], name="two_activations"),
        helper.make_node("MatMul", ["b", "v"], ["c"], name="vector_weight"),
        helper.make_node("MatMul", ["b", "w2"], ["d"], name="second"),
        helper.make_node("Add", ["c", "d"], ["y"], name="add"),
    ]
    return helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[weight, other, vector, unread])


def test_weight_matmuls_are_those_with_a_2d_initializer_in_graph_order() -> None:
    graph = _graph()
    assert [node.name for node in weight_matmuls(graph)] == ["first", "second"]
    assert [node.name for node in weight_matmuls(graph, skip={"first"})] == ["second"]


def test_only_the_initializers_no_node_reads_are_dropped() -> None:
    graph = _graph()
    drop_unused_initializers(graph)
    assert [tensor.name for tensor in graph.initializer] == ["w", "w2", "v"]


def test_tensor_readers_map_each_tensor_to_the_nodes_that_read_it_in_graph_order() -> None:
    readers = {name: [node.name for node in nodes]
               for name, nodes in tensor_readers(_graph()).items()}
    assert readers == {"x": ["first", "two_activations"], "w": ["first"],
                       "a": ["two_activations"], "b": ["vector_weight", "second"],
                       "v": ["vector_weight"], "w2": ["second"], "c": ["add"], "d": ["add"]}
