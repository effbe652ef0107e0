"""The weight-compressed route: a checkpoint converted straight from PyTorch, in its own dtype,
to the weight-only int8 OpenVINO IR, with no fp32 copy.

The default route traces an fp32 ONNX graph and builds every variant from it, which holds the
weights in fp32 several times over (onnxrank.export.memory: a 4B decoder would need about 81
GiB). An export that asks for the weight-only int8 IR alone (``--variants ov_int8``) of a family
that converts (`Family.direct_openvino`: the decoders) takes this route instead:

1. the checkpoint loads in its own dtype (bfloat16 for the published Qwen3-Reranker-4B/8B);
2. openvino.convert_model converts the family's score graph, its weights shared with PyTorch;
3. NNCF compresses its weights to int8 (the family's fp32 ops, a decoder's score head, kept in
   float) and the IR is saved; then the prefix graph the same way, so that one compressed copy
   is in memory at a time;
4. the PyTorch reference runs on the loaded model in float32 arithmetic (the family's
   reference runner upcasts one module's weights at a time), as the IR computes, and the IR is
   gated like every ov_int8.

No fp32 file is written: the manifest has no fp32 variant; the quantization record says which
dtype the weights were converted from.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxrank._optional import require
from onnxrank.export.context import first_line
from onnxrank.export.quantize_openvino import compress_int8_weights, weight_only_record

if TYPE_CHECKING:
    from onnxrank.export.families import Family
    from onnxrank.export.loaded import LoadedModel

logger = logging.getLogger(__name__)

# the one variant the route builds
DIRECT_VARIANT = "ov_int8"


def takes_direct_route(family: Family, variants: tuple[str, ...]) -> bool:
    """Whether an export of `variants` takes this route: the family converts, and the request
    asks for the weight-only int8 IR alone."""
    return family.direct_openvino and tuple(variants) == (DIRECT_VARIANT,)


@dataclass(frozen=True, slots=True)
class ConvertedGraphs:
    """What the route wrote.

    Attributes:
        quantization: The IR's ``quantization`` record.
        prefix_graph: The prefix IR's extra files (its .bin), its failed_variants entry when it
            could not be converted, or None for a family without one.
    """

    quantization: dict[str, Any]
    prefix_graph: tuple[str, ...] | dict[str, Any] | None


def convert_compressed(loaded: LoadedModel, family: Family, out_path: Path,
                       prefix_path: Path | None) -> ConvertedGraphs:
    """Write the weight-only int8 IR of `loaded.model` at `out_path`, and its prefix graph's at
    `prefix_path` (None: no prefix graph), converted from the weights as loaded.

    Raises:
        Exception: Whatever openvino.convert_model or NNCF raise on the main graph (the
            pipeline turns it into an ExportError naming the family); a prefix graph that
            fails is recorded in the result instead.
    """
    dtype = str(loaded.model.dtype).removeprefix("torch.")
    kept = _write_compressed(family.convert_graph(loaded), family, out_path)
    quantization = weight_only_record(
        kept, source=f"the PyTorch checkpoint in {dtype} (openvino.convert_model; no fp32 file)",
        nodes_kept_fp32=kept,
        reference=f"the PyTorch checkpoint's {dtype} weights in float32 arithmetic")
    if prefix_path is None:
        return ConvertedGraphs(quantization, None)
    try:
        prefix = family.convert_prefix_graph(loaded)
        if prefix is None:
            return ConvertedGraphs(quantization, None)
        _write_compressed(prefix, family, prefix_path)
    except Exception as err:  # the whole-row IR still serves: record and go on
        logger.debug("the prefix graph could not be converted", exc_info=True)
        return ConvertedGraphs(quantization, {"stage": "build", "reason": first_line(err)})
    return ConvertedGraphs(quantization, (prefix_path.with_suffix(".bin").name,))


def _write_compressed(model: Any, family: Family, out_path: Path) -> list[str]:
    """Compress `model`'s weights, save it at `out_path` and let both copies go; returns the
    ops kept in float."""
    openvino = require("openvino", extra="openvino")
    kept = family.fp32_ops(model)
    compressed = compress_int8_weights(model, kept)
    del model  # its weights are PyTorch's; the compressed copy is the one to drop
    openvino.save_model(compressed, str(out_path), compress_to_fp16=False)
    del compressed
    gc.collect()
    logger.info("converted and compressed %s (weight-only int8)", out_path.name)
    return kept
