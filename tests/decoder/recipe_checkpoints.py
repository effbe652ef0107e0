"""Tiny random checkpoints of the architectures behind the other built-in recipes, each with its own
kind of tokenizer, trained here on the shipped pairs like onnxrank.export.decoder_standin's Qwen3:

* Gemma (bge-reranker-v2-gemma): GemmaForCausalLM with a sentencepiece-style BPE (spaces as "▁",
  no pre-tokenizer, byte fallback to ``<0xNN>`` tokens, ``<bos>``), "Yes" one token.
* Qwen2 (mxbai-rerank-v2): Qwen2ForCausalLM with the Qwen3 stand-in's byte-level BPE (chat special
  tokens), "1" and "0" one token each, an untied head with its own weights.

2 layers, hidden 64; weights random (not relevance models).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, normalizers, trainers

from onnxrank.export.decoder_standin import (
    ROPE_PARAMETERS,
    TINY_CONFIG,
    _training_text,
    build_tokenizer,
)
from onnxrank.export.standin import STANDIN_MARKER

GEMMA_SPECIAL = ("<pad>", "<eos>", "<bos>", "<unk>")
LAYOUT = {key: TINY_CONFIG[key] for key in (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps")}


def gemma_tokenizer(vocab_size: int = 600) -> Tokenizer:
    """A Gemma-style tokenizer: spaces become "▁", BPE over whole lines, unknown characters fall
    back to their UTF-8 bytes."""
    trainer_model = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_model.normalizer = normalizers.Replace(" ", "▁")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(GEMMA_SPECIAL),
                                  show_progress=False)
    lines = [{"yes": "Yes", "no": "No"}.get(line, line) for line in _training_text()]
    trainer_model.train_from_iterator(lines, trainer=trainer)
    state = json.loads(trainer_model.to_str())
    vocab = state["model"]["vocab"]
    for byte in range(256):  # byte fallback needs every <0xNN> in the vocabulary
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    state["model"]["byte_fallback"] = True
    tokenizer = Tokenizer.from_str(json.dumps(state))
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                           decoders.Fuse()])
    return tokenizer


def _save(out_dir: Path, tokenizer: Tokenizer, model: Any, architecture: str,
          special: dict[str, str]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=131072,
                                         **special).save_pretrained(str(out_dir))
    model.save_pretrained(str(out_dir))
    marker = {"builder": f"tests/decoder/recipe_checkpoints.py ({architecture})", "size": "tiny",
              "seed": 0, "relevance_trained": False, "weights": "random; NOT a relevance model",
              "shape": "tiny",
              "tokenizer": f"{tokenizer.get_vocab_size(with_added_tokens=True)} tokens"}
    (out_dir / STANDIN_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    return out_dir


def build_gemma_checkpoint(out_dir: Path, *, initializer_range: float, seed: int = 0) -> Path:
    """A tiny random GemmaForCausalLM with a Gemma-style tokenizer ("Yes" one token)."""
    tokenizer = gemma_tokenizer()
    ids = {token: tokenizer.token_to_id(token) for token in GEMMA_SPECIAL}
    assert tokenizer.encode("Yes", add_special_tokens=False).ids == [tokenizer.token_to_id("Yes")]
    config = transformers.GemmaConfig(
        **LAYOUT, initializer_range=initializer_range,
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True), hidden_act="gelu_pytorch_tanh",
        tie_word_embeddings=True, bos_token_id=ids["<bos>"],
        eos_token_id=ids["<eos>"], pad_token_id=ids["<pad>"], architectures=["GemmaForCausalLM"])
    torch.manual_seed(seed)
    model = transformers.GemmaForCausalLM(config).eval()
    return _save(out_dir, tokenizer, model, "GemmaForCausalLM",
                 {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                  "unk_token": "<unk>"})


def build_qwen2_checkpoint(out_dir: Path, *, initializer_range: float, seed: int = 0) -> Path:
    """A tiny random Qwen2ForCausalLM with a byte-level BPE and the chat special tokens."""
    tokenizer = build_tokenizer(512)
    config = transformers.Qwen2Config(
        **LAYOUT, initializer_range=initializer_range,
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True), rope_parameters=dict(ROPE_PARAMETERS),
        tie_word_embeddings=False, use_sliding_window=False,
        bos_token_id=None, eos_token_id=tokenizer.token_to_id("<|im_end|>"),
        pad_token_id=tokenizer.token_to_id("<|endoftext|>"), architectures=["Qwen2ForCausalLM"])
    torch.manual_seed(seed)
    model = transformers.Qwen2ForCausalLM(config).eval()
    return _save(out_dir, tokenizer, model, "Qwen2ForCausalLM",
                 {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
