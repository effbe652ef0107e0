"""BERT (cross-encoder/ms-marco-MiniLM-*, BAAI/bge-reranker v1 is XLM-R: see xlm_roberta.py).

The default family: WordPiece with token types, absolute positions, [CLS]-reading pooler head,
onnxruntime's ``bert`` fusions, the [CLS]-only last layer of onnxrank.export.prune.
"""

from __future__ import annotations

from onnxrank.export.families.base import Family
from onnxrank.export.families.checkpoint_config import BERT_SPECIAL_TOKENS, CheckpointConfig, TokenizerKind


class BertFamily(Family):
    name = "bert"
    model_types = ("bert",)
    examples = ("cross-encoder/ms-marco-MiniLM-L-6-v2", "cross-encoder/ms-marco-MiniLM-L-12-v2",
                "cross-encoder/ms-marco-TinyBERT-L-2-v2")
    checkpoint = CheckpointConfig(
        published_model="cross-encoder/ms-marco-MiniLM-L-6-v2", config_class="BertConfig",
        architecture="BertForSequenceClassification",
        full={"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6,
              "num_attention_heads": 12, "intermediate_size": 1536,
              "max_position_embeddings": 512, "type_vocab_size": 2},
        tokenizer=TokenizerKind("wordpiece", BERT_SPECIAL_TOKENS, "bert", "BertTokenizerFast"))


FAMILY = BertFamily()
