"""The interface every inference backend implements, and what it reports about itself."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from onnxrank.errors import ModelLoadError
from onnxrank.types import Device

# prefix_cache: a decoder's prefix graph (onnxrank.engine.prefix.CACHE_INPUT)
GRAPH_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "prefix_cache")
CompileCacheState = Literal["hit", "miss", "off"]


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What is actually running a model, and why it was chosen.

    Attributes:
        device: ``cpu`` or ``cuda``.
        backend: ``onnxruntime`` or ``openvino``.
        provider: The execution provider or runtime device that attached.
        variant: The manifest variant whose file runs (fp32, opt, int8, fp16, ov_int8).
        precision: What the arithmetic runs in (fp32, int8, fp16, bf16; int8+bf16 is the int8
            file with its non-quantized ops in bf16).
        model_file: Path of the file that runs.
        runtime_version: Version of the backend's runtime package.
        threads: Intra-op threads.
        reason: Why this backend and precision run (requested, only candidate, probed, cached).
        compile_cache: ``hit`` when the compiled model came from the compile cache, ``miss``
            when it was compiled (and cached), ``off`` when no compile cache applies (disabled,
            unusable, or a backend without one).
        load_ms: Time the whole load took: manifest, hashes, tokenizer, probe when one ran,
            compilation.
        batch_invariant_multiple: The padding multiple at which this runner's outputs did not
            move with their batch mates on this machine (onnxrank.engine.batch_invariance), which
            planned batches are padded to unless the settings name one; None when the runner was
            not checked (a file opened bare).
        batch_movement: The largest movement that check measured at that multiple, as a share
            of the outputs' spread; None when the runner was not checked.
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
    compile_cache: CompileCacheState = "off"
    load_ms: float = 0.0
    batch_invariant_multiple: int | None = None
    batch_movement: float | None = None


@dataclass(frozen=True, slots=True)
class CompileCache:
    """Where a backend may keep compiled models across processes.

    Attributes:
        root: The cache directory (created on first use).
        content_key: The manifest's sha256 of the file and its extra files: a re-exported model
            never reads the entries of the old one.
    """

    root: Path
    content_key: str


class ModelRunner(ABC):
    """One loaded model file; `run` is safe to call from several threads.

    Attributes:
        cpu_run_overhead_tokens: What one more run costs this runtime on the CPU, in padded
            tokens: the batch planner's per-run charge (onnxrank.engine.batching), which decides
            between padding rows to a longer batch and running them apart. 0: padding always
            costs more (onnxruntime, measured in round 1, docs/engine.md "Engine defaults").
    """

    info: DeviceInfo
    input_names: tuple[str, ...]
    # each input's declared shape, None for a dynamic axis
    input_shapes: dict[str, tuple[int | None, ...]]
    cpu_run_overhead_tokens: ClassVar[int] = 0

    def check_inputs(self) -> None:
        """Raise ModelLoadError when the graph declares inputs that onnxrank does not feed."""
        unknown = set(self.input_names) - set(GRAPH_INPUTS)
        if unknown:
            raise ModelLoadError(
                f"{self.info.model_file} declares inputs {sorted(unknown)} that onnxrank does not "
                f"provide; supported inputs: {', '.join(GRAPH_INPUTS)}"
            )

    @abstractmethod
    def run(self, feeds: dict[str, np.ndarray], output: str | None = None) -> np.ndarray:
        """The first output for one batch, or the output named `output`; `feeds` may hold
        inputs the graph does not declare.

        Raises:
            InferenceError: The runtime failed.
        """

    def with_info(self, **changes: Any) -> ModelRunner:
        """This runner, with DeviceInfo fields replaced (why it was chosen, how long it loaded)."""
        self.info = replace(self.info, **changes)
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
        gate_records: precision -> the key of its own fidelity record under its variant's
            ``fidelity`` in the manifest, for precisions that run the variant's file differently
            from how the variant's gate measured it (OpenVINO bf16 on model.onnx). Such a
            precision enters ``auto`` only when that record says it passed.
    """

    name: ClassVar[str]
    variants: ClassVar[dict[str, str]]
    preference: ClassVar[dict[Device, tuple[str, ...]]]
    auto_candidates: ClassVar[int] = 1
    gate_records: ClassVar[dict[str, str]] = {}

    @abstractmethod
    def unavailable_reason(self, device: Device, precision: str) -> str | None:
        """None when this backend can run `precision` on `device` here, else why not."""

    @abstractmethod
    def open(self, path: Path, *, device: Device, precision: str, variant: str,
             threads: int, compile_cache: CompileCache | None = None) -> ModelRunner:
        """Load one file; a backend that compiles may keep the result in `compile_cache`.

        Raises:
            ModelLoadError: The file cannot be loaded.
            DeviceUnavailableError: The device did not attach.
        """
