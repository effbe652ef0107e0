"""The attention the exported decoder graphs trace: transformers' eager attention, with each key
and value head read by its group of query heads instead of copied to them.

Qwen3, Qwen2 and Gemma decoders share every key/value head among several query heads (grouped
query attention). transformers' eager attention repeats each key and value head once per query
head (``repeat_kv``) before its matmuls; traced, that is a Broadcast, a Multiply and a copy of
every layer's keys and values per batch, which OpenVINO's CPU plugin ran with a reference kernel
in float32. Without them a batch of Qwen3-0.6B's shape (16 query, 8 key/value heads) ran 7%
faster through the prefix graph and 9% through the whole-row graph (avx512_vnni_bf16, OpenVINO
int8+bf16; docs/export.md, "Decoder attention").

Here the query heads of one key/value head are stacked along the sequence axis instead, so one
matmul reads the shared head for all of them: the same dot products, the same softmax, with
nothing repeated but the [batch, 1, queries, keys] mask.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from onnxrank._optional import require

if TYPE_CHECKING:
    import torch

# the name the attention is registered under in transformers' AttentionInterface
GROUPED_ATTENTION = "onnxrank_grouped_eager"


def grouped_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' eager attention (an AttentionInterface function) without ``repeat_kv``.

    Query head ``h`` reads key/value head ``h // groups`` (repeat_kv's order), so the query
    heads [batch, heads, Q, head_dim] regroup as [batch, kv_heads, groups x Q, head_dim], group
    major, and the additive mask [batch, 1, Q, keys] repeats ``groups`` times along its query
    axis to match. Inference only: `dropout` and the other keyword arguments (a sliding window,
    which the graphs' own mask already says) are not used.

    Returns:
        The attention output [batch, Q, heads, head_dim] and no attention weights.
    """
    torch = require("torch", extra="export")
    batch, heads, length, head_dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    stacked = query.reshape(batch, kv_heads, groups * length, head_dim)
    weights = torch.matmul(stacked, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask[:, :, :, : key.shape[-2]].repeat(1, 1, groups, 1)
    weights = torch.nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    output = torch.matmul(weights, value).reshape(batch, heads, length, head_dim)
    return output.transpose(1, 2).contiguous(), None


@contextmanager
def grouped_attention_for(config: Any) -> Iterator[None]:
    """Run the decoder of `config` with `grouped_attention` inside the block (while a graph is
    traced), and with its own attention implementation again after it.

    Only the exported graphs use it: the export's PyTorch reference runs the model as loaded.
    """
    transformers = require("transformers", extra="export")
    transformers.AttentionInterface.register(GROUPED_ATTENTION, grouped_attention)
    own = config._attn_implementation
    config._attn_implementation = GROUPED_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = own
