"""The machine's GEMM ceiling per precision, on the shapes of the model under test.

Every runtime the engine can reach is asked for its fastest matrix multiply at each precision:

- fp32: onnxruntime ``MatMul``; OpenVINO ``MatMul`` with ``INFERENCE_PRECISION_HINT=f32``;
- int8: onnxruntime ``MatMulInteger`` (uint8 × int8, both already quantized: the bare kernel),
  onnxruntime ``DynamicQuantizeMatMul`` (fp32 in, activations quantized on every call, as in our
  int8 file), OpenVINO ``FakeQuantize`` → ``MatMul`` with int8 weights (NNCF's pattern, which its
  CPU plugin runs as an int8 GEMM, on AMX where the CPU has it);
- bf16: OpenVINO ``MatMul`` with ``INFERENCE_PRECISION_HINT=bf16`` (only where the CPU reports
  BF16 in ``OPTIMIZATION_CAPABILITIES``).

A precision's ceiling is the fastest of its paths on the model's weight GEMMs: the feed-forward
up- and down-projections and the square projections of one batch of 8 pairs of 100 tokens (for
MiniLM-L6: 800 × 384 × 1536, 800 × 1536 × 384 and 800 × 384 × 384). Attention's batched products
between two activations are reported beside them but do not set the ceiling: they are small and
run well below the dense GEMMs' rate.

The kernels run with the engine's own onnxruntime session options and OpenVINO core (threads,
graph optimisation, latency hint), so the ceiling is measured the way the engine runs.
OpenVINO paths check what the CPU plugin actually compiled (the primitive of the GEMM node in the
runtime model) and are skipped with the reason when it is not the precision asked for: a weight-only
int8 FullyConnected that computes in f32 is not an int8 GEMM.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from onnxrank._optional import require
from onnxrank.bench.flops import CEILING_PAIRS, CEILING_TOKENS, ModelFlops
from onnxrank.engine.backends.onnxruntime import session_options
from onnxrank.engine.backends.openvino import openvino_core
from onnxrank.errors import DeviceUnavailableError
from onnxrank.types import Device

logger = logging.getLogger(__name__)

PRECISIONS = ("int8", "bf16", "fp32")
# A runtime precision whose weight GEMMs run in another one: OpenVINO's "int8+bf16" multiplies in
# int8 (bf16 is only the rest of the graph), so its ceiling and peak are int8's.
GEMM_PRECISIONS = {"int8+bf16": "int8"}
# The shapes that set a precision's ceiling (the weight GEMMs; see the module docstring).
CEILING_SHAPES = ("ffn_up", "ffn_down", "projection")
# Used when the model directory has no config.json naming its heads (MiniLM and BERT-base: 32, 64).
DEFAULT_HEAD_DIM = 64
SEED = 0
# Scale of every int8 weight column (DynamicQuantizeMatMul, OpenVINO int8), and the range OpenVINO's
# FakeQuantize maps activations from (the standard-normal operands stay well inside it).
WEIGHT_SCALE = 0.01
SEVEN_BITS = 64  # int8 operands in [-64, 64): see _operands
ACTIVATION_RANGE = 4.0


@dataclass(frozen=True, slots=True)
class GemmShape:
    """``batch`` independent products of [rows × inner] @ [inner × cols].

    Attributes:
        name: ffn_up, ffn_down, projection, attention_scores or attention_context.
        batch: Independent products (1 for the dense layers; pairs × heads for attention).
        rows: Rows of the left operand (tokens).
        inner: The shared dimension.
        cols: Columns of the right operand.
        weight: True when the right operand is a constant (a layer's weights).
    """

    name: str
    batch: int
    rows: int
    inner: int
    cols: int
    weight: bool

    @property
    def ops(self) -> float:
        """Multiply-adds × 2."""
        return 2.0 * self.batch * self.rows * self.inner * self.cols

    def describe(self) -> str:
        dims = f"{self.rows}x{self.inner}x{self.cols}"
        return dims if self.batch == 1 else f"{self.batch} x {dims}"


def model_shapes(flops: ModelFlops, *, pairs: int = CEILING_PAIRS,
                 tokens: int = CEILING_TOKENS) -> list[GemmShape]:
    """The GEMM shapes of one batch of `pairs` pairs of `tokens` tokens through this model."""
    rows = pairs * tokens
    heads = flops.heads or max(1, flops.hidden // DEFAULT_HEAD_DIM)
    head_dim = max(1, flops.hidden // heads)
    return [
        GemmShape("ffn_up", 1, rows, flops.hidden, flops.intermediate, True),
        GemmShape("ffn_down", 1, rows, flops.intermediate, flops.hidden, True),
        GemmShape("projection", 1, rows, flops.hidden, flops.hidden, True),
        GemmShape("attention_scores", pairs * heads, tokens, head_dim, tokens, False),
        GemmShape("attention_context", pairs * heads, tokens, tokens, head_dim, False),
    ]


@dataclass(frozen=True, slots=True)
class GemmPath:
    """One way to run a GEMM: a runtime, an operator and a precision."""

    name: str
    precision: str
    label: str
    build: Callable[[GemmShape, int], GemmKernel]
    shapes: tuple[str, ...] | None = None  # None: every shape


@dataclass(slots=True)
class GemmKernel:
    """A compiled GEMM with its inputs bound: ``run()`` does one product and returns the
    runtime's outputs (first output: the product of `left` and `right`)."""

    run: Callable[[], Any]
    left: np.ndarray
    right: np.ndarray
    settings: dict[str, Any] = field(default_factory=dict)


# --- onnxruntime ----------------------------------------------------------------------------------


def _operands(shape: GemmShape, rng: np.random.Generator, left_dtype: Any,
              right_dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    left_shape = (shape.rows, shape.inner) if shape.weight else (shape.batch, shape.rows, shape.inner)
    right_shape = (shape.inner, shape.cols) if shape.weight else (shape.batch, shape.inner, shape.cols)

    def draw(dims: tuple[int, ...], dtype: Any) -> np.ndarray:
        if np.dtype(dtype) == np.uint8:
            return rng.integers(0, 256, dims, dtype=np.uint8)
        if np.dtype(dtype) == np.int8:
            # 7-bit values, as int8 quantizers use them on CPUs without VNNI (onnxruntime's
            # reduce_range, NNCF's overflow fix): there vpmaddubsw adds two u8 x s8 products in
            # int16, which saturates beyond 32,767, and the product would not be the GEMM's.
            return rng.integers(-SEVEN_BITS, SEVEN_BITS, dims, dtype=np.int8)
        return rng.standard_normal(dims, dtype=np.float32)

    return draw(left_shape, left_dtype), draw(right_shape, right_dtype)


def _ort_kernel(shape: GemmShape, threads: int, *, op_type: str, left_dtype: Any,
                right_dtype: Any, domain: str = "") -> GemmKernel:
    onnx = require("onnx", extra="bench")
    helper, numpy_helper = onnx.helper, require("onnx.numpy_helper", extra="bench")
    rng = np.random.default_rng(SEED)
    left, right = _operands(shape, rng, left_dtype, right_dtype)

    def tensor_type(array: np.ndarray) -> int:
        return helper.np_dtype_to_tensor_dtype(array.dtype)

    inputs = [helper.make_tensor_value_info("left", tensor_type(left), list(left.shape))]
    initializers = []
    node_inputs = ["left", "right"]
    if shape.weight:
        initializers.append(numpy_helper.from_array(right, "right"))
    else:
        inputs.append(helper.make_tensor_value_info("right", tensor_type(right), list(right.shape)))
    if op_type == "DynamicQuantizeMatMul":
        initializers.append(numpy_helper.from_array(
            np.full(shape.cols, WEIGHT_SCALE, np.float32), "scale"))
        node_inputs.append("scale")
    out_type = onnx.TensorProto.INT32 if op_type == "MatMulInteger" else onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node(op_type, node_inputs, ["out"], domain=domain)], f"{op_type}_gemm",
        inputs, [helper.make_tensor_value_info("out", out_type, None)], initializers,
    )
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets)
    with tempfile.TemporaryDirectory(prefix="onnxrank-ceiling-") as directory:
        path = Path(directory) / "gemm.onnx"
        onnx.save(model, str(path))
        session = ort.InferenceSession(str(path), sess_options=session_options(threads),
                                       providers=["CPUExecutionProvider"])
    feeds = {"left": left} if shape.weight else {"left": left, "right": right}
    session.run(None, feeds)
    return GemmKernel(run=lambda: session.run(None, feeds), left=left, right=right, settings={
        "runtime": f"onnxruntime {ort.__version__}", "operator": op_type,
        "operands": f"{left.dtype} x {right.dtype}", "threads": threads,
    })


