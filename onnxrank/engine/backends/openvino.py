"""OpenVINO runtime on CPU: the fp32 graph in f32 or bf16, and the NNCF int8 IR (extra `openvino`).

OpenVINO reads model.onnx directly and, unlike onnxruntime's OpenVINO execution-provider
plugin, lists the CPU device on AMD machines too; so this is the one OpenVINO path.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from onnxrank._optional import require
from onnxrank.engine.backends.base import Backend, DeviceInfo, ModelRunner
from onnxrank.errors import InferenceError, ModelLoadError
from onnxrank.types import Device

logger = logging.getLogger(__name__)

# precision -> OpenVINO's inference precision hint. OpenVINO would pick bf16 by itself on CPUs
# that have it, so fp32 must say f32 explicitly.
PRECISION_HINTS = {"fp32": "f32", "bf16": "bf16", "int8": "f32"}

_core_lock = threading.Lock()
_core: Any = None


def openvino_core() -> Any:
    """The process's one openvino.Core (creating it scans devices, which is slow)."""
    global _core
    openvino = require("openvino", extra="openvino")
    with _core_lock:
        if _core is None:
            _core = openvino.Core()
        return _core


def cpu_capabilities() -> list[str]:
    """OpenVINO's CPU capabilities (BF16, INT8, FP32, ...): what this CPU computes natively."""
    return list(openvino_core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def openvino_installed() -> bool:
    """True when the openvino package imports."""
    try:
        require("openvino", extra="openvino")
    except ImportError:
        return False
    return True


class OpenvinoRunner(ModelRunner):
    """A compiled OpenVINO model; each thread gets its own infer request."""

    def __init__(self, compiled: Any, info: DeviceInfo) -> None:
        self._compiled = compiled
        self.info = info
        self.input_names = tuple(node.get_any_name() for node in compiled.inputs)
        self._output = compiled.outputs[0]
        self._local = threading.local()
        self.check_inputs()

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self._compiled.create_infer_request()
        try:
            results = request.infer({name: feeds[name] for name in self.input_names})
            # the output tensor is reused by the next infer on this request: copy it out
            return np.array(results[self._output], copy=True)
        except Exception as err:  # OpenVINO raises RuntimeError without a type of its own
            raise InferenceError(f"OpenVINO failed on {self.info.model_file}: {err}") from err


class OpenvinoBackend(Backend):
    """OpenVINO's CPU plugin on model.onnx (f32, bf16) and the NNCF int8 IR (ov_int8)."""

    name = "openvino"
    variants = {"fp32": "fp32", "bf16": "fp32", "int8": "ov_int8"}
    preference = {Device.CPU: ("int8", "bf16", "fp32")}
    # int8 and bf16 trade places with the CPU (VNNI vs AVX-512 BF16 vs AMX): time both
    auto_candidates = 2

    def unavailable_reason(self, device: Device, precision: str) -> str | None:
        if device is not Device.CPU:
            return f"backend='openvino' runs on device='cpu' only, not {device.value!r}"
        if precision not in self.variants:
            return (f"backend='openvino' runs precisions {', '.join(self.variants)}, "
                    f"not {precision!r}")
        if not openvino_installed():
            return 'the openvino package is not installed (pip install "onnxrank[openvino]")'
        core = openvino_core()
        if "CPU" not in core.available_devices:
            return f"OpenVINO lists no CPU device here (devices: {core.available_devices})"
        if precision == "bf16" and "BF16" not in cpu_capabilities():
            return "this CPU has no native bf16 (OpenVINO's CPU capabilities lack BF16)"
        return None

    def open(self, path: Path, *, device: Device, precision: str, variant: str,
             threads: int) -> ModelRunner:
        openvino = require("openvino", extra="openvino")
        core = openvino_core()
        config = {
            "INFERENCE_NUM_THREADS": threads,
            "INFERENCE_PRECISION_HINT": PRECISION_HINTS[precision],
            # one stream: requests are batched by our planner, not by OpenVINO's throughput mode
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": 1,
        }
        try:
            compiled = core.compile_model(core.read_model(str(path)), "CPU", config)
        except Exception as err:  # OpenVINO raises RuntimeError without a type of its own
            raise ModelLoadError(f"OpenVINO could not load {path}: {err}") from err
        info = DeviceInfo(
            device=Device.CPU.value, backend=self.name, provider="OpenVINO CPU", variant=variant,
            precision=precision, model_file=str(path), runtime_version=openvino.__version__,
            threads=threads,
        )
        return OpenvinoRunner(compiled, info)
