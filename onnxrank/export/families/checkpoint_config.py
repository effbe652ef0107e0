"""What a family's random-weight test and bench checkpoints are made of (Family.checkpoint).

onnxrank.bench.family_checkpoints builds them: the published base configuration at ``full`` size
(speed only), the same at 2 layers and hidden 64 at ``tiny`` size (tests), with a tokenizer of
the family's kind trained on the shipped pair text.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass(frozen=True, slots=True)
class TokenizerKind:
    """The kind of tokenizer a family's checkpoints get.

    Attributes:
        model: ``wordpiece`` (lower-cased), ``byte_bpe`` (byte-level BPE) or ``unigram``
            (sentencepiece-style, Metaspace).
        special_tokens: The special tokens, in vocabulary order.
        template: ``bert`` (``[CLS] q [SEP] d [SEP]`` with token types) or ``roberta``
            (``<s> q </s></s> d </s>``, no token types).
        fast_class: The transformers fast tokenizer class it is saved as.
        token_types: Whether the tokenizer returns ``token_type_ids``.
    """

    model: Literal["wordpiece", "byte_bpe", "unigram"]
    special_tokens: tuple[str, ...]
    template: Literal["bert", "roberta"]
    fast_class: str
    token_types: bool = True


BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


@dataclass(frozen=True, slots=True)
class CheckpointConfig:
    """A family's checkpoint for tests (``tiny``) and bench (``full``), random weights.

    Attributes:
        published_model: The Hub model whose config.json `full` copies.
        config_class: The transformers config class.
        architecture: The ``*ForSequenceClassification`` class (config.architectures).
        full: The published base configuration.
        tiny: Changes to `full` at tiny size, on top of the shared tiny shape (2 layers, hidden
            64); a None value drops the key.
        tokenizer: The tokenizer's kind.
        special_ids: Config keys set from the tokenizer: config key -> tokenizer attribute
            (``pad_token_id`` always is).
    """

    published_model: str
    config_class: str
    architecture: str
    full: Mapping[str, Any]
    tokenizer: TokenizerKind
    tiny: Mapping[str, Any] = field(default_factory=dict)
    special_ids: Mapping[str, str] = field(default_factory=dict)
