"""Model FLOPs per (query, document) pair, read from the shapes of the exported fp32 graph.

A contender's *effective* operations per second are the model's FLOPs for the pairs it scored
divided by its time: the work a perfect runtime would have to do, whatever the contender actually
ran (padding, int8, a pruned last layer). Comparing that with the GEMM ceiling of the contender's
precision (onnxrank.bench.ceiling) says how much of the machine the contender uses.

Counted from the graph (onnx, extra ``bench``), per pair of ``tokens`` tokens:

1. every MatMul whose second input is a weight (initializer) ``[K, N]`` runs once per token:
   ``2·K·N`` FLOPs per token (query/key/value/output projections, feed-forward);
2. every Gemm with a weight runs once per pair (pooler, classifier head): ``2·K·N``;
3. every MatMul between two activations is attention (scores and context), ``2·tokens²·hidden``
   each, where ``hidden`` is the width of the word embeddings.

Element-wise work (softmax, LayerNorm, GELU, embeddings) is not counted: it is a few percent of the
MatMul FLOPs at these sizes, and the GEMM ceiling measures multiply-accumulate throughput only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from onnxrank._optional import require

logger = logging.getLogger(__name__)

# The shapes of the ceiling's GEMMs: a batch of 8 pairs of 100 tokens (a short-passage batch).
CEILING_PAIRS = 8
CEILING_TOKENS = 100


@dataclass(frozen=True, slots=True)
class ModelFlops:
    """FLOPs of one pair as a function of its token count, and the shapes they come from.

    Attributes:
        per_token: Weight MatMul FLOPs for every token.
        per_pair: Weight Gemm FLOPs once per pair (pooler, head).
        attention_matmuls: MatMuls between two activations (2 per layer in BERT).
        hidden: Width of the word embeddings.
        intermediate: Widest weight MatMul output (the feed-forward's inner width).
        layers: Softmax nodes in the graph (one per attention layer).
        heads: Attention heads from the model's config.json, or None when it has none.
    """

    per_token: float
    per_pair: float
    attention_matmuls: int
    hidden: int
    intermediate: int
    layers: int
    heads: int | None

    def pair(self, tokens: int) -> float:
        """FLOPs of one pair of `tokens` tokens (special tokens included)."""
        return (self.per_pair + self.per_token * tokens
                + self.attention_matmuls * 2.0 * tokens * tokens * self.hidden)

    def pairs(self, token_counts: Sequence[int]) -> float:
        """FLOPs of pairs with these token counts."""
        counts = np.asarray(token_counts, dtype=np.float64)
        return float(len(counts) * self.per_pair + self.per_token * counts.sum()
                     + self.attention_matmuls * 2.0 * self.hidden * np.square(counts).sum())


def model_flops(model_file: str | Path) -> ModelFlops:
    """Count the FLOPs of a BERT-like ONNX encoder (see the module docstring for the rules).

    Args:
        model_file: The fp32 ``model.onnx`` (the unfused graph, where every MatMul is visible).
            ``config.json`` beside it, when present, gives the number of attention heads.

    Raises:
        ValueError: The graph has no word-embedding table or no weight MatMul.
        MissingDependencyError: onnx is not installed.
    """
    onnx = require("onnx", extra="bench")
    numpy_helper = require("onnx.numpy_helper", extra="bench")
    path = Path(model_file)
    # Weights are only needed for their shapes; external data (large models) stays on disk.
    graph = onnx.load(str(path), load_external_data=False).graph
    shapes = {initializer.name: tuple(initializer.dims) for initializer in graph.initializer}
    # Constant nodes can hold weights too (some exporters fold them that way).
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            shapes[node.output[0]] = tuple(numpy_helper.to_array(node.attribute[0].t).shape)
    graph_inputs = {value.name for value in graph.input}
    hidden = next((shapes[node.input[0]][1] for node in graph.node
                   if node.op_type == "Gather" and node.input[1] in graph_inputs
                   and len(shapes.get(node.input[0], ())) == 2), None)
    if hidden is None:
        raise ValueError(f"{path} has no word-embedding Gather on a graph input; "
                         "FLOPs are counted for BERT-like encoders only")
    per_token = per_pair = 0.0
    attention = intermediate = 0
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        weight = shapes.get(node.input[1])
        if weight is None:
            attention += node.op_type == "MatMul"
            continue
        flops = 2.0 * float(np.prod(weight))
        if node.op_type == "MatMul":
            per_token += flops
            intermediate = max(intermediate, int(weight[-1]))
        else:
            per_pair += flops
    if per_token == 0:
        raise ValueError(f"{path} has no MatMul with a weight input; is it an fp32 export?")
    layers = sum(node.op_type == "Softmax" for node in graph.node)
    return ModelFlops(per_token=per_token, per_pair=per_pair, attention_matmuls=attention,
                      hidden=int(hidden), intermediate=intermediate, layers=layers,
                      heads=_config_heads(path.parent / "config.json"))


def _config_heads(config_file: Path) -> int | None:
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    heads = config.get("num_attention_heads")
    return int(heads) if isinstance(heads, int) and heads > 0 else None
