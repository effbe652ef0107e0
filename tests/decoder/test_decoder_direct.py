"""The weight-compressed route (onnxrank.export.direct_openvino): ``--variants ov_int8`` of a
decoder converts the checkpoint, in its own dtype, straight to the int8 IR and its prefix
graph, with no fp32 file; its scores are the traced route's ov_int8's; a bfloat16 checkpoint
converts from bfloat16 and keeps u8 weights; and the reference is float32 arithmetic on the
checkpoint's weights (the memory check of the route: test_decoder_memory.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from built_once import built_once
from decoder_commands import export_decoder

from onnxrank.engine.reranker import Reranker
from onnxrank.engine.spec import load_model_spec
from onnxrank.export.validate import load_validation_pairs

pytestmark = pytest.mark.costly(50)

SCORE_HEAD_OP = "__module.score_head/aten::linear/MatMul"
INT8_IR = {"device": "cpu", "backend": "openvino", "precision": "int8", "threads": 1,
           "pad_to_multiple": 8}


def _export(checkpoint: Path, out: Path, *extra: str) -> None:
    """decoder_model_dir's export (tests/decoder/conftest.py), so the two routes' files compare,
    of ov_int8 alone."""
    export_decoder(checkpoint, "qwen3-reranker", out, "--variants", "ov_int8", *extra)


@pytest.fixture(scope="session")
def direct_model_dir(decoder_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`onnxrank export --model DIR --recipe qwen3-reranker --variants ov_int8`."""
    return built_once(tmp_path_factory, "models/qwen3-tiny-direct",
                      lambda out: _export(decoder_checkpoint, out))


