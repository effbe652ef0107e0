"""ELECTRA (cross-encoder/ms-marco-electra-base): the BERT layer structure and embeddings (with
an embedding projection when embedding_size != hidden_size), a ClassificationHead that reads
position 0, so the BERT [CLS]-only rewrite and onnxruntime's ``bert`` fusions apply."""

from __future__ import annotations

from onnxrank.export.families.base import Family
from onnxrank.export.families.checkpoint_config import BERT_SPECIAL_TOKENS, CheckpointConfig, TokenizerKind


class ElectraFamily(Family):
    name = "electra"
    model_types = ("electra",)
    examples = ("cross-encoder/ms-marco-electra-base",)
    # the ClassificationHead reads features[:, 0, :]
    cls_head_classes = ("ElectraForSequenceClassification",)
    # google/electra-base-discriminator's shape
    checkpoint = CheckpointConfig(
        published_model="cross-encoder/ms-marco-electra-base", config_class="ElectraConfig",
        architecture="ElectraForSequenceClassification",
        full={"vocab_size": 30522, "embedding_size": 768, "hidden_size": 768,
              "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
              "max_position_embeddings": 512, "type_vocab_size": 2},
        tiny={"embedding_size": None},
        tokenizer=TokenizerKind("wordpiece", BERT_SPECIAL_TOKENS, "bert", "ElectraTokenizerFast"))


FAMILY = ElectraFamily()