def _ort_fp32(shape: GemmShape, threads: int) -> GemmKernel:
    return _ort_kernel(shape, threads, op_type="MatMul", left_dtype=np.float32,
                       right_dtype=np.float32)


def _ort_matmul_integer(shape: GemmShape, threads: int) -> GemmKernel:
    return _ort_kernel(shape, threads, op_type="MatMulInteger", left_dtype=np.uint8,
                       right_dtype=np.int8)


def _ort_dynamic_quantize(shape: GemmShape, threads: int) -> GemmKernel:
    return _ort_kernel(shape, threads, op_type="DynamicQuantizeMatMul", left_dtype=np.float32,
                       right_dtype=np.int8, domain="com.microsoft")


# --- OpenVINO -------------------------------------------------------------------------------------


def _openvino_kernel(shape: GemmShape, threads: int, *, precision: str) -> GemmKernel:
    ov = require("openvino", extra="openvino")
    ops = require("openvino.opset13", extra="openvino")
    core = openvino_core()
    if precision == "bf16" and "BF16" not in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        raise DeviceUnavailableError("this CPU does not report BF16 to OpenVINO "
                                     "(OPTIMIZATION_CAPABILITIES), so it has no bf16 GEMM")
    rng = np.random.default_rng(SEED)
    left, right = _operands(shape, rng, np.float32,
                            np.int8 if precision == "int8" and shape.weight else np.float32)

    def constant(value: float) -> Any:
        return ops.constant(np.float32(value))

    def quantized(node: Any) -> Any:
        # NNCF's pattern: FakeQuantize on activations, which the CPU plugin folds into int8 GEMMs.
        low, high = constant(-ACTIVATION_RANGE), constant(ACTIVATION_RANGE)
        return ops.fake_quantize(node, low, high, low, high, 256)

    parameters = [ops.parameter(list(left.shape), ov.Type.f32, name="left")]
    left_node = parameters[0]
    if shape.weight and precision == "int8":
        right_node = ops.multiply(ops.convert(ops.constant(right), ov.Type.f32),
                                  ops.constant(np.full((1, shape.cols), WEIGHT_SCALE, np.float32)))
    elif shape.weight:
        right_node = ops.constant(right)
    else:
        parameters.append(ops.parameter(list(right.shape), ov.Type.f32, name="right"))
        right_node = parameters[1]
        if precision == "int8":
            right_node = quantized(right_node)
    if precision == "int8":
        left_node = quantized(left_node)
    model = ov.Model([ops.matmul(left_node, right_node, False, False)], parameters, "gemm")
    hint = "bf16" if precision == "bf16" else "f32"
    compiled = core.compile_model(model, "CPU", {
        "INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": threads,
        "PERFORMANCE_HINT": "LATENCY",
    })
    primitive = _gemm_primitive(compiled)
    expected = {"int8": "i8", "bf16": "bf16", "fp32": "f32"}[precision]
    if not primitive.lower().endswith(expected):
        raise DeviceUnavailableError(
            f"OpenVINO compiled this {precision} GEMM as {primitive!r}, which does not compute "
            f"in {precision}"
        )
    request = compiled.create_infer_request()
    feeds = {0: left} if shape.weight else {0: left, 1: right}
    request.infer(feeds)
    return GemmKernel(run=lambda: request.infer(feeds), left=left, right=right, settings={
        "runtime": f"openvino {ov.__version__}", "operator": "MatMul",
        "inference_precision_hint": hint, "primitive": primitive, "threads": threads,
        "cpu": core.get_property("CPU", "FULL_DEVICE_NAME"),
    })


