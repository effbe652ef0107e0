"""Every model kind, one table: the engine class that runs each ModelKind of a manifest.

A manifest's kind is decided once (onnxrank.engine.spec.model_kind, from its task and whether it
records a prompt recipe); `KINDS` names the class that runs it. The table is the one of
onnxrank.engine.model, filled by the kind classes as they are defined; importing this module
runs the package face (onnxrank/engine/__init__.py) first, which imports every kind's module, so
the table is complete here.
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from onnxrank.engine.model import KINDS
from onnxrank.engine.recipe import PromptRecipe
from onnxrank.engine.rows import RowEncoder
from onnxrank.engine.spec import model_kind

__all__ = ["KINDS", "row_encoder"]


def row_encoder(task: str, recipe: PromptRecipe | None, tokenizer: Tokenizer,
                max_length: int) -> RowEncoder[Any]:
    """The row encoder of a model of `task` (with its prompt recipe, if any), as its kind builds
    it: what export validation encodes with before any manifest exists.

    Raises:
        ValueError: No kind has this task with (or without) a recipe.
    """
    return KINDS[model_kind(task, recipe)].row_encoder(tokenizer, max_length, recipe)
