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
# 13.7 GiB for 2.2 GiB of fp32 weights (docs/decoders.md, "Memory"). Small models' peaks are mostly
# the fixed cost (the MiniLM stand-in: 5.0 GB), so for them this is a lower bound, which is all a
# check that refuses must be.
PEAK_PER_WEIGHT_BYTE = 5.3
# The same for the weight-compressed route (onnxrank.export.direct_openvino), per byte of the
# weights in the checkpoint's own dtype: a Qwen3-4B-shaped decoder in bfloat16 (7.5 GiB)
# peaked at 18.5 GiB resident while validating its IR (docs/decoders.md, "Memory"). Of that, 11.7
# GiB were file pages (the mapped checkpoint and IR) and 7.7 GB private, so this is an upper
# bound of what the kernel must find.
DIRECT_PEAK_PER_WEIGHT_BYTE = 2.2
PEAK_BASE_BYTES = 2 * 2**30
GIB = 2**30


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    """What an export of one checkpoint needs, against what the machine has.

    Attributes:
        weights: The checkpoint's parameter count.
        needed_bytes: Estimated peak resident memory of the export.
        available_bytes: Memory the machine has available now (psutil's ``available``).
        dtype: The dtype the weights load in (float32, or the checkpoint's own on the
            weight-compressed route).
        weight_bytes: The weights' size in that dtype.
        direct: Whether this is the weight-compressed route's estimate.
    """

    weights: int
    needed_bytes: int
    available_bytes: int
    dtype: str
    weight_bytes: int
    direct: bool

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


def checkpoint_dtype(config: Any) -> str:
    """The dtype the checkpoint's weights are saved in (its config's), float32 when unsaid."""
    saved = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return str(saved).removeprefix("torch.") if saved is not None else "float32"


def estimate_memory(model_class: Any, config: Any, *, direct: bool = False) -> MemoryEstimate:
    """The export's estimated peak for a checkpoint of `config`, and the memory available now.

    Args:
        direct: Estimate the weight-compressed route (the weights in the checkpoint's dtype)
            instead of the fp32 one.
    """
    return route_estimate(weight_count(meta_model(model_class, config)), config, direct=direct)


def route_estimate(weights: int, config: Any, *, direct: bool) -> MemoryEstimate:
    """`estimate_memory` for a checkpoint of `weights` parameters already counted: one route's
    estimate from another's (`MemoryEstimate.weights`) without building the model again."""
    psutil = require("psutil", extra="export")
    torch = require("torch", extra="export")
    dtype = checkpoint_dtype(config) if direct else "float32"
    weight_bytes = weights * getattr(torch, dtype).itemsize
    factor = DIRECT_PEAK_PER_WEIGHT_BYTE if direct else PEAK_PER_WEIGHT_BYTE
    return MemoryEstimate(weights, PEAK_BASE_BYTES + int(factor * weight_bytes),
                          int(psutil.virtual_memory().available), dtype, weight_bytes, direct)


def check_fits(found: MemoryEstimate, location: str,
               direct: MemoryEstimate | None = None) -> None:
    """Stop an export that would not fit.

    Args:
        found: The estimate of the route the export takes.
        direct: The weight-compressed route's estimate, when the export takes the fp32 route
            and its family could take the other: the error then says what it would need.

    Raises:
        ExportError: The estimated peak exceeds the available memory; says both.
    """
    if found.fits:
        return
    how = ("which the weight-compressed route converts and validates from" if found.direct
           else "which the export traces and validates in")
    advice = f"export it on a machine with at least {found.needed_bytes / GIB:.0f} GiB free"
    if direct is not None:
        advice += (f", or export the weight-only int8 IR alone (--variants ov_int8), which "
                   f"converts the weights in {direct.dtype} and needs about "
                   f"{direct.needed_bytes / GIB:.0f} GiB")
    raise ExportError(
        f"exporting {location} needs about {found.needed_bytes / GIB:.0f} GiB of memory "
        f"({found.weights / 1e9:.2f}B weights, "
        f"{found.weight_bytes / GIB:.1f} GiB in {found.dtype}, {how}), but this "
        f"machine has {found.available_bytes / GIB:.1f} GiB available: {advice}"
    )

