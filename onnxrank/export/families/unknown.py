"""The fallback for a ``model_type`` no family module claims: the plain fp32 graph only."""

from __future__ import annotations

import inspect
from typing import Any

from onnxrank._optional import require
from onnxrank.engine.spec import VARIANT_NAMES
from onnxrank.export.families.base import Family


class UnknownFamily(Family):
    """Exports model.onnx without rewrites or fusions, and says what it could not do."""

    ort_model_type = None
    known = False

    def __init__(self, model_type: str) -> None:
        self.model_type = model_type
        self.name = f"unknown ({model_type or 'no model_type'})"
        self.model_types = (model_type,)

    def input_names(self, tokenizer: Any, config: Any) -> tuple[str, ...]:
        """The tokenizer's inputs that the head class's forward accepts (DistilBERT takes no
        token_type_ids though its tokenizer may return them)."""
        names = super().input_names(tokenizer, config)
        transformers = require("transformers", extra="export")
        head = getattr(transformers, (getattr(config, "architectures", None) or [""])[0], None)
        if head is None:
            return names
        accepted = inspect.signature(head.forward).parameters
        return tuple(name for name in names if name in accepted)

    def cls_only_support(self, model: Any) -> str | None:
        return (f"model_type {self.model_type!r} has no family module in "
                "onnxrank.export.families, so no rewrite is known to be exact for it")

    def variant_reasons(self, config: Any) -> dict[str, str]:
        reason = (f"model_type {self.model_type!r} has no family module in "
                  "onnxrank.export.families: only the plain fp32 graph is exported")
        return {name: reason for name in VARIANT_NAMES if name != "fp32"}
