"""Offline Qwen3-shaped causal-LM checkpoints for decoder-reranker tests and speed runs.

The Hub is unreachable here, so both sizes are random-initialised Qwen3ForCausalLM models with a
byte-level BPE tokenizer trained on the shipped pairs with the `tokenizers` library. The tokenizer
has Qwen's chat special tokens (``<|im_start|>``, ``<|im_end|>``, ``<think>``, ``</think>``,
``<|endoftext|>``) and "yes" and "no" as single tokens, so the qwen3-reranker recipe applies as is.
Their scores are NOT relevance scores (``relevance_trained: false`` in the marker).

* ``size="tiny"``: 2 layers, hidden 64, about 400 tokens of vocabulary: tests (seconds to export).
* ``size="qwen3-0.6b"``: the published config of Qwen/Qwen3-0.6B (28 layers, hidden 1024,
  vocabulary 151,936, tied embeddings) with random weights: speed measurements only. Its tokenizer
  has a smaller vocabulary than the real one, so a text takes more tokens than with Qwen's.
* ``size="qwen3-4b"`` and ``"qwen3-8b"``: Qwen/Qwen3-4B's and Qwen/Qwen3-8B's published configs
  (the bases of Qwen3-Reranker-4B and -8B), random weights saved in bfloat16 as the published
  checkpoints are: the memory and speed of the large shapes, nothing else. They are
  initialised in bfloat16 too, so building one takes its bfloat16 size in memory (8 and 16 GB).
"""

from __future__ import annotations

import copy
import json
import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from onnxrank._optional import require
from onnxrank.export.standin import STANDIN_MARKER

logger = logging.getLogger(__name__)

DecoderSize = Literal["tiny", "qwen3-0.6b", "qwen3-4b", "qwen3-8b"]
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>")
# Qwen/Qwen3-0.6B's config.json (the published one), minus the fields transformers fills itself;
# its rope_theta as transformers 5 spells it (rope_parameters)
ROPE_PARAMETERS: dict[str, Any] = {"rope_type": "default", "rope_theta": 1000000.0}
QWEN3_06B_CONFIG: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 40960, "rope_parameters": ROPE_PARAMETERS,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": False,
    "hidden_act": "silu", "initializer_range": 0.02, "use_sliding_window": False,
}
# Qwen/Qwen3-4B's and Qwen/Qwen3-8B's published configs: what differs from the 0.6B one
QWEN3_4B_CONFIG: dict[str, Any] = {**QWEN3_06B_CONFIG, "hidden_size": 2560,
                                   "intermediate_size": 9728, "num_hidden_layers": 36,
                                   "num_attention_heads": 32}
QWEN3_8B_CONFIG: dict[str, Any] = {**QWEN3_06B_CONFIG, "hidden_size": 4096,
                                   "intermediate_size": 12288, "num_hidden_layers": 36,
                                   "num_attention_heads": 32, "tie_word_embeddings": False}
TINY_CONFIG: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 2048, "rope_parameters": ROPE_PARAMETERS, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "attention_bias": False, "hidden_act": "silu",
    # 0.1: the yes/no logit gap varies across pairs (std 0.34 on the held-out pairs; a 0.02 init
    # gives 0.02, and fidelity numbers then measure rounding noise) while the model stays smooth
    # enough for int8 weights (0.2 is chaotic: weight-only int8 kept a Spearman of 0.95 there)
    "initializer_range": 0.1, "use_sliding_window": False,
}

@dataclass(frozen=True, slots=True)
class DecoderShape:
    """One size the builder makes: its config (None = `TINY_CONFIG` with the tokenizer's
    vocabulary), its tokenizer's vocabulary, the dtype its weights are made and saved in, and
    what the marker says the shape is."""

    config: dict[str, Any] | None
    tokenizer_vocab: int
    dtype: str
    description: str