def _gemm_primitive(compiled: Any) -> str:
    """The primitive (e.g. ``brgemm_avx512_amx_i8``) of the GEMM node the CPU plugin compiled."""
    for operation in compiled.get_runtime_model().get_ops():
        info = {key: value.astype(str) for key, value in operation.get_rt_info().items()}
        if info.get("layerType") in ("FullyConnected", "MatMul"):
            return info.get("primitiveType", "unknown")
    return "no GEMM node"


def _openvino(precision: str) -> Callable[[GemmShape, int], GemmKernel]:
    def build(shape: GemmShape, threads: int) -> GemmKernel:
        return _openvino_kernel(shape, threads, precision=precision)
    return build


GEMM_PATHS: tuple[GemmPath, ...] = (
    GemmPath("ort_matmul_integer", "int8", "onnxruntime MatMulInteger (u8 x s8)",
             _ort_matmul_integer),
    GemmPath("ort_dynamic_quantize_matmul", "int8",
             "onnxruntime DynamicQuantizeMatMul (fp32 in, quantized per call)",
             _ort_dynamic_quantize, shapes=CEILING_SHAPES),
    GemmPath("openvino_int8", "int8", "OpenVINO FakeQuantize + MatMul (int8 GEMM)",
             _openvino("int8")),
    GemmPath("openvino_bf16", "bf16", "OpenVINO MatMul, precision hint bf16", _openvino("bf16")),
    GemmPath("ort_matmul_fp32", "fp32", "onnxruntime MatMul (fp32)", _ort_fp32),
    GemmPath("openvino_fp32", "fp32", "OpenVINO MatMul, precision hint f32", _openvino("fp32")),
)


