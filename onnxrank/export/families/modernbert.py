"""ModernBERT (Alibaba-NLP/gte-reranker-modernbert-base): rotary positions, alternating local and
global attention, a fused Wqkv projection, no ``token_type_ids`` input; the head pools either the
[CLS] row or the mean of every row (``classifier_pooling``).

onnxruntime's transformer optimizer has no ModernBERT fusions (opt is left out), and the
[CLS]-only rewrite of onnxrank.export.prune drives BERT's self-attention module, which ModernBERT
does not have: its last layer is not pruned (recorded with the reason).

ov_int8 builds as for BERT. It was once left out because validating it grew the export past 8 GB:
attention's [rows, heads, length, length] tensors over validation rows of ~2,200 tokens (8,192
positions), in batch_dependence's batches of up to 64 rows (OpenVINO int8 at 48 x 2,222 tokens:
4.3 GB on a 4-head model); onnxrank.export.validate now bounds each batch's padded tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from onnxrank.export.families.base import Family
from onnxrank.export.families.checkpoint_config import BERT_SPECIAL_TOKENS, CheckpointConfig, TokenizerKind

if TYPE_CHECKING:
    from onnxrank.export.tasks import ExportTask


class ModernBertFamily(Family):
    name = "modernbert"
    model_types = ("modernbert",)
    examples = ("Alibaba-NLP/gte-reranker-modernbert-base",)
    ort_model_type = None
    # answerdotai/ModernBERT-base's shape
    checkpoint = CheckpointConfig(
        published_model="Alibaba-NLP/gte-reranker-modernbert-base",
        config_class="ModernBertConfig", architecture="ModernBertForSequenceClassification",
        full={"vocab_size": 50368, "hidden_size": 768, "num_hidden_layers": 22,
              "num_attention_heads": 12, "intermediate_size": 1152,
              "max_position_embeddings": 8192, "global_attn_every_n_layers": 3,
              "local_attention": 128, "global_rope_theta": 160000.0,
              "local_rope_theta": 10000.0},
        tiny={"global_attn_every_n_layers": 2, "local_attention": 16},
        tokenizer=TokenizerKind("byte_bpe", BERT_SPECIAL_TOKENS, "bert",
                                "PreTrainedTokenizerFast", token_types=False),
        special_ids={"cls_token_id": "cls_token_id", "sep_token_id": "sep_token_id",
                     "bos_token_id": "cls_token_id", "eos_token_id": "sep_token_id"})

    def input_names(self, tokenizer: Any, config: Any) -> tuple[str, ...]:
        # ModernBertModel.forward takes no token_type_ids, whatever the tokenizer returns
        return ("input_ids", "attention_mask")

    def reads_position_0(self, config: Any, task: ExportTask) -> bool:
        return task.has_head and getattr(config, "classifier_pooling", "cls") == "cls"

    def cls_only_support(self, model: Any) -> str | None:
        pooling = getattr(model.config, "classifier_pooling", "cls")
        if pooling != "cls":
            return f"the head pools every row (classifier_pooling={pooling!r}), not [CLS] only"
        return ("ModernBERT's layer (fused Wqkv, rotary positions, local attention window) has no "
                "[CLS]-only rewrite yet")


FAMILY = ModernBertFamily()
