"""A checkpoint loaded for export: what onnxrank.export.source hands to the families and the pipeline.

It sits below both: the families read it, source.py builds it, and it imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from onnxrank.engine.spec import Activation
    from onnxrank.export.recipes import PromptRecipe


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A checkpoint loaded for export.

    Attributes:
        model: ``*ForSequenceClassification`` (rerank) or ``AutoModel`` (embedding), eval, eager attention.
        tokenizer: The transformers fast tokenizer (saved next to the ONNX files).
        config: The transformers config.
        input_names: Graph inputs the model takes (the family's answer for this tokenizer).
        source: The manifest's ``source`` entry.
        reference: sentence-transformers model for embedding validation, else None.
        relevance_trained: Whether scores are meaningful relevance (False for stand-ins).
        recipe: Decoder rerankers: the scoring recipe (onnxrank.export.recipes); else None.
        stored_activation: The activation sentence-transformers stores for this checkpoint
            (onnxrank.export.source.stored_activation), or None where it stores none.
    """

    model: Any
    tokenizer: Any
    config: Any
    input_names: tuple[str, ...]
    source: dict[str, Any]
    reference: Any
    relevance_trained: bool
    recipe: PromptRecipe | None = None
    stored_activation: Activation | None = None