@pytest.fixture(scope="session")
def bf16_checkpoint(decoder_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint saved in bfloat16, as the published Qwen3-Reranker checkpoints are."""

    def build(out: Path) -> None:
        import torch
        import transformers

        shutil.copytree(decoder_checkpoint, out)
        model = transformers.AutoModelForCausalLM.from_pretrained(decoder_checkpoint)
        model.to(torch.bfloat16).save_pretrained(out)

    return built_once(tmp_path_factory, "checkpoints/qwen3-tiny-bf16", build)


def _pairs() -> list[tuple[str, str]]:
    return [(pair.query, pair.passage) for pair in load_validation_pairs(24, part="held_out")]


def test_the_route_writes_the_int8_ir_and_its_prefix_graph_alone(direct_model_dir: Path) -> None:
    spec = load_model_spec(direct_model_dir)
    assert set(spec.variants) == {"ov_int8"} and set(spec.prefix_graphs) == {"ov_int8"}
    assert not list(direct_model_dir.glob("*.onnx*")), "the route wrote an ONNX file"
    record = spec.variants["ov_int8"].quantization
    assert record is not None
    assert record["source_variant"].startswith("the PyTorch checkpoint in float32")
    assert record["nodes_kept_fp32"] == record["ops_kept_fp32"] == [SCORE_HEAD_OP]
    assert spec.prefix_graphs["ov_int8"].fidelity["passed"] is True
    import openvino

    model = openvino.Core().read_model(str(direct_model_dir / "model_ov_int8.xml"))
    assert [port.get_any_name() for port in model.inputs] == ["input_ids", "attention_mask"]
    (head,) = [op for op in model.get_ordered_ops() if op.get_friendly_name() == SCORE_HEAD_OP]
    weight = head.input_value(1).get_node()
    assert weight.get_type_name() == "Constant" and weight.get_element_type() == openvino.Type.f32


def test_its_scores_are_the_traced_routes_int8_scores(direct_model_dir: Path,
                                                     decoder_model_dir: Path) -> None:
    """Both routes compress the same weights the same way: only the converter differs."""
    assert "ov_int8" in load_model_spec(decoder_model_dir).variants
    direct = Reranker.from_dir(direct_model_dir, **INT8_IR)
    traced = Reranker.from_dir(decoder_model_dir, **INT8_IR)
    assert direct.uses_prefix_graph and traced.uses_prefix_graph
    pairs = _pairs()
    expected = traced.score(pairs)
    assert np.abs(direct.score(pairs) - expected).max() <= 1e-3 * expected.std()
    # with no fp32 file, the engine's own choice is among the IR's runs
    default = Reranker.from_dir(direct_model_dir, device="cpu", threads=1)
    assert (default.device_info.backend, default.device_info.variant) == ("openvino", "ov_int8")
    assert default.uses_prefix_graph


def test_a_bfloat16_checkpoint_converts_in_bfloat16(bf16_checkpoint: Path,
                                                    decoder_model_dir: Path,
                                                    tmp_path: Path) -> None:
    out = tmp_path / "qwen3-tiny-bf16"
    # int8 of this tiny random model sits at the floor (its held-out group: 0.976 from the
    # bfloat16 weights; 0.979 from the float32 ones at 256 tokens): this test is the route's
    _export(bf16_checkpoint, out, "--int8-min-spearman", "0.95",
            "--int8-min-spearman-per-query", "0.95")
    spec = load_model_spec(out)
    record = spec.variants["ov_int8"].quantization
    assert record is not None
    assert record["source_variant"].startswith("the PyTorch checkpoint in bfloat16")
    assert record["reference"] == "the PyTorch checkpoint's bfloat16 weights in float32 arithmetic"
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    # the CPU plugin keeps the weights int8: every projection is a FullyConnected with u8
    # weights (a bfloat16 graph would decompress them all at compile time instead)
    import openvino

    compiled = openvino.Core().compile_model(str(out / "model_ov_int8.xml"), "CPU",
                                             {"INFERENCE_PRECISION_HINT": "f32"})
    weights = [op.input(1).get_element_type().get_type_name()
               for op in compiled.get_runtime_model().get_ordered_ops()
               if op.get_rt_info()["layerType"].astype(str) in ("FullyConnected", "MatMul")
               and op.get_input_size() > 1]
    projections = 2 * (4 + 3)  # 2 layers of q, k, v, o and the gated block's three
    assert weights.count("u8") == projections, weights
    # bfloat16 weights, then int8: the ranking of the float32 checkpoint's int8 IR survives
    pairs = _pairs()
    expected = Reranker.from_dir(decoder_model_dir, **INT8_IR).score(pairs)
    scores = Reranker.from_dir(out, **INT8_IR).score(pairs)
    assert np.corrcoef(scores, expected)[0, 1] >= 0.99


def test_the_reference_of_a_bfloat16_checkpoint_is_its_weights_in_float32(
        bf16_checkpoint: Path) -> None:
    """What the converted IR computes: bfloat16 weights, float32 arithmetic, with no float32
    copy of the model (each module is upcast while it runs, then put back)."""
    import torch
    import transformers

    from onnxrank.export.families.decoder import reference_runner

    def load(dtype: str) -> Any:
        return transformers.AutoModelForCausalLM.from_pretrained(
            bf16_checkpoint, attn_implementation="eager", dtype=dtype).eval()

    sixteen_bit, upcast = load("auto"), load("float32")
    assert sixteen_bit.dtype == torch.bfloat16 and upcast.dtype == torch.float32
    feeds = {"input_ids": np.array([[5, 17, 40, 9, 3], [8, 12, 30, 0, 0]]),
             "attention_mask": np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])}
    scores = reference_runner(sixteen_bit, answer_ids=(5, 6), weights=(1.0, -1.0))(feeds)
    expected = reference_runner(upcast, answer_ids=(5, 6), weights=(1.0, -1.0))(feeds)
    assert np.abs(scores - expected).max() <= 1e-5
    assert {parameter.dtype for parameter in sixteen_bit.parameters()} == {torch.bfloat16}


def test_the_graphs_trace_without_a_warning_or_a_transformers_notice(
        decoder_checkpoint: Path, tmp_path: Path) -> None:
    """What an export's tracing prints to a user: nothing. torch.onnx's and the tracer's warnings
    are silenced where the graphs are traced, and transformers 5's notice about the config's
    ``loss_type=None`` (the tracer reads the model's ``loss_function`` property) is kept out of
    openvino.convert_model."""
    import logging
    import warnings

    import transformers

    from onnxrank.export.families.decoder import (
        convert_prefix_graph,
        convert_score_graph,
        export_prefix_graph,
        export_score_graph,
        prefix_cache_graph,
        score_graph,
    )

    model = transformers.AutoModelForCausalLM.from_pretrained(
        decoder_checkpoint, attn_implementation="eager").eval()
    answers = {"answer_ids": (5, 6), "weights": (1.0, -1.0)}
    logging.Logger.warning_once.cache_clear()  # transformers' notices print once per process
    notices: list[str] = []
    # transformers logs through its own handler, bound to the stderr of its first import
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: notices.append(record.getMessage())  # type: ignore[method-assign]
    library = logging.getLogger("transformers")
    library.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            convert_score_graph(score_graph(model, **answers))
            convert_prefix_graph(prefix_cache_graph(model, **answers))
            export_score_graph(score_graph(model, **answers), tmp_path / "model.onnx", opset=17)
            export_prefix_graph(prefix_cache_graph(model, **answers),
                                tmp_path / "model_prefix.onnx", opset=17)
    finally:
        library.removeHandler(handler)
    assert [str(warning.message) for warning in seen] == []
    assert notices == []
