"""What the benchmark ran on: CPU, GPU, library versions, git commit, and the calibration workload."""

from __future__ import annotations

import logging
import platform
import shutil
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from onnxrank.engine.backends.openvino import cpu_capabilities
from onnxrank.engine.devices import CPU_PROVIDER, CUDA_PROVIDER, cpu_model, usable_cpus
from onnxrank.errors import MissingDependencyError

logger = logging.getLogger(__name__)

DEVICES = ("cpu", "cuda")
DEVICE_PROVIDERS = {"cpu": CPU_PROVIDER, "cuda": CUDA_PROVIDER}
# The calibration workload: a float32 matmul through numpy's own loops (einsum without BLAS),
# single-threaded by construction, so it measures one core's speed, including any contention from
# other processes at the time of the run, whatever BLAS numpy was built with.
CALIBRATION_SHAPE = (128, 384, 384)
CALIBRATION_REPEATS = 7
CALIBRATION_MATMULS = 10


def parse_devices(value: str) -> list[str]:
    """Devices from ``"cpu,cuda"`` or ``"all"`` (all of cpu and cuda: cuda rows report unavailable).

    Raises:
        ValueError: An unknown device name.
    """
    names = list(DEVICES) if value.strip() == "all" else [
        name.strip() for name in value.split(",") if name.strip()
    ]
    unknown = [name for name in names if name not in DEVICES]
    if unknown or not names:
        raise ValueError(
            f"unknown devices {unknown or value!r}; choose from cpu, cuda or all (comma-separated)"
        )
    return names


def device_unavailable_reason(device: str) -> str | None:
    """None when onnxruntime can run on `device`, else the reason shown in the report row."""
    provider = DEVICE_PROVIDERS[device]
    if provider in ort.get_available_providers():
        return None
    return f"unavailable: no {provider}"


def calibrate(repeats: int = CALIBRATION_REPEATS) -> float:
    """Median milliseconds of the fixed calibration workload on this machine, now."""
    rows, inner, cols = CALIBRATION_SHAPE
    rng = np.random.default_rng(0)
    left = rng.standard_normal((rows, inner), dtype=np.float32)
    right = rng.standard_normal((inner, cols), dtype=np.float32)
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(CALIBRATION_MATMULS):
            np.einsum("ij,jk->ik", left, right, optimize=False)
        timings.append((time.perf_counter() - started) * 1000.0)
    return float(np.median(timings))


def gpu_names() -> list[str]:
    """GPU names from nvidia-smi; empty when there is none (or no driver)."""
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return []
    try:
        output = subprocess.run(
            [executable, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in output.splitlines() if line.strip()]


def source_revision() -> str:
    """The git commit of the onnxrank that runs (``-dirty`` when files differ), when it runs from
    a checkout; else the installed version (a wheel carries no commit)."""
    checkout = Path(__file__).resolve().parents[2]  # the directory that holds onnxrank/
    try:
        version = metadata.version("onnxrank")
    except metadata.PackageNotFoundError:
        version = "unknown"
    if not (checkout / ".git").exists():
        return f"not a git checkout: onnxrank {version} installed at {checkout}"
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=checkout, capture_output=True, text=True,
            timeout=10,
        )
        if head.returncode != 0:
            return "unknown (no commit)"
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=checkout,
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown (git not available)"
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def machine_info() -> dict[str, Any]:
    """JSON-ready facts about the machine and software of this run."""
    return {
        "cpu_model": cpu_model(),
        "usable_cores": usable_cpus(),
        "gpus": gpu_names(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "onnxruntime": ort.__version__,
        "openvino": _version("openvino"),
        # beside the machine class read from the CPU flags: what OpenVINO computes natively
        "openvino_capabilities": _openvino_capabilities(),
        "available_providers": ort.get_available_providers(),
        "git_commit": source_revision(),
    }


def _openvino_capabilities() -> list[str] | str:
    try:
        return cpu_capabilities()
    except MissingDependencyError as err:
        return f"not installed: {err}"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"
