"""The interface every inference backend implements, and what it reports about itself."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from onnxrank.errors import ModelLoadError
from onnxrank.types import Device

GRAPH_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What is actually running a model, and why it was chosen.

    Attributes:
        device: ``cpu`` or ``cuda``.
        backend: ``onnxruntime`` or ``openvino``.
        provider: The execution provider or runtime device that attached.
        variant: The manifest variant whose file runs (fp32, opt, int8, fp16, ov_int8).
        precision: What the arithmetic runs in (fp32, int8, fp16, bf16).
        model_file: Path of the file that runs.
        runtime_version: Version of the backend's runtime package.
        threads: Intra-op threads.
        reason: Why this backend and precision run (requested, only candidate, probed, cached).
    """

    device: str
    backend: str
    provider: str
    variant: str
    precision: str
    model_file: str
    runtime_version: str
    threads: int
    reason: str = ""


class ModelRunner(ABC):
    """One loaded model file; `run` is safe to call from several threads."""

    info: DeviceInfo
    input_names: tuple[str, ...]

    def check_inputs(self) -> None:
        """Raise ModelLoadError when the graph declares inputs that onnxrank does not feed."""
        unknown = set(self.input_names) - set(GRAPH_INPUTS)
        if unknown:
            raise ModelLoadError(
                f"{self.info.model_file} declares inputs {sorted(unknown)} that onnxrank does not "
                f"provide; supported inputs: {', '.join(GRAPH_INPUTS)}"
            )

    @abstractmethod
    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """The first output for one batch; `feeds` may hold inputs the graph does not declare.

        Raises:
            InferenceError: The runtime failed.
        """

    def with_reason(self, reason: str) -> ModelRunner:
        """This runner, its DeviceInfo saying why it was chosen."""
        from dataclasses import replace

        self.info = replace(self.info, reason=reason)
        return self


class Backend(ABC):
    """A runtime that can open exported files.

    Attributes:
        name: The name users pass as ``backend=``.
        variants: precision -> the manifest variant whose file that precision runs.
        preference: Per device, precisions from fastest to slowest as expected on typical
            hardware.
        auto_candidates: How many of the first runnable preferred precisions enter the
            ``auto`` probe, which times them on the machine itself.
    """

    name: ClassVar[str]
    variants: ClassVar[dict[str, str]]
    preference: ClassVar[dict[Device, tuple[str, ...]]]
    auto_candidates: ClassVar[int] = 1

    @abstractmethod
    def unavailable_reason(self, device: Device, precision: str) -> str | None:
        """None when this backend can run `precision` on `device` here, else why not."""

    @abstractmethod
    def open(self, path: Path, *, device: Device, precision: str, variant: str,
             threads: int) -> ModelRunner:
        """Load one file.

        Raises:
            ModelLoadError: The file cannot be loaded.
            DeviceUnavailableError: The device did not attach.
        """
