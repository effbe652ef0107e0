"""ELECTRA (cross-encoder/ms-marco-electra-base): the BERT layer structure and embeddings (with
an embedding projection when embedding_size != hidden_size), a ClassificationHead that reads
position 0, so the BERT [CLS]-only rewrite and onnxruntime's ``bert`` fusions apply."""

from __future__ import annotations

from onnxrank.export.families.base import Family


class ElectraFamily(Family):
    name = "electra"
    model_types = ("electra",)
    examples = ("cross-encoder/ms-marco-electra-base",)


FAMILY = ElectraFamily()
