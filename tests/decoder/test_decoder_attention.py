"""The exported decoder graphs' attention (onnxrank.export.families.decoder_attention) computes
what each family's own eager attention computes, without repeating key/value heads."""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from onnxrank.export.families.decoder import causal_mask  # noqa: E402
from onnxrank.export.families.decoder_attention import (  # noqa: E402
    GROUPED_ATTENTION,
    grouped_attention,
    grouped_attention_for,
    outer_product_rotary,
)


class _Attention(torch.nn.Module):
    """What eager attention reads from its module: the query heads per key/value head."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "gemma"])
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (4, 2), (8, 1)])
@pytest.mark.parametrize("cached", [0, 5], ids=["no cache", "5 cached keys"])
def test_grouped_attention_equals_the_family_eager_attention(family: str, heads: int,
                                                             kv_heads: int, cached: int) -> None:
    eager = importlib.import_module(
        f"transformers.models.{family}.modeling_{family}").eager_attention_forward
    generator = torch.Generator().manual_seed(heads * 10 + kv_heads + cached)
    batch, length, head_dim = 3, 7, 16
    query = torch.randn(batch, heads, length, head_dim, generator=generator)
    key = torch.randn(batch, kv_heads, cached + length, head_dim, generator=generator)
    value = torch.randn(batch, kv_heads, cached + length, head_dim, generator=generator)
    padding = torch.ones(batch, length, dtype=torch.long)
    padding[1, 4:] = 0
    padding[2, 6:] = 0
    # as the prefix graph builds it: every cached key visible, causal and padding past them
    mask = torch.cat([torch.zeros(batch, 1, length, cached), causal_mask(padding)], dim=3)
    module = _Attention(heads // kv_heads).eval()

    expected, _ = eager(module, query, key, value, mask, scaling=head_dim**-0.5)
    got, weights = grouped_attention(module, query, key, value, mask, scaling=head_dim**-0.5)

    assert weights is None
    assert got.shape == expected.shape == (batch, length, heads, head_dim)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_grouped_attention_is_set_while_tracing_and_restored_after() -> None:
    config = transformers.Qwen3Config(hidden_size=32, num_attention_heads=4,
                                      num_key_value_heads=2, num_hidden_layers=1,
                                      intermediate_size=64, vocab_size=64,
                                      attn_implementation="eager")
    with grouped_attention_for(config):
        assert config._attn_implementation == GROUPED_ATTENTION
        assert transformers.AttentionInterface()[GROUPED_ATTENTION] is grouped_attention
    assert config._attn_implementation == "eager"

    with pytest.raises(RuntimeError, match="traced graph failed"), grouped_attention_for(config):
        raise RuntimeError("traced graph failed")
    assert config._attn_implementation == "eager"


@pytest.mark.parametrize(("family", "prefix"), [("qwen3", "Qwen3"), ("qwen2", "Qwen2"),
                                               ("gemma", "Gemma")])
def test_the_traced_rotary_embedding_equals_the_family_own_and_is_restored(family: str,
                                                                          prefix: str) -> None:
    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    config = getattr(transformers, f"{prefix}Config")(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_hidden_layers=1, intermediate_size=64, vocab_size=64,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    body = type("Body", (torch.nn.Module,), {})()
    body.rotary_emb = getattr(module, f"{prefix}RotaryEmbedding")(config)
    hidden = torch.zeros(2, 9, 64)
    # positions past 256, where bf16 could not even hold them: the prefix graph's continuations
    positions = torch.arange(9)[None, :].expand(2, -1) + torch.tensor([[0], [300]])
    expected = body.rotary_emb(hidden, positions)
    with outer_product_rotary(body):
        assert "forward" in body.rotary_emb.__dict__
        got = body.rotary_emb(hidden, positions)
    assert "forward" not in body.rotary_emb.__dict__
    for own, traced in zip(expected, got):
        torch.testing.assert_close(traced, own, rtol=0, atol=0)
