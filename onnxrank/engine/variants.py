"""The exported variants as plain facts: one entry each, read by the engine and the export.

A variant is one model file in an exported directory. Its entry says what the file is called,
its numeric precision, which runtime precisions run it (and under which fidelity record of the
manifest each one's gate result lives), which files it needs beside it, whether it runs on a
CPU and, for decoder rerankers, its prefix graph's file (onnxrank.engine.prefix).
onnxrank.engine.spec.VARIANT_NAMES and the backends' precision maps are derived from VARIANTS;
how the export builds and gates each variant is onnxrank.export.variants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Precision = Literal["fp32", "fp16", "int8"]


@dataclass(frozen=True, slots=True)
class RunAs:
    """One way the engine runs a variant's file.

    Attributes:
        backend: The engine backend's name (``onnxruntime``, ``openvino``).
        precision: The precision users pass to that backend (``fp32``, ``bf16``, ``int8+bf16``).
        fidelity_key: For a precision that runs the file differently from how the variant's gate
            measured it (OpenVINO bf16 on model.onnx): the key of its own record under the
            variant's ``fidelity`` in the manifest; None when the variant's gate covers it.
    """

    backend: str
    precision: str
    fidelity_key: str | None = None


@dataclass(frozen=True, slots=True)
class VariantFacts:
    """One variant of an exported model directory.

    Attributes:
        name: The manifest's variant name.
        file: Its file in the model directory.
        precision: The manifest's ``precision`` of the file.
        runs_as: The backend precisions that run the file; the first is how the export's gate
            validates it.
        extra_files: Files the variant needs beside its own (an OpenVINO IR's weights).
        cpu: Whether it runs on a CPU (an export needs at least one CPU variant to pass).
        prefix_file: Its prefix graph's file, written for decoder rerankers (the manifest's
            ``prefix_graphs``); None when the variant has none.
    """

    name: str
    file: str
    precision: Precision
    runs_as: tuple[RunAs, ...]
    extra_files: tuple[str, ...] = ()
    cpu: bool = True
    prefix_file: str | None = None


VARIANTS: dict[str, VariantFacts] = {facts.name: facts for facts in (
    VariantFacts("fp32", "model.onnx", "fp32", (
        RunAs("onnxruntime", "fp32"), RunAs("openvino", "fp32"),
        RunAs("openvino", "bf16", fidelity_key="openvino_bf16")),
        prefix_file="model_prefix.onnx"),
    VariantFacts("opt", "model_opt.onnx", "fp32", (RunAs("onnxruntime", "opt"),)),
    VariantFacts("int8", "model_int8.onnx", "int8", (RunAs("onnxruntime", "int8"),)),
    VariantFacts("fp16", "model_fp16.onnx", "fp16", (RunAs("onnxruntime", "fp16"),), cpu=False,
                 prefix_file="model_prefix_fp16.onnx"),
    VariantFacts("ov_int8", "model_ov_int8.xml", "int8", (
        RunAs("openvino", "int8"),
        RunAs("openvino", "int8+bf16", fidelity_key="openvino_int8_bf16")),
        extra_files=("model_ov_int8.bin",), prefix_file="model_prefix_ov_int8.xml"),
)}


def backend_variants(backend: str) -> dict[str, str]:
    """precision -> the variant whose file `backend` runs at that precision."""
    return {run.precision: facts.name for facts in VARIANTS.values()
            for run in facts.runs_as if run.backend == backend}


def fidelity_keys(backend: str) -> dict[str, str]:
    """precision -> its own fidelity record's key, for `backend`'s precisions that have one."""
    return {run.precision: run.fidelity_key for facts in VARIANTS.values()
            for run in facts.runs_as if run.backend == backend and run.fidelity_key is not None}
