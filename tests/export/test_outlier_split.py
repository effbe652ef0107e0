"""Outlier input channels split off before OpenVINO static int8, on the tiny reranker: the rewrite
is exact in fp32, touches only what it should, and the int8 IR keeps the side paths in fp32."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from openvino_ir import quantize_tiny, quantized_matmuls

from onnxrank.engine.runtime import open_model_file
from onnxrank.export.outlier_split import SIDE_PATH_SUFFIX, split_outlier_channels
from onnxrank.export.quantize import head_projections
from onnxrank.export.quantize_openvino import OvInt8Settings

# a random tiny model has no 6x outliers; a low ratio makes the rewrite happen
RATIO = 1.5


def _weight_matmuls(path: Path) -> dict[str, onnx.NodeProto]:
    graph = onnx.load(str(path)).graph
    weights = {tensor.name for tensor in graph.initializer}
    return {node.name: node for node in graph.node
            if node.op_type == "MatMul" and node.input[1] in weights}


def test_the_split_graph_scores_as_the_fp32_graph_and_skips_what_it_is_told(
        tiny_model_dir: Path, calibration: list, validation_batch: dict, tmp_path: Path) -> None:
    fp32 = tiny_model_dir / "model.onnx"
    head = head_projections(fp32)
    skipped = sorted(_weight_matmuls(fp32))[0]
    out = tmp_path / "split.onnx"
    split = split_outlier_channels(fp32, out, calibration=calibration, ratio=RATIO,
                                   skip=[*head, skipped])
    assert split and skipped not in split and not set(head) & set(split)
    graph = onnx.load(str(out)).graph
    nodes = {node.name: node for node in graph.node}
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    for name, channels in split.items():
        side = nodes[name + SIDE_PATH_SUFFIX]
        # the side path multiplies only the outlier channels' weight rows
        assert onnx.numpy_helper.to_array(initializers[side.input[1]]).shape[0] == channels
        assert nodes[name].input[0] == f"{name}/kept"
    assert nodes[skipped].input[0] == _weight_matmuls(fp32)[skipped].input[0]
    assert not (tmp_path / f".probe-{out.name}").exists()

    plain = open_model_file(fp32, precision="fp32", threads=1).run(validation_batch)
    rewritten = open_model_file(out, precision="fp32", threads=1).run(validation_batch)
    np.testing.assert_allclose(rewritten, plain, atol=1e-5, rtol=0)


def test_the_int8_ir_keeps_the_side_paths_fp32_and_records_the_split(
        tiny_model_dir: Path, calibration: list, validation_batch: dict, plain_rung_record: dict,
        tmp_path: Path) -> None:
    record, out = quantize_tiny(tiny_model_dir, calibration, tmp_path, OvInt8Settings(
        fp32_head=True, fp32_ffn_down_layers=2, outlier_channel_ratio=RATIO))
    split = record["outlier_channels"]
    assert split["ratio"] == RATIO and split["channels_per_matmul"]
    sides = [name + SIDE_PATH_SUFFIX for name in split["channels_per_matmul"]]
    assert set(sides) <= set(record["nodes_kept_fp32"])
    # NNCF puts a FakeQuantize on the inputs of the MatMuls it quantizes, never on a side path's
    quantized_inputs = quantized_matmuls(out)
    assert quantized_inputs and not quantized_inputs & set(sides)
    assert set(split["channels_per_matmul"]) <= quantized_inputs
    # the down-projections and outlier channels in fp32 leave less int8 than the plain rung
    plain = plain_rung_record
    assert plain["outlier_channels"] is None
    assert not any(name.endswith(SIDE_PATH_SUFFIX) for name in plain["nodes_kept_fp32"])
    shares = [record["int8_gemm_flops_share"]["share"] for record in (record, plain)]
    assert 0 < shares[0] < shares[1] < 1, shares
    assert not list(tmp_path.glob(".ov-int8-*"))  # the split graph was scratch
    runner = open_model_file(out, backend="openvino", precision="int8", threads=1)
    scores = runner.run(validation_batch)
    assert np.isfinite(scores).all() and scores.std() > 0


@pytest.mark.parametrize("ratio", [1.0, 0.5, -2.0])
def test_a_ratio_must_be_above_one(ratio: float) -> None:
    with pytest.raises(ValueError,
                       match=re.escape(f"outlier_channel_ratio must be None or > 1, got {ratio}")):
        OvInt8Settings(outlier_channel_ratio=ratio)


@pytest.mark.parametrize(("rows", "ratio", "message"), [
    (0, 6.0, "splitting outlier channels needs calibration rows; got none"),
    (1, 1.0, "ratio must be > 1, got 1.0")])
def test_the_split_refuses_no_rows_and_a_ratio_of_one_or_less(
        tiny_model_dir: Path, calibration: list, tmp_path: Path, rows: int, ratio: float,
        message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        split_outlier_channels(tiny_model_dir / "model.onnx", tmp_path / "split.onnx",
                               calibration=calibration[:rows], ratio=ratio, skip=())
    assert not list(tmp_path.iterdir())
