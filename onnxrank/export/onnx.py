"""PyTorch -> ONNX: the fp32 graph (model.onnx) with dynamic batch and sequence axes.

Two exporters, each family naming its own (``Family.exporters``; ``--exporter`` overrides it), the
manifest's ``family.exporter`` recording which one wrote the file:

* ``torchscript``: ``torch.onnx.export(..., dynamo=False)``, tracing an eager-attention model. Its
  BERT graph is the pattern onnxruntime's transformer optimizer was written against, so Attention,
  SkipLayerNormalization and EmbedLayerNormalization fusions all fire (the dynamo graph of the
  same model gets no Attention or EmbedLayerNormalization fusion; docs/export.md has the counts).
  torch deprecates it as of 2.11; its notices are not something the user can act on, so they are
  silenced here.
* ``dynamo``: ``torch.export`` with ``dynamic_shapes`` and onnxscript's translation (torch's
  default since 2.9 and what replaces TorchScript when torch drops it), gated like any other graph.

Both take a ten-line wrapper that puts the embedding pooling inside the graph.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from onnxrank._optional import require
from onnxrank.export.dependency_logs import dependency_logs_quieted

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

DEFAULT_OPSET = 17
# protobuf's limit on one ONNX file: larger graphs keep their weights in one external data file
# beside it, named `<file name>EXTERNAL_DATA_SUFFIX`
PROTOBUF_LIMIT_BYTES = 2**31 - 1
EXTERNAL_DATA_SUFFIX = ".data"
Exporter = Literal["torchscript", "dynamo"]
EXPORTERS: tuple[Exporter, ...] = ("torchscript", "dynamo")
EXPORTER_LOGGERS = ("torch.onnx", "onnxscript")
# torch.export's translation writes opset-18 operators (Split's num_outputs, in ModernBERT's
# graph), which its down-conversion to 17 leaves invalid: the dynamo exporter writes 18 or above
DYNAMO_MIN_OPSET = 18


def check_exporter(exporter: str) -> None:
    """Raise ValueError naming EXPORTERS unless `exporter` is one of them."""
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {', '.join(EXPORTERS)}, got {exporter!r}")


def exporter_opset(exporter: Exporter | None, opset: int) -> int:
    """The opset `exporter` writes when asked for `opset` (the manifest records this one)."""
    return max(opset, DYNAMO_MIN_OPSET) if exporter == "dynamo" else opset


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
    exporter: Exporter = "torchscript",
    per_token_output: bool = False,
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
        exporter: ``torchscript`` or ``dynamo`` (see the module docstring).
        per_token_output: The output has a sequence axis too ([batch, sequence, ...]: token
            vectors), not only a batch axis.

    Returns:
        `out_path`.

    Raises:
        ValueError: `exporter` is not one of EXPORTERS.
    """
    check_exporter(exporter)
    torch = require("torch", extra="export")
    # batch 2 x sequence 16 dummy: distinct sizes so the exporter cannot confuse the two axes
    dummy = tuple(torch.ones((2, 16), dtype=torch.long) for _ in input_names)
    with torch.inference_mode() if exporter == "torchscript" else contextlib.nullcontext(), \
            _exporter_quiet():
        if exporter == "torchscript":
            dynamic_axes = {name: {0: "batch", 1: "sequence"} for name in input_names}
            dynamic_axes[output_name] = {0: "batch", 1: "sequence"} if per_token_output \
                else {0: "batch"}
            torch.onnx.export(wrapper, dummy, str(out_path), input_names=list(input_names),
                              output_names=[output_name], dynamic_axes=dynamic_axes,
                              opset_version=opset, do_constant_folding=True, dynamo=False)
        else:
            batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
            # one entry: the wrapper's forward takes its inputs as *inputs
            shapes = (tuple({0: batch, 1: sequence} for _ in input_names),)
            torch.onnx.export(wrapper, dummy, str(out_path), input_names=list(input_names),
                              output_names=[output_name], dynamic_shapes=shapes,
                              opset_version=opset, dynamo=True, optimize=True,
                              external_data=False, verbose=False)
    logger.info("exported %s with the %s exporter (opset %d, inputs %s)", out_path, exporter, opset,
                ", ".join(input_names))
    return out_path


@contextlib.contextmanager
def _exporter_quiet() -> Iterator[None]:
    """TorchScript's deprecation notice, the tracer's and torch.export's warnings, and the log
    lines of torch.onnx (one per torchvision operator it cannot register) and onnxscript (its
    opset conversion's fallback) say nothing the user can act on: warnings are off, and those
    loggers log at onnxrank's level (at least ERROR), for the export's duration."""
    with dependency_logs_quieted(*EXPORTER_LOGGERS, floor=logging.ERROR), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
