"""DeBERTa-v2 and -v3 (mixedbread-ai/mxbai-rerank-base-v1, -large-v1): disentangled relative
attention (content->position and position->content terms), no absolute positions in v3, a
ContextPooler head reading position 0, sentencepiece Unigram tokenizers (``[CLS] q [SEP] d
[SEP]``; v3 tokenizers return token types, mxbai's do not).

onnxruntime's transformer optimizer has no DeBERTa fusions (opt is left out). The [CLS]-only
rewrite is not applied: transformers' ``query_states`` path broadcasts the position->content term
of every query row onto a single-row query, so a row-0 layer built on it would not be exact."""

from __future__ import annotations

from typing import Any

from onnxrank.export.families.base import Family


class DebertaV2Family(Family):
    name = "deberta-v2"
    model_types = ("deberta-v2", "deberta")
    examples = ("mixedbread-ai/mxbai-rerank-base-v1", "mixedbread-ai/mxbai-rerank-large-v1",
                "mixedbread-ai/mxbai-rerank-xsmall-v1")
    ort_model_type = None

    def max_positions(self, config: Any) -> int:
        # relative attention alone (v3: position_biased_input false) has no absolute table, but
        # the checkpoints were trained to max_position_embeddings: keep that as the limit
        return int(config.max_position_embeddings)

    def cls_only_support(self, model: Any) -> str | None:
        return ("DeBERTa's disentangled attention: the position->content term of a row-0 query "
                "needs every row's relative positions; no exact [CLS]-only rewrite yet")


FAMILY = DebertaV2Family()
