"""Weight MatMul inputs rotated by block Hadamard matrices before OpenVINO static int8, on the tiny
reranker (hidden 64, intermediate 128): the rewrite is exact in fp32, alone and after the
position-0 split, one rotation serves the MatMuls that share an input, and the int8 IR quantizes
the rotated products and leaves the rotations float."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from openvino_ir import int8_fp32_correlation, quantize_tiny, quantized_matmuls

from onnxrank.engine.runtime import open_model_file
from onnxrank.export.cls_row_split import SIDE_PATH_SUFFIX, split_cls_row
from onnxrank.export.hadamard_rotation import ROTATION_SUFFIX, hadamard_matrix, rotate_matmul_inputs
from onnxrank.export.quantize import ffn_down_projections, head_projections
from onnxrank.export.quantize_openvino import OvInt8Settings


def _scores(path: Path, batch: dict) -> np.ndarray:
    return open_model_file(path, precision="fp32", threads=1).run(batch)


@pytest.mark.parametrize("block", [2, 16, 128])
def test_a_hadamard_block_is_orthonormal_and_symmetric(block: int) -> None:
    matrix = hadamard_matrix(block)
    np.testing.assert_allclose(matrix @ matrix, np.eye(block), atol=1e-12)
    np.testing.assert_array_equal(matrix, matrix.T)
    # every entry has the same magnitude: one channel is spread evenly over its block
    np.testing.assert_allclose(np.abs(matrix), 1 / np.sqrt(block))


@pytest.mark.parametrize("block", [0, 1, 12, -4])
def test_a_block_that_is_not_a_power_of_two_is_refused(block: int) -> None:
    with pytest.raises(ValueError, match=re.escape(
            f"a Hadamard block is a power of two >= 2, got {block}")):
        hadamard_matrix(block)


def test_the_rotated_graph_scores_as_the_fp32_graph(
        tiny_model_dir: Path, validation_batch: dict, tmp_path: Path) -> None:
    fp32 = tiny_model_dir / "model.onnx"
    head = head_projections(fp32)
    out = tmp_path / "rotated.onnx"
    done = rotate_matmul_inputs(fp32, out, block=16, skip=head)
    graph = onnx.load(str(out)).graph
    nodes = {node.name: node for node in graph.node}
    original = onnx.load(str(fp32), load_external_data=False).graph
    weights = {tensor.name for tensor in original.initializer}
    matmuls = [node for node in original.node if node.op_type == "MatMul" and node.input[1] in weights
               and node.name not in head]
    assert done.block == 16 and done.not_a_multiple == []
    assert done.rotated == [node.name for node in matmuls]
    # one rotation per input tensor: a layer's query, key and value share theirs
    assert sorted(done.rotations) == sorted({node.input[0] + ROTATION_SUFFIX for node in matmuls})
    assert len(done.rotations) < len(done.rotated)
    for name in done.rotated:
        assert nodes[name].input[0] in done.rotations
        assert nodes[name].input[1] == f"{name}{ROTATION_SUFFIX}/weight"
    assert all(nodes[name].op_type == "MatMul" for name in done.rotations)
    # the down-projection's rotation is as wide as the intermediate layer
    down = next(name for name in ffn_down_projections(fp32) if "layer.0/" in name)
    assert done.rotations[nodes[down].input[0]] == 128
    # the original weights no rotated MatMul reads any more are gone
    assert not {node.input[1] for node in matmuls} & {tensor.name for tensor in graph.initializer}
    np.testing.assert_allclose(_scores(out, validation_batch), _scores(fp32, validation_batch),
                               atol=5e-5, rtol=0)  # float32 rounding of the extra products


def test_inputs_the_block_does_not_divide_are_left_and_recorded(
        tiny_model_dir: Path, validation_batch: dict, tmp_path: Path) -> None:
    fp32 = tiny_model_dir / "model.onnx"
    out = tmp_path / "rotated.onnx"
    done = rotate_matmul_inputs(fp32, out, block=128, skip=head_projections(fp32))
    # only the down-projections read 128 channels; every other input is 64 wide
    assert sorted(done.rotated) == sorted(ffn_down_projections(fp32))
    assert done.not_a_multiple and not set(done.not_a_multiple) & set(done.rotated)
    np.testing.assert_allclose(_scores(out, validation_batch), _scores(fp32, validation_batch),
                               atol=5e-5, rtol=0)  # float32 rounding of the extra products


def test_after_the_position_0_split_only_the_int8_halves_are_rotated(
        tiny_model_dir: Path, calibration: list, validation_batch: dict, tmp_path: Path) -> None:
    fp32 = tiny_model_dir / "model.onnx"
    head = head_projections(fp32)
    split_path = tmp_path / "split.onnx"
    split = split_cls_row(fp32, split_path, calibration=calibration, ratio=0.0, skip=head)
    floats = head + [name + SIDE_PATH_SUFFIX for name in split.split] + split.first_row_only
    out = tmp_path / "rotated.onnx"
    done = rotate_matmul_inputs(split_path, out, block=16, skip=floats)
    assert sorted(done.rotated) == sorted(split.split)
    assert all(source.endswith(f"/rest_rows{ROTATION_SUFFIX}") for source in done.rotations)
    np.testing.assert_allclose(_scores(out, validation_batch), _scores(fp32, validation_batch),
                               atol=5e-5, rtol=0)  # float32 rounding of the extra products


def test_the_int8_ir_quantizes_the_rotated_products_and_records_the_rotation(
        tiny_model_dir: Path, calibration: list, validation_batch: dict, plain_rung_record: dict,
        tmp_path: Path) -> None:
    fp32 = tiny_model_dir / "model.onnx"
    # the ladder's rotated rung, position 0 split off wherever it is (a random tiny model has no
    # massive [CLS] activations)
    record, out = quantize_tiny(tiny_model_dir, calibration, tmp_path, OvInt8Settings(
        fp32_head=True, cls_row_ratio=0.0, smooth_quant_alpha=-1.0, hadamard_block=16))
    rotation = record["hadamard_rotation"]
    assert rotation["block"] == 16 and rotation["not_a_multiple_of_block"] == []
    assert set(rotation["rotation_input_widths"]) <= set(record["nodes_kept_fp32"])
    quantized = quantized_matmuls(out)
    assert set(rotation["rotated"]) <= quantized
    assert not quantized & set(rotation["rotation_input_widths"])
    # the float position-0 rows and rotations lower the int8 share below the plain rung's
    assert plain_rung_record["hadamard_rotation"] is None
    shares = [entry["int8_gemm_flops_share"]["share"] for entry in (record, plain_rung_record)]
    assert 0 < shares[0] < shares[1], shares
    assert not list(tmp_path.glob(".ov-int8-*"))
    assert int8_fp32_correlation(out, fp32, validation_batch) > 0.9


@pytest.mark.parametrize(("settings", "message"), [
    ({"hadamard_block": 24}, "a Hadamard block is a power of two >= 2, got 24"),
    ({"hadamard_block": 16, "outlier_channel_ratio": 6.0},
     "hadamard_block and outlier_channel_ratio both rewrite what the int8 path reads; a recipe "
     "takes one")])
def test_settings_refuse_a_bad_block_and_two_rewrites(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        OvInt8Settings(**settings)
