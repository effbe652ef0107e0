"""XLM-RoBERTa and RoBERTa (BAAI/bge-reranker-base, -large, -v2-m3; jinaai's v1 rerankers are
other architectures). Sentencepiece/BPE tokenizers without token types (``<s> q </s></s> d </s>``),
positions offset by padding_idx + 1 (bge-reranker-v2-m3: 8,194 positions = 8,192 tokens), the
BERT layer structure with a ClassificationHead reading position 0."""

from __future__ import annotations

from typing import Any

from onnxrank.export.families.base import Family
from onnxrank.export.families.checkpoint_config import CheckpointConfig, TokenizerKind


class XlmRobertaFamily(Family):
    name = "xlm-roberta"
    model_types = ("xlm-roberta", "roberta")
    examples = ("BAAI/bge-reranker-base", "BAAI/bge-reranker-large", "BAAI/bge-reranker-v2-m3")
    # the ClassificationHead reads features[:, 0, :]
    cls_head_classes = ("RobertaForSequenceClassification", "XLMRobertaForSequenceClassification")
    # xlm-roberta-base's shape
    checkpoint = CheckpointConfig(
        published_model="BAAI/bge-reranker-base", config_class="XLMRobertaConfig",
        architecture="XLMRobertaForSequenceClassification",
        full={"vocab_size": 250002, "hidden_size": 768, "num_hidden_layers": 12,
              "num_attention_heads": 12, "intermediate_size": 3072,
              "max_position_embeddings": 514, "type_vocab_size": 1, "layer_norm_eps": 1e-5},
        tiny={"max_position_embeddings": 514},
        tokenizer=TokenizerKind("unigram", ("<s>", "<pad>", "</s>", "<unk>", "<mask>"),
                                "roberta", "XLMRobertaTokenizerFast", token_types=False),
        special_ids={"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id"})

    def position_offset(self, config: Any) -> int:
        # RobertaEmbeddings numbers positions from padding_idx + 1
        return int(config.pad_token_id) + 1


FAMILY = XlmRobertaFamily()
