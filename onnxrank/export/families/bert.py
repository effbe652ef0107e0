"""BERT (cross-encoder/ms-marco-MiniLM-*, BAAI/bge-reranker v1 is XLM-R: see xlm_roberta.py).

The default family: WordPiece with token types, absolute positions, [CLS]-reading pooler head,
onnxruntime's ``bert`` fusions, the [CLS]-only last layer of onnxrank.export.prune.
"""

from __future__ import annotations

from onnxrank.export.families.base import Family


class BertFamily(Family):
    name = "bert"
    model_types = ("bert",)
    examples = ("cross-encoder/ms-marco-MiniLM-L-6-v2", "cross-encoder/ms-marco-MiniLM-L-12-v2",
                "cross-encoder/ms-marco-TinyBERT-L-2-v2")


FAMILY = BertFamily()
