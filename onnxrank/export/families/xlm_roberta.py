"""XLM-RoBERTa and RoBERTa (BAAI/bge-reranker-base, -large, -v2-m3; jinaai's v1 rerankers are
other architectures). Sentencepiece/BPE tokenizers without token types (``<s> q </s></s> d </s>``),
positions offset by padding_idx + 1 (bge-reranker-v2-m3: 8,194 positions = 8,192 tokens), the
BERT layer structure with a ClassificationHead reading position 0."""

from __future__ import annotations

from typing import Any

from onnxrank.export.families.base import Family


class XlmRobertaFamily(Family):
    name = "xlm-roberta"
    model_types = ("xlm-roberta", "roberta")
    examples = ("BAAI/bge-reranker-base", "BAAI/bge-reranker-large", "BAAI/bge-reranker-v2-m3")

    def position_offset(self, config: Any) -> int:
        # RobertaEmbeddings numbers positions from padding_idx + 1
        return int(config.pad_token_id) + 1


FAMILY = XlmRobertaFamily()
