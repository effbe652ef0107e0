"""Position 0 split off before static int8 (OpenVINO) and per-row int8 (onnxruntime), on the tiny
reranker: the rewrite is exact in fp32, carries the halves through the feed-forward block, leaves
the pruned last layer whole, and both int8 files keep position 0 float."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from openvino_ir import int8_fp32_correlation, quantize_tiny, quantized_matmuls

from onnxrank.engine.runtime import open_model_file
from onnxrank.export.cls_row_split import SIDE_PATH_SUFFIX, split_cls_row
from onnxrank.export.quantize import (
    Int8Settings,
    ffn_down_projections,
    head_projections,
    quantize_int8,
)
from onnxrank.export.quantize_openvino import OvInt8Settings

# a random tiny model has no massive [CLS] activations; ratio 0 splits every MatMul that sees
# every position
EVERY_MATMUL = 0.0


def _weight_matmuls(path: Path) -> list[str]:
    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {tensor.name for tensor in graph.initializer}
    return [node.name for node in graph.node if node.op_type == "MatMul" and node.input[1] in weights]


def test_the_split_graph_scores_as_the_fp32_graph(
        tiny_model_dir: Path, calibration: list, validation_batch: dict, tmp_path: Path) -> None:
    fp32 = tiny_model_dir / "model.onnx"
    head = head_projections(fp32)
    out = tmp_path / "split.onnx"
    done = split_cls_row(fp32, out, calibration=calibration, ratio=EVERY_MATMUL, skip=head)
    matmuls = [name for name in _weight_matmuls(fp32) if name not in head]
    # the tiny model's last layer is pruned to [CLS] (onnxrank.export.prune): its query, attention
    # output and feed-forward products see one row per pair; its keys and values every row
    assert done.first_row_only and all("layer.1/" in name for name in done.first_row_only)
    assert sorted(done.split + done.first_row_only) == sorted(matmuls)
    assert any("layer.1/" in name and "key" in name for name in done.split)
    graph = onnx.load(str(out)).graph
    nodes = {node.name: node for node in graph.node}
    producer = {output: node for node in graph.node for output in node.output}
    for name in done.split:
        assert nodes[name].input[0].endswith("/rest_rows")
        assert nodes[name + SIDE_PATH_SUFFIX].input[0].endswith("/first_rows")
    # no join inside the first layer's feed-forward block: its down-projection reads the rest
    # rows of the GELU, not a slice of a joined tensor
    down = next(name for name in ffn_down_projections(fp32) if "layer.0/" in name)
    assert producer[nodes[down].input[0]].op_type != "Slice"
    assert not (tmp_path / f".probe-{out.name}").exists()

    plain = open_model_file(fp32, precision="fp32", threads=1).run(validation_batch)
    rewritten = open_model_file(out, precision="fp32", threads=1).run(validation_batch)
    np.testing.assert_allclose(rewritten, plain, atol=1e-5, rtol=0)


def test_the_ratio_picks_the_matmuls_whose_range_position_0_sets(
        tiny_model_dir: Path, calibration: list, tmp_path: Path) -> None:
    fp32 = tiny_model_dir / "model.onnx"
    every = split_cls_row(fp32, tmp_path / "every.onnx", calibration=calibration,
                          ratio=EVERY_MATMUL, skip=())
    none = split_cls_row(fp32, tmp_path / "none.onnx", calibration=calibration, ratio=1e6, skip=())
    assert none.split == [] and none.first_row_only == every.first_row_only
    # with nothing split the graph is the input's, node for node
    assert ([node.op_type for node in onnx.load(str(tmp_path / "none.onnx")).graph.node]
            == [node.op_type for node in onnx.load(str(fp32)).graph.node])


def test_the_int8_ir_keeps_position_0_float_and_records_the_split(
        tiny_model_dir: Path, calibration: list, validation_batch: dict, plain_rung_record: dict,
        tmp_path: Path) -> None:
    fp32 = tiny_model_dir / "model.onnx"
    record, out = quantize_tiny(tiny_model_dir, calibration, tmp_path,
                                OvInt8Settings(fp32_head=True, cls_row_ratio=EVERY_MATMUL))
    split = record["float_cls_row"]
    assert split["ratio"] == EVERY_MATMUL and split["split"] and split["first_row_only"]
    sides = [name + SIDE_PATH_SUFFIX for name in split["split"]]
    assert set(sides + split["first_row_only"]) <= set(record["nodes_kept_fp32"])
    quantized = quantized_matmuls(out)
    assert set(split["split"]) <= quantized
    assert not quantized & set(sides + split["first_row_only"])
    # position 0 and the pruned layer's one-row products stay float: less int8 than the plain rung
    assert plain_rung_record["float_cls_row"] is None
    shares = [entry["int8_gemm_flops_share"]["share"] for entry in (record, plain_rung_record)]
    assert 0 < shares[0] < shares[1], shares
    assert not list(tmp_path.glob(".ov-int8-*"))
    assert int8_fp32_correlation(out, fp32, validation_batch) > 0.9


@pytest.mark.parametrize(("settings", "message"), [
    ({"cls_row_ratio": -1.0}, "cls_row_ratio must be None or >= 0, got -1.0"),
    ({"cls_row_ratio": 1.0, "outlier_channel_ratio": 6.0},
     "cls_row_ratio and outlier_channel_ratio are two rewrites of the same MatMuls; a recipe "
     "takes one")])
def test_settings_refuse_a_negative_ratio_and_two_rewrites(settings: dict, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        OvInt8Settings(**settings)


def test_the_split_refuses_rows_of_one_token_and_a_negative_ratio(
        tiny_model_dir: Path, calibration: list, tmp_path: Path) -> None:
    fp32 = tiny_model_dir / "model.onnx"
    one_token = [{name: value[:, :1] for name, value in calibration[0].items()}]
    with pytest.raises(ValueError, match=re.escape(
            "splitting position 0 off needs calibration rows of at least 2 tokens; got none")):
        split_cls_row(fp32, tmp_path / "split.onnx", calibration=one_token, ratio=1.0, skip=())
    with pytest.raises(ValueError, match=re.escape("ratio must be >= 0, got -0.5")):
        split_cls_row(fp32, tmp_path / "split.onnx", calibration=calibration, ratio=-0.5, skip=())
    assert not list(tmp_path.iterdir())


def test_per_row_int8_keeps_position_0_float_and_counts_it(
        tiny_model_dir: Path, calibration: list, validation_batch: dict, tmp_path: Path) -> None:
    """The onnxruntime int8 ladder's first rung: MatMulNBits on every row but position 0, whose
    products (and the pruned layer's one-row products) stay float MatMuls."""
    fp32 = tiny_model_dir / "model.onnx"
    head = dict.fromkeys(head_projections(fp32), "head")
    plain = quantize_int8(fp32_path=fp32, opt_path=None, out_path=tmp_path / "plain.onnx",
                          settings=Int8Settings("per_row"), keep_fp32=head)
    out = tmp_path / "split.onnx"
    record = quantize_int8(fp32_path=fp32, opt_path=None, out_path=out, calibration=calibration,
                           settings=Int8Settings("per_row", cls_row_ratio=EVERY_MATMUL),
                           keep_fp32=head)
    split = record["float_cls_row"]
    assert plain["float_cls_row"] is None
    assert split["ratio"] == EVERY_MATMUL and split["split"] and split["first_row_only"]
    kinds = {node.name: node.op_type for node in onnx.load(str(out)).graph.node}
    assert {kinds[name] for name in split["split"]} == {"MatMulNBits"}
    sides = [name + SIDE_PATH_SUFFIX for name in split["split"]]
    assert {kinds[name] for name in sides + split["first_row_only"]} == {"MatMul"}
    assert set(sides + split["first_row_only"]) <= set(record["nodes_kept_fp32"])
    assert record["quantized_nodes"] == plain["quantized_nodes"] - len(split["first_row_only"])
    # the float products' weights are stored in fp16 and cast to fp32 where read: computed in
    # fp32, half the bytes on disk
    graph = onnx.load(str(out)).graph
    stored = {tensor.name: tensor.data_type for tensor in graph.initializer}
    nodes = {node.name: node for node in graph.node}
    for name in sides + split["first_row_only"]:
        (cast,) = [node for node in graph.node if node.output[0] == nodes[name].input[1]]
        assert cast.op_type == "Cast" and stored[cast.input[0]] == onnx.TensorProto.FLOAT16
        assert cast.input[0] in record["float_weights_stored_fp16"]["tensors"]
    assert record["float_weights_stored_fp16"]["bytes_saved"] == sum(
        2 * int(np.prod(tensor.dims)) for tensor in graph.initializer
        if tensor.data_type == onnx.TensorProto.FLOAT16)
    shares = [entry["int8_gemm_flops_share"]["share"] for entry in (record, plain)]
    assert 0 < shares[0] < shares[1], shares
    assert not list(tmp_path.glob(".per-row-*"))  # the split graph was scratch
    scores = open_model_file(out, precision="int8", threads=1).run(validation_batch)[:, 0]
    reference = open_model_file(fp32, precision="fp32", threads=1).run(validation_batch)[:, 0]
    assert np.corrcoef(scores, reference)[0, 1] > 0.99


def test_per_row_position_0_needs_calibration_rows_and_the_per_row_method(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape(
            "per-row int8 with position 0 in float needs calibration rows")):
        quantize_int8(fp32_path=tiny_model_dir / "model.onnx", opt_path=None,
                      out_path=tmp_path / "int8.onnx",
                      settings=Int8Settings("per_row", cls_row_ratio=1.0))
    for ratio in (1.0, 0.0):  # 0 is a ratio (split every MatMul), not "unset"
        with pytest.raises(ValueError, match=re.escape(
                "cls_row_ratio applies to the per_row method only, got method='dynamic'")):
            Int8Settings("dynamic", cls_row_ratio=ratio)
    with pytest.raises(ValueError, match=re.escape("cls_row_ratio must be None or >= 0, got -1")):
        Int8Settings("per_row", cls_row_ratio=-1)
