"""The ceiling scenario's parts: model FLOPs from the graph, the GEMM kernels, the shares.

FLOPs are checked against torch's own FLOP counter on the checkpoint the tiny model was exported
from; every GEMM kernel against numpy on its own operands (so the ceiling times the real product).
No timing is asserted.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import openvino
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import AutoModelForSequenceClassification

from onnxrank import Reranker
from onnxrank.bench.ceiling import (
    ACTIVATION_RANGE,
    CEILING_SHAPES,
    CPU_ONLY_CEILING,
    GEMM_PATHS,
    WEIGHT_SCALE,
    ceiling_share,
    ceilings,
    ceilings_for,
    model_shapes,
    peak_share,
)
from onnxrank.bench.contenders import engine_settings
from onnxrank.bench.flops import model_flops
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.spec import load_model_spec
from onnxrank.errors import DeviceUnavailableError

HAS_BF16 = "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


@pytest.fixture(scope="module")
def flops(tiny_model_dir: Path):
    spec = load_model_spec(tiny_model_dir)
    return model_flops(tiny_model_dir / spec.variants["fp32"].file)


@pytest.mark.parametrize("tokens", [7, 64, 300])
def test_model_flops_match_torch_flop_counter(flops, tiny_checkpoint_dir: Path,
                                              tokens: int) -> None:
    # eager attention: torch's FLOP counter does not count the CPU SDPA kernel's products
    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_checkpoint_dir, attn_implementation="eager").eval()
    input_ids = torch.randint(1000, 2000, (1, tokens))
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
    expected = counter.get_total_flops()
    assert flops.pair(tokens) == pytest.approx(expected, rel=1e-9), (
        f"tiny-reranker at {tokens} tokens: graph count {flops.pair(tokens):.0f}, "
        f"torch FlopCounterMode {expected:.0f}")
    assert flops.pairs([tokens, tokens]) == pytest.approx(2 * expected, rel=1e-9)


def test_model_flops_read_the_architecture(flops, tiny_checkpoint_dir: Path) -> None:
    config = json.loads((tiny_checkpoint_dir / "config.json").read_text())
    assert (flops.hidden, flops.intermediate, flops.layers, flops.heads) == (
        config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"],
        config["num_attention_heads"])
    assert flops.attention_matmuls == 2 * config["num_hidden_layers"]


def test_model_shapes_follow_the_model(flops) -> None:
    shapes = {shape.name: shape for shape in model_shapes(flops)}
    hidden, inner, heads = flops.hidden, flops.intermediate, flops.heads
    assert [(s.batch, s.rows, s.inner, s.cols, s.weight) for s in shapes.values()] == [
        (1, 800, hidden, inner, True), (1, 800, inner, hidden, True),
        (1, 800, hidden, hidden, True),
        (8 * heads, 100, hidden // heads, 100, False), (8 * heads, 100, 100, hidden // heads, False),
    ]
    assert shapes["ffn_up"].ops == 2.0 * 800 * hidden * inner
    assert shapes["ffn_up"].describe() == f"800x{hidden}x{inner}"
    assert shapes["attention_scores"].describe() == f"{8 * heads} x 100x{hidden // heads}x100"


def _reference(path: str, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """What each path computes, in numpy."""
    if path == "ort_matmul_integer":
        return left.astype(np.int32) @ right.astype(np.int32)
    if path == "ort_dynamic_quantize_matmul":
        return left @ (right.astype(np.float32) * WEIGHT_SCALE)
    if path == "openvino_int8":
        step = 2 * ACTIVATION_RANGE / 255

        def quantize(values: np.ndarray) -> np.ndarray:
            clipped = np.clip(values, -ACTIVATION_RANGE, ACTIVATION_RANGE)
            return np.round((clipped + ACTIVATION_RANGE) / step) * step - ACTIVATION_RANGE

        weights = right.astype(np.float32) * WEIGHT_SCALE if right.dtype == np.int8 \
            else quantize(right)
        return quantize(left) @ weights
    return left @ right


# fp32 paths agree to float rounding; quantized and bf16 ones to their precision.
TOLERANCE = {"ort_matmul_integer": 0.0, "ort_dynamic_quantize_matmul": 0.02,
             "openvino_int8": 0.02, "openvino_bf16": 0.02, "ort_matmul_fp32": 1e-5,
             "openvino_fp32": 1e-5}


@pytest.mark.parametrize("path", GEMM_PATHS, ids=lambda path: path.name)
def test_every_gemm_kernel_computes_the_product(flops, path) -> None:
    checked = 0
    for shape in model_shapes(flops):
        if path.shapes is not None and shape.name not in path.shapes:
            continue
        try:
            kernel = path.build(shape, 1)
        except DeviceUnavailableError as err:
            # OpenVINO's refusals: no bf16 on this CPU, or no int8 kernel for attention's shapes
            assert path.name.startswith("openvino"), f"{path.name} on {shape.name}: {err}"
            if "BF16" in str(err):
                assert not HAS_BF16, str(err)
                return
            assert "which does not compute in" in str(err) and not shape.weight, str(err)
            continue
        output = np.asarray(kernel.run()[0])
        expected = _reference(path.name, kernel.left, kernel.right)
        scale = float(np.abs(expected).max())
        np.testing.assert_allclose(output, expected, rtol=0, atol=TOLERANCE[path.name] * scale,
                                   err_msg=f"{path.name} on {shape.name} {shape.describe()}")
        assert kernel.settings["threads"] == 1
        checked += 1
    # every path runs every weight GEMM
    assert checked >= len(CEILING_SHAPES), path.name


def _ceiling_result(path: str, precision: str, shape: str, rate: float) -> dict:
    return {"settings": {"path": path, "precision": precision, "shape": shape, "dims": "8x8x8"},
            "stats": {"ops_per_s": rate}}


def test_ceilings_take_the_fastest_weight_gemm_per_precision() -> None:
    contenders = {
        "a:ffn_up": _ceiling_result("a", "int8", "ffn_up", 5e11),
        "b:ffn_down": _ceiling_result("b", "int8", "ffn_down", 7e11),
        # attention products never set the ceiling, however fast
        "b:attention_scores": _ceiling_result("b", "int8", "attention_scores", 9e11),
        "c:projection": _ceiling_result("c", "fp32", "projection", 2e11),
    }
    assert ceilings(contenders) == {
        "int8": {"ops_per_s": 7e11, "contender": "b:ffn_down", "path": "b",
                 "shape": "ffn_down 8x8x8"},
        "fp32": {"ops_per_s": 2e11, "contender": "c:projection", "path": "c",
                 "shape": "projection 8x8x8"},
    }


def test_ceiling_share_per_precision() -> None:
    measured = {"int8": {"ops_per_s": 4e11}, "fp32": {"ops_per_s": 1e11}}
    assert ceiling_share(1e11, "int8", measured, "") == {
        "ceiling_precision": "int8", "ceiling_ops_per_s": 4e11, "ceiling_share": 0.25,
        "ceiling_note": ""}
    assert ceiling_share(5e10, "fp32", measured, "")["ceiling_share"] == 0.5
    assert ceiling_share(1e11, "bf16", measured, "")["ceiling_note"] == (
        "no bf16 GEMM ceiling was measured on this machine")
    assert ceiling_share(1e11, None, measured, "")["ceiling_note"] == (
        "the contender does not state its precision")
    assert ceiling_share(1e11, "int8", {}, "the ceiling scenario did not run") == {
        "ceiling_precision": "int8", "ceiling_ops_per_s": None, "ceiling_share": None,
        "ceiling_note": "the ceiling scenario did not run"}


def test_peak_share_per_precision() -> None:
    peaks = {"int8": {"ops_per_s": 3e11}, "fp32": {"ops_per_s": None}}
    assert peak_share(1.5e11, "int8", peaks) == {"peak_ops_per_s": 3e11, "peak_share": 0.5}
    # no clock stated, no instruction for the precision, no precision: no share
    for precision in ("fp32", "bf16", None):
        assert peak_share(1e11, precision, peaks) == {"peak_ops_per_s": None, "peak_share": None}


def test_a_cuda_row_is_held_to_no_cpu_ceiling_or_peak() -> None:
    measured, peaks = {"fp32": {"ops_per_s": 1e11}}, {"fp32": {"ops_per_s": 2e11}}
    assert ceilings_for("cpu", measured, "", peaks) == (measured, "", peaks)
    # seen on an H100 machine before: a cuda row's share of the host CPU's fp32 peak read 367%
    held, note, held_peaks = ceilings_for("cuda", measured, "", peaks)
    assert ceiling_share(7.5e12, "fp32", held, note) == {
        "ceiling_precision": "fp32", "ceiling_ops_per_s": None, "ceiling_share": None,
        "ceiling_note": CPU_ONLY_CEILING}
    assert peak_share(7.5e12, "fp32", held_peaks) == {"peak_ops_per_s": None, "peak_share": None}


def test_engine_settings_hold_every_option_and_what_runs(tiny_model_dir: Path) -> None:
    reranker = Reranker.from_dir(tiny_model_dir, device="cpu", backend="onnxruntime",
                                 precision="opt", threads=1, max_batch_tokens=4096)
    settings = engine_settings(reranker)
    names = {field.name for field in dataclasses.fields(EngineConfig)}
    assert names <= set(settings)
    assert settings["max_batch_tokens"] == 4096 and settings["threads"] == 1
    # what actually runs wins over the request: opt is an fp32 graph
    assert (settings["backend"], settings["variant"], settings["precision"]) == (
        "onnxruntime", "opt", "fp32")
    json.dumps(settings)  # goes to summary.json and extra_info as is