def repeats_for(kernel: GemmKernel, target_seconds: float) -> int:
    """How many products make one timed sample of about `target_seconds` (at least 1)."""
    started = time.perf_counter()
    kernel.run()
    elapsed = time.perf_counter() - started
    return max(1, int(target_seconds / max(elapsed, 1e-7)))


def ceilings(contenders: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per precision, the fastest path and shape among CEILING_SHAPES: ops/s, path and shape.

    Args:
        contenders: A ceiling ScenarioResult's contenders, whose settings hold ``precision``,
            ``path`` and ``shape`` and whose stats hold ``ops_per_s``.
    """
    best: dict[str, dict[str, Any]] = {}
    for name, contender in contenders.items():
        settings = contender["settings"]
        if settings["shape"] not in CEILING_SHAPES:
            continue
        rate = contender["stats"]["ops_per_s"]
        precision = settings["precision"]
        if precision not in best or rate > best[precision]["ops_per_s"]:
            best[precision] = {"ops_per_s": rate, "contender": name, "path": settings["path"],
                               "shape": f"{settings['shape']} {settings['dims']}"}
    return best


CPU_ONLY_CEILING = "the GEMM ceiling is measured on CPU only"


def ceilings_for(device: str, ceilings: dict[str, dict[str, Any]], missing_note: str,
                 peaks: dict[str, dict[str, Any]]
                 ) -> tuple[dict[str, dict[str, Any]], str, dict[str, dict[str, Any]]]:
    """The ceilings (with the note for when they are empty) and the peaks that a row measured on
    `device` is held to: the ceiling scenario times CPU GEMMs and the peaks are the CPU's
    instructions, so a row of another device (cuda) is held to neither."""
    if device == Device.CPU.value:
        return ceilings, missing_note, peaks
    return {}, CPU_ONLY_CEILING, {}


def ceiling_share(effective_ops_per_s: float, precision: str | None,
                  ceilings: dict[str, dict[str, Any]], missing_note: str) -> dict[str, Any]:
    """A contender's effective ops/s as a share of the ceiling of its precision.

    Args:
        effective_ops_per_s: Model FLOPs of the pairs it scored / its time.
        precision: What its arithmetic runs in (int8, bf16, fp32, fp16, int8+bf16), from its
            settings; int8+bf16 is held to the int8 ceiling (GEMM_PRECISIONS).
        ceilings: The run's ceilings (see `ceilings`); empty when none was measured.
        missing_note: Why `ceilings` is empty, for the report.

    Returns:
        ``ceiling_precision``, ``ceiling_ops_per_s`` and ``ceiling_share`` (None when there is no
        ceiling for that precision, with ``ceiling_note`` saying why).
    """
    precision = GEMM_PRECISIONS.get(precision or "", precision)
    ceiling = ceilings.get(precision or "")
    if ceiling is None:
        if not ceilings:
            note = missing_note
        elif precision is None:
            note = "the contender does not state its precision"
        else:
            note = f"no {precision} GEMM ceiling was measured on this machine"
        return {"ceiling_precision": precision, "ceiling_ops_per_s": None,
                "ceiling_share": None, "ceiling_note": note}
    return {"ceiling_precision": precision, "ceiling_ops_per_s": ceiling["ops_per_s"],
            "ceiling_share": effective_ops_per_s / ceiling["ops_per_s"], "ceiling_note": ""}


def peak_share(effective_ops_per_s: float, precision: str | None,
               peaks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A contender's effective ops/s as a share of the CPU's estimated peak for its precision
    (onnxrank.bench.machine.instruction_peaks): ``peak_ops_per_s`` and ``peak_share``, None where
    the CPU has no instruction for that precision or no stated clock."""
    peak = peaks.get(GEMM_PRECISIONS.get(precision or "", precision or ""), {}).get("ops_per_s")
    return {"peak_ops_per_s": peak,
            "peak_share": None if peak is None else effective_ops_per_s / peak}
