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

The rotary embedding is traced as an outer product too (`outer_product_rotary`): transformers 5
computes its angles as a broadcast multiply, transformers 4 as a matmul; the numbers are the same
in float32, but with the multiply OpenVINO's bf16 hint ran the final norm of the whole-row graph in
bf16 and that of the prefix graph in float32, so a row's bf16 score moved by up to 0.14 x the
spread between the two graphs (tiny Qwen3 stand-in, OpenVINO 2026.4 on an AMX CPU; 0 with the
matmul, as under transformers 4).
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


@contextmanager
def outer_product_rotary(body: Any) -> Iterator[None]:
    """Run the rotary embedding of the decoder `body` (``body.rotary_emb``) with its angles as a
    matmul, ``inv_freq [batch, half, 1] @ positions [batch, 1, sequence]``, inside the block.

    Each angle is one float32 product either way (the matmul's inner dimension is 1), so the
    cosines and sines are bit for bit the module's own; only the traced graph differs (see the
    module docstring). A rotary embedding whose frequencies depend on the length (``dynamic``
    and ``longrope`` rope types), or without the ``inv_freq`` / ``attention_scaling`` it reads,
    runs its own forward.
    """
    rotary: Any = getattr(body, "rotary_emb", None)
    rope_type = getattr(rotary, "rope_type", None)
    if not isinstance(rope_type, str) or "dynamic" in rope_type or rope_type == "longrope" \
            or not hasattr(rotary, "inv_freq") or not hasattr(rotary, "attention_scaling"):
        yield
        return
    torch = require("torch", extra="export")

    def forward(x: Any, position_ids: Any) -> tuple[Any, Any]:
        inv_freq = rotary.inv_freq.to(device=x.device, dtype=torch.float32)
        angles = (inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1)
                  @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((angles, angles), dim=-1)
        return ((emb.cos() * rotary.attention_scaling).to(x.dtype),
                (emb.sin() * rotary.attention_scaling).to(x.dtype))

    own = rotary.__dict__.get("forward")
    rotary.forward = forward
    try:
        yield
    finally:
        if own is None:
            del rotary.forward
        else:
            rotary.forward = own
