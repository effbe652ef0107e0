"""The engine: one base (model.EngineModel) and one class per model kind.

Importing the package imports every kind's module, so each kind's class has recorded itself in
onnxrank.engine.model.KINDS before any `from_dir` picks one. A new kind is one module and one
line here (docs/engine.md, "Adding a model kind").
"""

from __future__ import annotations

from onnxrank.engine.embedder import Embedder
from onnxrank.engine.late_interaction import LateInteractionReranker
from onnxrank.engine.model import EngineModel
from onnxrank.engine.reranker import DecoderReranker, Reranker

__all__ = ["DecoderReranker", "Embedder", "EngineModel", "LateInteractionReranker", "Reranker"]
