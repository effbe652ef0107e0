"""PyTorch -> ONNX: the fp32 graph (model.onnx) with dynamic batch and sequence axes.

We call ``torch.onnx.export(..., dynamo=False)`` (the TorchScript exporter) on an eager-attention
model rather than optimum's exporter or the dynamo exporter: its BERT graph is the pattern
onnxruntime's transformer optimizer was written against, so Attention/SkipLayerNormalization/
EmbedLayerNormalization fusions all fire (docs/export.md has the counts), and it lets us put the
embedding pooling inside the graph with a ten-line wrapper.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxrank._optional import require

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

DEFAULT_OPSET = 17
# protobuf's limit on one ONNX file: larger graphs keep their weights in one external data file
# beside it, named `<file name>EXTERNAL_DATA_SUFFIX`
PROTOBUF_LIMIT_BYTES = 2**31 - 1
EXTERNAL_DATA_SUFFIX = ".data"


def logits_graph(model: Any, input_names: tuple[str, ...]) -> torch.nn.Module:
    """A transformers ``*ForSequenceClassification`` whose forward takes the graph inputs
    positionally and returns its logits [batch, num_labels].

    Args:
        model: The classification model (or its [CLS]-only copy).
        input_names: The graph inputs in order, a prefix-free subset of
            (input_ids, attention_mask, token_type_ids) that always starts with the first two.
    """
    torch = require("torch", extra="export")

    class RerankGraph(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: Any) -> Any:
            return self.model(**dict(zip(input_names, inputs))).logits

    return RerankGraph().eval()


def mean_pooled_graph(model: Any, input_names: tuple[str, ...]) -> torch.nn.Module:
    """A bare transformers encoder (``AutoModel``) whose forward takes the graph inputs
    positionally and returns its last hidden state mean-pooled over the attention mask and
    L2-normalised [batch, hidden] (what sentence-transformers' Transformer -> Pooling(mean) ->
    Normalize computes).

    Args:
        model: The encoder.
        input_names: The graph inputs in order (see logits_graph).
    """
    torch = require("torch", extra="export")

    class EmbeddingGraph(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: Any) -> Any:
            feeds = dict(zip(input_names, inputs))
            hidden = self.model(**feeds).last_hidden_state
            mask = feeds["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            summed = (hidden * mask).sum(dim=1)
            # same clamp as sentence-transformers' Pooling, so all-padding rows do not divide by 0
            pooled = summed / mask.sum(dim=1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    return EmbeddingGraph().eval()


def export_module(
    wrapper: torch.nn.Module,
    out_path: Path,
    *,
    output_name: str,
    input_names: tuple[str, ...],
    opset: int = DEFAULT_OPSET,
) -> Path:
    """Export a graph module (inputs positionally) to an fp32 ONNX file with dynamic batch and
    sequence axes.

    Args:
        wrapper: A module whose forward takes `input_names` positionally (logits_graph,
            mean_pooled_graph).
        out_path: Target .onnx file.
        output_name: The graph's one output (the task's: ``logits`` or ``embeddings``).
        input_names: Graph inputs, e.g. ("input_ids", "attention_mask", "token_type_ids").
        opset: ONNX opset version.

    Returns:
        `out_path`.
    """
    torch = require("torch", extra="export")
    # batch 2 x sequence 16 dummy: distinct sizes so the exporter cannot confuse the two axes
    dummy = tuple(torch.ones((2, 16), dtype=torch.long) for _ in input_names)
    dynamic_axes = {name: {0: "batch", 1: "sequence"} for name in input_names}
    dynamic_axes[output_name] = {0: "batch"}
    with torch.inference_mode(), warnings.catch_warnings():
        # dynamo=False is deliberate (see the module docstring); its deprecation notice and the
        # tracer's warnings are not something the user can act on
        warnings.simplefilter("ignore")
        torch.onnx.export(
            wrapper,
            dummy,
            str(out_path),
            input_names=list(input_names),
            output_names=[output_name],
            dynamic_axes=dynamic_axes,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
    logger.info("exported %s (opset %d, inputs %s)", out_path, opset, ", ".join(input_names))
    return out_path
