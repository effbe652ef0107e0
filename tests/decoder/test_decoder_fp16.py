"""The fp16 variant of every built-in recipe's tiny export (recipe_model_dir, fp16 among its variants):
its two files and manifest entries, what stays float32 in them, and its scores on the CPU
against the fp32 export's: the whole rows run by OpenVINO, the prefix graph by onnxruntime's CPU
provider (OpenVINO's compiled prefix graph names its cache input after the converter's Cast,
``graph_input_cast_0``, which the engine does not feed)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from onnxrank.engine.runtime import open_model_file
from onnxrank.engine.spec import load_model_spec, verify_files
from onnxrank.engine.variants import VARIANTS, RunAs
from onnxrank.export import gate
from onnxrank.export.tasks import RERANK
from onnxrank.export.validate import encode_validation, load_validation_pairs, run_batches

# OpenVINO runs the fp16 file's float16 weights and casts in float32 arithmetic: its scores may
# differ from the fp32 file's by this share of their standard deviation (measured: up to 0.004)
FP16_TOLERANCE = 0.02
# the float32 input and output types (the prefix cache too) and the int64 token inputs
FLOAT, INT64, FLOAT16 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64, onnx.TensorProto.FLOAT16


def _types(values: object) -> dict[str, int]:
    return {value.name: value.type.tensor_type.elem_type for value in values}  # type: ignore[attr-defined]


def _node_types(graph: onnx.GraphProto) -> dict[str, int]:
    """Node name -> the element type of its first output (from the file's value types)."""
    types = {**_types(graph.value_info), **_types(graph.output), **_types(graph.input),
             **{tensor.name: tensor.data_type for tensor in graph.initializer}}
    return {node.name: types.get(node.output[0], 0) for node in graph.node}


def test_the_fp16_export_writes_both_graphs_and_records_them(recipe_name: str,
                                                             recipe_model_dir: Path) -> None:
    spec = load_model_spec(recipe_model_dir)
    facts = VARIANTS["fp16"]
    assert "fp16" not in spec.failed_variants, spec.failed_variants
    variant, prefix = spec.variants["fp16"], spec.prefix_graphs["fp16"]
    assert (variant.file, prefix.file) == ("model_fp16.onnx", "model_prefix_fp16.onnx")
    assert (variant.precision, prefix.precision, facts.prefix_file) == (
        "fp16", "fp16", "model_prefix_fp16.onnx")
    # onnxruntime 1.32's CPU provider runs these files, so both are validated here
    assert variant.fidelity["validated"] is True and prefix.fidelity["passed"] is True
    assert variant.extra_files == {} and prefix.extra_files == {}  # tiny: under 2 GB
    kept = variant.optimization["float16"]["nodes_kept_fp32"]
    assert kept["family"] == ["/score_head/MatMul"] and kept["norm_variance"] > 0, recipe_name
    verify_files(spec, recipe_model_dir)


@pytest.mark.parametrize("file", ["model_fp16.onnx", "model_prefix_fp16.onnx"])
def test_fp16_keeps_io_types_norm_variance_and_score_head_in_float32(
        recipe_name: str, recipe_model_dir: Path, file: str) -> None:
    graph = onnx.load(str(recipe_model_dir / file)).graph
    fp32_graph = onnx.load(str(recipe_model_dir / file.replace("_fp16", ""))).graph
    assert _types(graph.input) == _types(fp32_graph.input)
    assert _types(graph.output) == _types(fp32_graph.output)
    assert set(_types(graph.input).values()) <= {FLOAT, INT64}
    assert set(_types(graph.output).values()) == {FLOAT}
    types = _node_types(graph)
    ops = {node.name: node.op_type for node in graph.node}
    variance = [name for name, op in ops.items()
                if op in ("Pow", "ReduceMean", "Sqrt") and "norm" in name]
    # every RMS norm (Qwen3: input, post-attention, q, k per layer, then the final one)
    assert len([name for name in variance if ops[name] == "Pow"]) >= 5, recipe_name
    assert {types[name] for name in variance} == {FLOAT}, recipe_name
    assert types["/score_head/MatMul"] == FLOAT
    matmuls = {types[name] for name, op in ops.items()
               if op == "MatMul" and "/layers." in name}
    assert matmuls == {FLOAT16}, recipe_name
    assert {types[name] for name, op in ops.items() if op in ("Cos", "Sin")} == {FLOAT}


def test_fp16_scores_on_the_cpu_match_fp32_whole_rows_and_prefix(
        recipe_name: str, recipe_model_dir: Path) -> None:
    spec = load_model_spec(recipe_model_dir)
    inputs = encode_validation(load_validation_pairs(16), recipe_model_dir / spec.tokenizer_file,
                               task=RERANK, max_length=spec.max_length,
                               pad_id=spec.pad_token_id, prompt=spec.prompt)

    def whole_rows(file: str) -> np.ndarray:
        runner = open_model_file(recipe_model_dir / file, backend="openvino", precision="fp32")
        return run_batches(inputs.batches(), runner.run, len(inputs.rows))

    fp32, fp16 = whole_rows("model.onnx"), whole_rows("model_fp16.onnx")
    spread = float(fp32.std())
    whole_diff = float(np.abs(fp16 - fp32).max())
    # the prefix graph run as the engine runs it: each query's prefix once, its rows against it
    context = SimpleNamespace(inputs=inputs, paths={"fp16": recipe_model_dir / "model_fp16.onnx"})
    prefix, batches, _ = gate._prefix_outputs(context, "fp16",  # type: ignore[arg-type]
                                              recipe_model_dir / "model_prefix_fp16.onnx",
                                              RunAs("onnxruntime", "fp16"))
    assert {batch.prefix_length for batch in batches} != {0}  # the prefix graph really ran
    prefix_diff = float(np.abs(prefix - fp32).max())
    print(f"{recipe_name}: fp16 - fp32 max |diff| whole rows (OpenVINO) {whole_diff:.3g}, "
          f"prefix graph (onnxruntime CPU) {prefix_diff:.3g}, spread {spread:.3g}")
    assert max(whole_diff, prefix_diff) <= FP16_TOLERANCE * spread, (
        f"{recipe_name}: fp16 differs from fp32 by {whole_diff:.3g} (whole rows) and "
        f"{prefix_diff:.3g} (prefix graph), above {FP16_TOLERANCE} x the spread {spread:.3g}")
