"""onnxruntime: the CPU execution provider, and the CUDA provider with IO binding."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort

from onnxrank.engine.backends.base import Backend, CompileCache, DeviceInfo, ModelRunner
from onnxrank.engine.devices import CPU_PROVIDER, CUDA_PROVIDER, cuda_missing_message
from onnxrank.engine.variants import backend_variants
from onnxrank.errors import DeviceUnavailableError, InferenceError, ModelLoadError
from onnxrank.types import Device

logger = logging.getLogger(__name__)

# onnxruntime's session construction is not documented as thread-safe with respect to provider
# registration; one lock keeps concurrent model loading simple.
_build_lock = threading.Lock()


# The CUDA provider's attention kernels, onnxruntime's `sdpa_kernel` bit mask: flash 1,
# memory-efficient 2, TensorRT fused 4, cuDNN 8, unfused 16, TensorRT flash 32. With no mask,
# onnxruntime prefers cuDNN's attention on Hopper GPUs, and cuDNN builds a plan for every new
# (batch, length) shape: on an H100, 67 shapes new to the stand-in's fp16 file took 3,085 ms
# with cuDNN and 477 ms without (`research/cuda_check.py attention`). Reranking meets a new shape
# in most batches, so the mask leaves cuDNN out.
CUDA_ATTENTION_KERNELS = 1 | 2 | 4 | 16 | 32
# onnxruntime runs fp32 MatMuls in TF32 on the CUDA provider unless told not to: the opt variant
# then moved up to 0.05 from PyTorch fp32 on an H100 (random-weight MiniLM shape, logits spread
# over 9.5). A variant's precision names its arithmetic, so TF32 stays off.
CUDA_PROVIDER_OPTIONS = {"sdpa_kernel": str(CUDA_ATTENTION_KERNELS), "use_tf32": "0"}


def providers_for(device: Device) -> list[str | tuple[str, dict[str, str]]]:
    """The execution providers, with their options, of a session on `device`."""
    if device is Device.CUDA:
        return [(CUDA_PROVIDER, CUDA_PROVIDER_OPTIONS), CPU_PROVIDER]
    return [CPU_PROVIDER]


def session_options(threads: int) -> ort.SessionOptions:
    """Session options used for every onnxruntime model (docs/engine.md has the measurements)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return options


class OnnxruntimeRunner(ModelRunner):
    """An onnxruntime session; session.run is thread-safe."""

    def __init__(self, session: ort.InferenceSession, info: DeviceInfo) -> None:
        self.session = session
        self.info = info
        self.input_names = tuple(node.name for node in session.get_inputs())
        self.input_shapes = {node.name: tuple(dim if isinstance(dim, int) else None
                                              for dim in node.shape)
                             for node in session.get_inputs()}
        self.output_name = session.get_outputs()[0].name
        self.check_inputs()

    def run(self, feeds: dict[str, np.ndarray], output: str | None = None) -> np.ndarray:
        declared = {name: feeds[name] for name in self.input_names}
        name = output or self.output_name
        try:
            if self.info.device == Device.CUDA.value:
                return self._run_with_io_binding(declared, name)
            return self.session.run([name], declared)[0]
        except Exception as err:  # onnxruntime raises its own untyped errors
            raise InferenceError(f"onnxruntime failed on {self.info.model_file}: {err}") from err

    def _run_with_io_binding(self, feeds: dict[str, np.ndarray], output: str) -> np.ndarray:
        # IO binding copies inputs to the GPU once and lets onnxruntime allocate the output on the
        # device, avoiding the extra host round trips of session.run.
        binding = self.session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)
        binding.bind_output(output, "cuda")
        self.session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[0]


class OnnxruntimeBackend(Backend):
    """onnxruntime's CPU and CUDA execution providers on the .onnx variants."""

    name = "onnxruntime"
    variants = backend_variants("onnxruntime")
    # int8 is CPU-only: the CUDA provider lacks int8 kernels for most ops, so CUDA never picks it.
    preference = {Device.CPU: ("int8", "opt", "fp32"), Device.CUDA: ("fp16", "opt", "fp32")}

    def unavailable_reason(self, device: Device, precision: str) -> str | None:
        if precision not in self.variants:
            return (f"onnxruntime runs precisions {', '.join(self.variants)}, not {precision!r} "
                    "(bf16 runs on backend='openvino')")
        if device is Device.CUDA and precision == "int8":
            return "precision='int8' is CPU-only; on CUDA use 'fp16', 'opt' or 'fp32'"
        if device is Device.CUDA and CUDA_PROVIDER not in ort.get_available_providers():
            return cuda_missing_message(ort.get_available_providers())
        return None

    def open(self, path: Path, *, device: Device, precision: str, variant: str,
             threads: int, compile_cache: CompileCache | None = None) -> ModelRunner:
        # onnxruntime keeps no compiled model between processes: compile_cache stays "off"
        with _build_lock:
            try:
                session = ort.InferenceSession(str(path), sess_options=session_options(threads),
                                               providers=providers_for(device))
            except Exception as err:  # onnxruntime raises its own untyped errors
                raise ModelLoadError(f"could not load {path}: {err}") from err
        attached = session.get_providers()
        if device is Device.CUDA and CUDA_PROVIDER not in attached:
            raise DeviceUnavailableError(
                f"CUDAExecutionProvider is installed but did not attach to {path} "
                f"(session providers: {', '.join(attached)}); the usual cause is missing or "
                "mismatched CUDA/cuDNN libraries."
            )
        info = DeviceInfo(
            device=device.value, backend=self.name, provider=attached[0], variant=variant,
            precision="fp32" if precision == "opt" else precision, model_file=str(path),
            runtime_version=ort.__version__, threads=threads,
        )
        return OnnxruntimeRunner(session, info)
