"""Every model kind, one table: the engine class that runs each ModelKind of a manifest.

A manifest's kind is decided once (onnxrank.engine.spec.model_kind, from its task and whether it
records a prompt recipe); this table names the class that runs it. Each class is a subclass of
onnxrank.engine.model.EngineModel and says how its items become rows (`row_encoder`).
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from onnxrank.engine.embedder import Embedder
from onnxrank.engine.late_interaction import LateInteractionReranker
from onnxrank.engine.model import EngineModel
from onnxrank.engine.recipe import PromptRecipe
from onnxrank.engine.reranker import DecoderReranker, Reranker
from onnxrank.engine.rows import RowEncoder
from onnxrank.engine.spec import ModelKind, model_kind

KINDS: dict[ModelKind, type[EngineModel[Any]]] = {
    ModelKind.CROSS_ENCODER: Reranker,
    ModelKind.DECODER_RERANKER: DecoderReranker,
    ModelKind.EMBEDDER: Embedder,
    ModelKind.LATE_INTERACTION: LateInteractionReranker,
}


def row_encoder(task: str, recipe: PromptRecipe | None, tokenizer: Tokenizer,
                max_length: int) -> RowEncoder[Any]:
    """The row encoder of a model of `task` (with its prompt recipe, if any), as its kind builds
    it: what export validation encodes with before any manifest exists.

    Raises:
        ValueError: No kind has this task with (or without) a recipe.
    """
    return KINDS[model_kind(task, recipe)].row_encoder(tokenizer, max_length, recipe)