SHAPES: dict[str, DecoderShape] = {
    "tiny": DecoderShape(None, 512, "float32", "tiny"),
    "qwen3-0.6b": DecoderShape(QWEN3_06B_CONFIG, 16000, "float32",
                               "Qwen/Qwen3-0.6B's published config"),
    "qwen3-4b": DecoderShape(QWEN3_4B_CONFIG, 16000, "bfloat16",
                             "Qwen/Qwen3-4B's published config"),
    "qwen3-8b": DecoderShape(QWEN3_8B_CONFIG, 16000, "bfloat16",
                             "Qwen/Qwen3-8B's published config"),
}
DECODER_SIZES: tuple[str, ...] = tuple(SHAPES)
# Lines of "yes" and "no" at a line start teach the BPE both words as single tokens, as the
# model's answer follows "\n\n" without a leading space.
ANSWER_LINES = ["yes", "no"] * 2000


def _training_text() -> list[str]:
    """Queries and passages of the shipped pairs, plus the answer words, as BPE training text."""
    lines: list[str] = []
    for name in ("validation_pairs.jsonl", "calibration_pairs.jsonl", "standin_head_pairs.jsonl"):
        text = resources.files("onnxrank.data").joinpath(name).read_text("utf-8")
        for line in text.splitlines():
            if line.strip():
                record = json.loads(line)
                lines.extend(str(record[key]) for key in ("query", "passage") if key in record)
    return lines + ANSWER_LINES


def build_tokenizer(vocab_size: int) -> Any:
    """A byte-level BPE tokenizer (Qwen2-style pipeline) with the chat special tokens.

    Returns:
        A `tokenizers.Tokenizer`.

    Raises:
        RuntimeError: "yes" or "no" did not become single tokens (the training text changed).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_training_text(), trainer=trainer)
    for word in ("yes", "no"):
        if len(tokenizer.encode(word, add_special_tokens=False).ids) != 1:
            raise RuntimeError(f"the stand-in tokenizer splits {word!r}; it must be one token")
    return tokenizer


def build_decoder_checkpoint(out_dir: Path, *, size: DecoderSize = "tiny",
                             seed: int = 0) -> dict[str, Any]:
    """Save a random-initialised Qwen3ForCausalLM checkpoint with its tokenizer to `out_dir`.

    Args:
        out_dir: Target directory (created).
        size: ``tiny`` (tests), or a published shape (`SHAPES`; speed and memory runs only).
        seed: Seed of the weights.

    Returns:
        The marker written to ``onnxrank_standin.json`` (how the checkpoint was made).

    Raises:
        ValueError: Unknown size.
        MissingDependencyError: The ``export`` extra is not installed.
    """
    if size not in DECODER_SIZES:
        raise ValueError(f"size must be one of {', '.join(DECODER_SIZES)}, got {size!r}")
    torch = require("torch", extra="export")
    transformers = require("transformers", extra="export")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shape = SHAPES[size]
    tokenizer = build_tokenizer(shape.tokenizer_vocab)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        model_max_length=131072)
    fast.save_pretrained(str(out_dir))
    # a copy: the config keeps the rope_parameters dict it is given
    fields = copy.deepcopy(shape.config or {
        **TINY_CONFIG, "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True)})
    config = transformers.Qwen3Config(
        **fields, bos_token_id=None, eos_token_id=tokenizer.token_to_id("<|im_end|>"),
        pad_token_id=tokenizer.token_to_id("<|endoftext|>"), architectures=["Qwen3ForCausalLM"])
    torch.manual_seed(seed)
    # made in its own dtype: a 4B shape in float32 would need 16 GB before it is even saved
    model = transformers.AutoModelForCausalLM.from_config(
        config, dtype=getattr(torch, shape.dtype)).eval()
    model.save_pretrained(str(out_dir))
    info = {
        "builder": f"onnxrank.export.decoder_standin ({size})",
        "size": size,
        "seed": seed,
        "relevance_trained": False,
        "weights": "random (torch.manual_seed(seed)); NOT a relevance model: speed and machinery "
                   "tests only",
        "shape": shape.description,
        "dtype": shape.dtype,
        "tokenizer": f"byte-level BPE trained on the shipped pairs, "
                     f"{tokenizer.get_vocab_size(with_added_tokens=True)} tokens",
    }
    (out_dir / STANDIN_MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n",
                                          encoding="utf-8")
    logger.info("built %s decoder stand-in in %s", size, out_dir)
    return info
