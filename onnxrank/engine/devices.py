"""What the machine offers: usable CPUs, the CPU model, the device a request resolves to."""

from __future__ import annotations

import logging
import os
import platform
from pathlib import Path

from onnxrank.errors import DeviceUnavailableError
from onnxrank.types import Device

logger = logging.getLogger(__name__)

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"


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


def cpu_model() -> str:
    """The CPU's model name (for per-machine caches and reports)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


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
        raise DeviceUnavailableError(cuda_missing_message(available_providers))
    if device is Device.AUTO:
        device = Device.CUDA if has_cuda else Device.CPU
        logger.info("device='auto' chose %s (available providers: %s)", device.value,
                    ", ".join(available_providers))
    return device


def cuda_missing_message(available_providers: list[str]) -> str:
    """Why device='cuda' cannot run, and the fix."""
    return (
        "device='cuda' was requested but CUDAExecutionProvider is not available "
        f"(available providers: {', '.join(available_providers)}). Install onnxruntime-gpu "
        "instead of onnxruntime and make sure the CUDA and cuDNN libraries it was built for are "
        "on the library path; or pass device='cpu'."
    )
