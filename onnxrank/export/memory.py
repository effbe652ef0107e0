"""Will the export fit in memory? Checked before the weights load, so a checkpoint too large for
the machine fails in seconds with the memory it needs, instead of being killed by the kernel
minutes later (an OOM kill cannot be caught: it takes every finished variant with it).

The estimate counts the checkpoint's weights without allocating them (the model built on
PyTorch's ``meta`` device from its config) and scales them by what an export holds at its peak:
the PyTorch model in fp32, the traced graph and its serialised copy, the OpenVINO models that
compress and validate it. `PEAK_PER_WEIGHT_BYTE` is measured, not guessed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onnxrank._optional import require
from onnxrank.errors import ExportError

# Peak resident bytes of an export per byte of fp32 weights, above a fixed cost (interpreter,
# torch, onnxruntime, OpenVINO, the tokenizer): a Qwen3-0.6B-shaped decoder's export peaked at
# 13.7 GiB for 2.2 GiB of fp32 weights (docs/export.md, "Memory"). Small models' peaks are mostly
# the fixed cost (the MiniLM stand-in: 5.0 GB), so for them this is a lower bound, which is all a
# check that refuses must be.
PEAK_PER_WEIGHT_BYTE = 5.3
PEAK_BASE_BYTES = 2 * 2**30
GIB = 2**30


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """What an export of one checkpoint needs, against what the machine has.

    Attributes:
        weights: The checkpoint's parameter count.
        needed_bytes: Estimated peak resident memory of the export.
        available_bytes: Memory the machine has available now (psutil's ``available``).
    """

    weights: int
    needed_bytes: int
    available_bytes: int

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.available_bytes


def meta_model(model_class: Any, config: Any) -> Any:
    """`model_class` built from `config` on PyTorch's meta device: its shapes, no memory used."""
    torch = require("torch", extra="export")
    with torch.device("meta"):
        return model_class.from_config(config)


def weight_count(module: Any) -> int:
    """Parameters of a PyTorch module (a tied one counted once)."""
    return sum(parameter.numel() for parameter in module.parameters())


def estimate_memory(model_class: Any, config: Any) -> MemoryEstimate:
    """The export's estimated peak for a checkpoint of `config`, and the memory available now."""
    psutil = require("psutil", extra="export")
    weights = weight_count(meta_model(model_class, config))
    needed = PEAK_BASE_BYTES + int(PEAK_PER_WEIGHT_BYTE * 4 * weights)
    return MemoryEstimate(weights, needed, int(psutil.virtual_memory().available))


def check_fits(found: MemoryEstimate, location: str) -> None:
    """Stop an export that would not fit.

    Raises:
        ExportError: The estimated peak exceeds the available memory; says both.
    """
    if found.fits:
        return
    raise ExportError(
        f"exporting {location} needs about {found.needed_bytes / GIB:.0f} GiB of memory "
        f"({found.weights / 1e9:.2f}B weights, {4 * found.weights / GIB:.1f} GiB in fp32, which "
        f"the export traces and validates in), but this machine has "
        f"{found.available_bytes / GIB:.1f} GiB available: export it on a machine with at least "
        f"{found.needed_bytes / GIB:.0f} GiB free"
    )
