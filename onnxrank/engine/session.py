"""Execution-provider selection and onnxruntime session setup: the only place that builds sessions."""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import onnxruntime as ort

from onnxrank.engine.spec import ModelSpec, verify_files
from onnxrank.errors import DeviceUnavailableError, InferenceError, ModelLoadError
from onnxrank.types import Device

logger = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
OPENVINO_PROVIDER = "OpenVINOExecutionProvider"
CpuProvider = Literal["auto", "openvino", "default"]
# Per device, the variants to try in order. int8 is CPU-only: it is slow on GPUs (no int8 kernels
# for most ops in the CUDA provider), so CUDA never picks it.
VARIANT_PREFERENCE: dict[Device, tuple[str, ...]] = {
    Device.CPU: ("int8", "opt", "fp32"),
    Device.CUDA: ("fp16", "opt", "fp32"),
}
GRAPH_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def usable_cpus() -> int:
    """CPUs this process may actually use: affinity mask, capped by a cgroup v2 CPU quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        count = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            count = min(count, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, count)


def resolve_device(requested: Device | str, available_providers: list[str]) -> Device:
    """Map a requested device to the one that will run, given onnxruntime's available providers.

    1. ``cpu`` is always CPU.
    2. ``cuda`` needs CUDAExecutionProvider in the list, else DeviceUnavailableError.
    3. ``auto`` is CUDA when CUDAExecutionProvider is listed, else CPU (logged either way).

    Raises:
        ValueError: `requested` is not cpu, cuda or auto.
        DeviceUnavailableError: CUDA was asked for explicitly and is not available.
    """
    try:
        device = Device(requested)
    except ValueError as err:
        raise ValueError(
            f"device must be one of 'cpu', 'cuda', 'auto', got {requested!r}"
        ) from err
    has_cuda = CUDA_PROVIDER in available_providers
    if device is Device.CUDA and not has_cuda:
        raise DeviceUnavailableError(_cuda_missing_message(available_providers))
    if device is Device.AUTO:
        device = Device.CUDA if has_cuda else Device.CPU
        logger.info("device='auto' chose %s (available providers: %s)", device.value,
                    ", ".join(available_providers))
    return device


def _cuda_missing_message(available_providers: list[str]) -> str:
    return (
        "device='cuda' was requested but CUDAExecutionProvider is not available "
        f"(available providers: {', '.join(available_providers)}). Install onnxruntime-gpu "
        "instead of onnxruntime and make sure the CUDA and cuDNN libraries it was built for are "
        "on the library path; or pass device='cpu'."
    )


def choose_variant(spec: ModelSpec, device: Device, precision: str = "auto") -> str:
    """Pick the variant name to run on `device`.

    1. ``precision="auto"``: the first variant present in VARIANT_PREFERENCE[device].
    2. An explicit precision (fp32, opt, int8, fp16) is used as is, except int8 on CUDA.

    Raises:
        ValueError: Unknown precision, int8 requested on CUDA, or the variant is not exported.
    """
    if precision == "auto":
        for name in VARIANT_PREFERENCE[device]:
            if name in spec.variants:
                return name
        raise ValueError(
            f"model {spec.name!r} has none of the variants usable on {device.value} "
            f"({', '.join(VARIANT_PREFERENCE[device])}); it has: {', '.join(spec.variants)}"
        )
    if precision not in ("fp32", "opt", "int8", "fp16"):
        raise ValueError(
            f"precision must be one of 'auto', 'fp32', 'opt', 'int8', 'fp16', got {precision!r}"
        )
    if precision == "int8" and device is Device.CUDA:
        raise ValueError("precision='int8' is CPU-only; on CUDA use 'fp16', 'opt' or 'fp32'")
    if precision not in spec.variants:
        raise ValueError(
            f"variant {precision!r} was not exported for model {spec.name!r}; "
            f"available: {', '.join(spec.variants)}"
        )
    return precision


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What is actually running a model."""

    device: str
    provider: str
    variant: str
    model_file: str
    onnxruntime_version: str
    threads: int


