"""What every export stage after the reference reads: one frozen ExportContext, built once.

The stages (onnxrank.export.pipeline, onnxrank.export.variants) receive it as an argument and
return what they made (a BuiltVariant) instead of writing into shared dictionaries. The names
of the work directory's files and the manifest's package versions, which every export route
(onnxrank.export.pipeline.EXPORT_ROUTES) writes alike, are here too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxrank._optional import require

if TYPE_CHECKING:
    from onnxrank.engine.variants import RunAs
    from onnxrank.export.families import Family
    from onnxrank.export.fidelity import FidelityThresholds
    from onnxrank.export.quantize import Int8Settings
    from onnxrank.export.quantize_openvino import OvInt8Settings
    from onnxrank.export.tasks import ExportTask
    from onnxrank.export.validate import ValidationInputs

logger = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"
# where variants are built inside the work directory before the kept ones move up
SCRATCH_DIR = ".scratch"
# the packages whose versions a manifest records
VERSIONED_PACKAGES = ("onnxrank", "torch", "transformers", "onnx", "onnxruntime",
                      "sentence-transformers", "tokenizers", "openvino", "nncf")


class Progress:
    """Logs each step as it starts and ticks a tqdm bar (when shown) that names it."""

    def __init__(self, show: bool) -> None:
        self.show = show
        self._bar = None
        if show:
            tqdm = require("tqdm", extra="export").tqdm
            self._bar = tqdm(desc="export", unit="step")

    def step(self, name: str) -> None:
        logger.info("export step: %s", name)
        if self._bar is not None:
            self._bar.set_postfix_str(name, refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


@dataclass(frozen=True, slots=True)
class ExportContext:
    """The fp32 export, its reference outputs and the request's settings, for every variant step.

    Attributes:
        task: The export's task (onnxrank.export.tasks).
        family: The checkpoint's family (onnxrank.export.families).
        config: The transformers config.
        input_names: The graph's inputs (the family's answer); what every calibration feed holds.
        paths: Variant name -> its file in the scratch directory.
        inputs: The encoded validation pairs.
        calibration: The encoded calibration pairs.
        reference: The PyTorch reference's outputs on `inputs`.
        thresholds: The fidelity thresholds every gate applies.
        int8: The onnxruntime int8 recipes (the int8 ladder's rungs, before the family's filter).
        ov_int8: The OpenVINO int8 recipes (the ov_int8 ladder's rungs).
        progress: Where each step is announced.
    """

    task: ExportTask
    family: Family
    config: Any
    input_names: tuple[str, ...]
    paths: Mapping[str, Path]
    inputs: ValidationInputs
    calibration: ValidationInputs
    reference: np.ndarray
    thresholds: FidelityThresholds
    int8: tuple[Int8Settings, ...]
    ov_int8: tuple[OvInt8Settings, ...]
    progress: Progress

    @property
    def layers(self) -> int:
        """The model's layer count (caps the ladders' fp32 layers)."""
        return int(self.config.num_hidden_layers)

    def graph_feeds(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`feeds` cut to the graph's inputs (the pair encoder may make token types the graph
        does not take)."""
        return {name: feeds[name] for name in self.input_names}

    def calibration_rows(self) -> list[dict[str, np.ndarray]]:
        """The calibration pairs one unpadded row per item, cut to the graph's inputs: what
        NNCF calibrates on and what the position-0 split reads ranges from."""
        return [self.graph_feeds(feeds) for feeds in self.calibration.single_rows()]


@dataclass(frozen=True, slots=True)
class BuiltVariant:
    """A variant's file, built and measured: its manifest records.

    Attributes:
        fidelity: The fidelity metrics against the reference (VariantSpec.fidelity).
        quantization: VariantSpec.quantization (with a ladder's ``attempts``), or None.
        optimization: VariantSpec.optimization, or None.
        outputs: The file's outputs on the validation rows, per way its gates ran it (the first
            of its facts' ``runs_as``, and each bf16 record's): what its prefix graph's gate
            compares with, without running the whole rows again.
        extra_files: Files its build wrote beside it that only some exports have (the
            external data of an fp16 graph over protobuf's limit); its facts' own are always
            there.
    """

    fidelity: dict[str, Any]
    quantization: dict[str, Any] | None = None
    optimization: dict[str, Any] | None = None
    outputs: dict[RunAs, np.ndarray] = field(default_factory=dict)
    extra_files: tuple[str, ...] = ()

    def attempts(self) -> dict[str, Any]:
        """The ladder attempts it made, as a failed_variants entry's ``attempts`` (or nothing),
        with the rung its ladder kept when that was not the last (``kept_attempt``,
        ``kept_because``)."""
        quantization = self.quantization or {}
        return {key: quantization[key] for key in ("attempts", "kept_attempt", "kept_because")
                if key in quantization}


class VariantFailed(Exception):
    """A variant's build or gate failed: it is recorded in failed_variants and left out."""

    def __init__(self, stage: str, reason: str, **details: Any) -> None:
        super().__init__(reason)
        self.entry = {"stage": stage, "reason": reason, **details}


def first_line(err: BaseException) -> str:
    """An exception as one line for a failed_variants entry: its type and first message line."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else 'no message'}"


def package_versions() -> dict[str, str]:
    """The manifest's ``versions``: each of VERSIONED_PACKAGES' installed version, or
    ``not installed``."""
    versions = {}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions
