"""OpenVINO runtime on CPU: the fp32 graph in f32 or bf16, and the NNCF int8 IR (extra `openvino`).

OpenVINO reads model.onnx directly and, unlike onnxruntime's OpenVINO execution-provider
plugin, lists the CPU device on AMD machines too; so this is the one OpenVINO path.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from onnxrank._optional import require
from onnxrank.engine.backends.base import (
    Backend,
    CompileCache,
    CompileCacheState,
    DeviceInfo,
    ModelRunner,
)
from onnxrank.engine.devices import cpu_model
from onnxrank.engine.variants import backend_variants, fidelity_keys
from onnxrank.errors import InferenceError, ModelLoadError
from onnxrank.types import Device

logger = logging.getLogger(__name__)

# precision -> OpenVINO's inference precision hint. OpenVINO would pick bf16 by itself on CPUs
# that have it, so fp32 and int8 must say f32 explicitly. "int8+bf16" is the int8 IR with its
# non-quantized ops (attention, softmax, layer norm, adds) in bf16.
PRECISION_HINTS = {"fp32": "f32", "bf16": "bf16", "int8": "f32", "int8+bf16": "bf16"}
# The export's fidelity records of the precisions that run a variant's file differently from how
# its own gate measured it: under variants.fp32.fidelity and variants.ov_int8.fidelity.
BF16_FIDELITY_KEY = fidelity_keys("openvino")["bf16"]
INT8_BF16_FIDELITY_KEY = fidelity_keys("openvino")["int8+bf16"]

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

    # OpenVINO prepares each new (rows, length) shape on its first run (4-7 ms each, measured on
    # avx512_vnni_bf16) and every run has a fixed cost: with no charge a mixed-length query of 50
    # pairs made 27 runs of about 2 rows. Charging 128 tokens (8 runs) took 0.86x the time on
    # mixed lengths and 0.94x on short passages (docs/engine.md, "Engine defaults").
    cpu_run_overhead_tokens = 128

    def __init__(self, compiled: Any, info: DeviceInfo) -> None:
        self._compiled = compiled
        self.info = info
        self.input_names = tuple(node.get_any_name() for node in compiled.inputs)
        self.input_shapes = {node.get_any_name(): tuple(
            dim.get_length() if dim.is_static else None for dim in node.get_partial_shape())
            for node in compiled.inputs}
        self._output = compiled.outputs[0]
        self._local = threading.local()
        self.check_inputs()

    def run(self, feeds: dict[str, np.ndarray], output: str | None = None) -> np.ndarray:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self._compiled.create_infer_request()
        try:
            # Shared inputs: OpenVINO reads the padded arrays in place instead of copying them
            # into its own tensors. The shared output tensor is reused by the next infer on this
            # request, so it is copied out (once).
            results = request.infer({name: feeds[name] for name in self.input_names},
                                    share_inputs=True, share_outputs=True)
            port = self._output if output is None else self._compiled.output(output)
            return np.array(results[port], copy=True)
        except Exception as err:  # OpenVINO raises RuntimeError without a type of its own
            raise InferenceError(f"OpenVINO failed on {self.info.model_file}: {err}") from err


class OpenvinoBackend(Backend):
    """OpenVINO's CPU plugin on model.onnx (f32, bf16) and the NNCF int8 IR (int8, int8+bf16)."""

    name = "openvino"
    variants = backend_variants("openvino")
    preference = {Device.CPU: ("int8", "int8+bf16", "bf16", "fp32")}
    # int8, int8+bf16 and bf16 trade places with the CPU (VNNI vs AVX-512 BF16 vs AMX): time them
    auto_candidates = 3
    gate_records = fidelity_keys("openvino")

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
        if PRECISION_HINTS[precision] == "bf16" and "BF16" not in cpu_capabilities():
            return "this CPU has no native bf16 (OpenVINO's CPU capabilities lack BF16)"
        return None

    def open(self, path: Path, *, device: Device, precision: str, variant: str,
             threads: int, compile_cache: CompileCache | None = None) -> ModelRunner:
        openvino = require("openvino", extra="openvino")
        compiled, cache_state = compile_cached(path, compile_config(threads, precision),
                                               compile_cache)
        info = DeviceInfo(
            device=Device.CPU.value, backend=self.name, provider="OpenVINO CPU", variant=variant,
            precision=precision, model_file=str(path), runtime_version=openvino.__version__,
            threads=threads, compile_cache=cache_state,
        )
        return OpenvinoRunner(compiled, info)


def compile_config(threads: int, precision: str) -> dict[str, Any]:
    """The CPU plugin's settings for every model the engine compiles."""
    return {
        "INFERENCE_NUM_THREADS": threads,
        "INFERENCE_PRECISION_HINT": PRECISION_HINTS[precision],
        # one stream: requests are batched by our planner, not by OpenVINO's throughput mode
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": 1,
    }


def compile_cached(path: Path, config: dict[str, Any],
                   cache: CompileCache | None) -> tuple[Any, CompileCacheState]:
    """Compile `path` for the CPU, through OpenVINO's compiled-model cache when there is one.

    Each (file content, path, settings, OpenVINO version, CPU) gets its own entry directory under
    the cache root, so two models or versions never share one, and OpenVINO's CACHE_DIR points
    at that entry:

    1. No cache: compile ("off").
    2. The entry exists: compile through it; "hit" when OpenVINO imported the blob, else "miss"
       (OpenVINO found it unusable, recompiled and rewrote it).
    3. No entry yet: compile into a private staging directory, renamed into place once the blob
       is complete ("miss"), so no process ever sees a half-written entry. When another process
       published the same entry first, ours is dropped.
    4. A cache that cannot be used (not a directory, not writable, OpenVINO failing through it)
       is logged and the model compiled without it ("off").

    Raises:
        ModelLoadError: OpenVINO cannot compile the file even without the cache.
    """
    core = openvino_core()
    if cache is not None:
        entry = cache.root / _entry_name(path, config, cache.content_key)
        try:
            if entry.is_dir():
                compiled = core.compile_model(str(path), "CPU", {**config, "CACHE_DIR": str(entry)})
                return compiled, "hit" if compiled.get_property("LOADED_FROM_CACHE") else "miss"
            cache.root.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".partial",
                                            dir=cache.root))
            try:
                compiled = core.compile_model(str(path), "CPU",
                                              {**config, "CACHE_DIR": str(staging)})
                _publish(staging, entry)
            finally:
                shutil.rmtree(staging, ignore_errors=True)  # still there only if not published
            return compiled, "miss"
        except Exception as err:  # OSError, or OpenVINO's untyped RuntimeError
            logger.warning("OpenVINO compile cache %s not used for %s: %s", cache.root, path, err)
    try:
        return core.compile_model(str(path), "CPU", config), "off"
    except Exception as err:  # OpenVINO raises RuntimeError without a type of its own
        raise ModelLoadError(f"OpenVINO could not load {path}: {err}") from err


def _publish(staging: Path, entry: Path) -> None:
    try:
        staging.rename(entry)
    except OSError:  # another process published the same entry first: theirs stays
        pass


def _entry_name(path: Path, config: dict[str, Any], content_key: str) -> str:
    # OpenVINO keys its blobs by the file's absolute path and the settings, so the path is part
    # of the entry; the content key keeps a re-exported file at the same path out of it.
    material = json.dumps([content_key, str(path.resolve()), config,
                           require("openvino", extra="openvino").__version__,
                           cpu_model()], sort_keys=True, default=str)
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:32]