class OnnxModel:
    """An onnxruntime session plus the facts needed to feed it; safe to call from several threads."""

    def __init__(self, session: ort.InferenceSession, info: DeviceInfo) -> None:
        self.session = session
        self.info = info
        self.input_names = [node.name for node in session.get_inputs()]
        self.output_name = session.get_outputs()[0].name
        unknown = set(self.input_names) - set(GRAPH_INPUTS)
        if unknown:
            raise ModelLoadError(
                f"{info.model_file} declares inputs {sorted(unknown)} that onnxrank does not "
                f"provide; supported inputs: {', '.join(GRAPH_INPUTS)}"
            )

    def run(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """Run one batch; `batch` may hold more inputs than the graph declares (only those are fed)."""
        feeds = {name: batch[name] for name in self.input_names}
        try:
            if self.info.device == Device.CUDA.value:
                return self._run_with_io_binding(feeds)
            return self.session.run([self.output_name], feeds)[0]
        except Exception as err:  # onnxruntime raises its own untyped errors
            raise InferenceError(f"onnxruntime failed on {self.info.model_file}: {err}") from err

    def _run_with_io_binding(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        # IO binding copies inputs to the GPU once and lets onnxruntime allocate the output on the
        # device, avoiding the extra host round trips of session.run.
        binding = self.session.io_binding()
        for name, array in feeds.items():
            binding.bind_cpu_input(name, array)
        binding.bind_output(self.output_name, "cuda")
        self.session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()[0]


_openvino_lock = threading.Lock()
_openvino_registered = False


def openvino_cpu_device() -> ort.OrtEpDevice | None:
    """The OpenVINO plugin's CPU device, or None when the plugin is not installed or lists none.

    The plugin (PyPI `onnxruntime-ep-openvino`, extra `openvino`) is registered with onnxruntime
    once per process. Its factory lists no device on CPUs it does not support (seen on AMD EPYC).
    """
    global _openvino_registered
    try:
        import onnxruntime_ep_openvino as plugin
    except ImportError:
        return None
    with _openvino_lock:
        if not _openvino_registered:
            try:
                ort.register_execution_provider_library("openvino", plugin.get_library_path())
            except Exception as err:  # a broken plugin install must not break plain CPU use
                logger.warning("could not register the OpenVINO EP plugin: %s", err)
                return None
            _openvino_registered = True
    for device in ort.get_ep_devices():
        if device.ep_name == OPENVINO_PROVIDER and device.ep_metadata.get("ov_device") == "CPU":
            return device
    logger.info("the OpenVINO EP plugin is installed but lists no CPU device on this machine")
    return None


def session_options(threads: int) -> ort.SessionOptions:
    """Session options used for every model (see docs/engine.md for the measurements behind them)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return options


# onnxruntime's session construction is not documented as thread-safe with respect to provider
# registration; one lock keeps concurrent Reranker construction simple.
_build_lock = threading.Lock()


def build_session(
    spec: ModelSpec,
    model_dir: Path,
    *,
    device: Device | str = Device.AUTO,
    precision: str = "auto",
    threads: int | None = None,
    cpu_provider: CpuProvider = "auto",
) -> OnnxModel:
    """Build the session for the best variant on the resolved device and check what attached.

    The variant's file and the tokenizer files are checked against their manifest hashes first.
    On CPU, `cpu_provider` picks the execution provider:

    1. ``"default"``: onnxruntime's CPUExecutionProvider.
    2. ``"openvino"``: the OpenVINO EP plugin on the fp32 graph (its contrib-op-free export runs
       whole inside OpenVINO); DeviceUnavailableError when the plugin lists no CPU device.
    3. ``"auto"``: OpenVINO when the plugin lists a CPU device, else CPUExecutionProvider.

    Raises:
        DeviceUnavailableError: CUDA or OpenVINO was asked for and is unavailable or did not attach.
        ModelLoadError: A file does not match its manifest hash, or the ONNX file cannot be loaded.
        ValueError: Bad device, precision, threads or cpu_provider.
    """
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    if cpu_provider not in ("auto", "openvino", "default"):
        raise ValueError(
            f"cpu_provider must be 'auto', 'openvino' or 'default', got {cpu_provider!r}"
        )
    available = ort.get_available_providers()
    resolved = resolve_device(device, available)
    thread_count = threads or usable_cpus()
    options = session_options(thread_count)
    providers: list[str] | None = None
    openvino_device = None
    if resolved is Device.CPU and cpu_provider != "default":
        openvino_device = openvino_cpu_device()
        if openvino_device is None and cpu_provider == "openvino":
            raise DeviceUnavailableError(
                "cpu_provider='openvino' was requested but the OpenVINO EP plugin is not "
                "installed or lists no CPU device on this machine; install it with "
                'pip install "onnxrank[openvino]" (Intel CPUs), or pass cpu_provider="default"'
            )
    if openvino_device is not None:
        variant = "fp32" if precision == "auto" else choose_variant(spec, resolved, precision)
        # OpenVINO takes its thread count through load_config, not intra_op_num_threads.
        # f32 precision hint: OpenVINO would otherwise pick bf16 on CPUs that have it.
        load_config = json.dumps({"CPU": {"INFERENCE_NUM_THREADS": str(thread_count),
                                          "INFERENCE_PRECISION_HINT": "f32"}})
        options.add_provider_for_devices([openvino_device], {"load_config": load_config})
    else:
        variant = choose_variant(spec, resolved, precision)
        providers = [CUDA_PROVIDER, CPU_PROVIDER] if resolved is Device.CUDA else [CPU_PROVIDER]
    verify_files(spec, model_dir, [variant])
    path = Path(model_dir) / spec.variants[variant].file
    with _build_lock:
        try:
            session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        except Exception as err:  # onnxruntime raises its own untyped errors
            raise ModelLoadError(f"could not load {path}: {err}") from err
    attached = session.get_providers()
    if resolved is Device.CUDA and CUDA_PROVIDER not in attached:
        message = (
            f"CUDAExecutionProvider is installed but did not attach to {path} "
            f"(session providers: {', '.join(attached)}); the usual cause is missing or mismatched "
            "CUDA/cuDNN libraries."
        )
        if Device(device) is Device.CUDA:
            raise DeviceUnavailableError(message)
        logger.warning("%s Falling back to CPU because device='auto'.", message)
        return build_session(spec, model_dir, device=Device.CPU, precision=precision,
                             threads=threads, cpu_provider=cpu_provider)
    info = DeviceInfo(
        device=resolved.value,
        provider=attached[0],
        variant=variant,
        model_file=str(path),
        onnxruntime_version=ort.__version__,
        threads=thread_count,
    )
    logger.info("running %s on %s (%s, %d threads)", path.name, info.provider, variant, thread_count)
    return OnnxModel(session, info)
