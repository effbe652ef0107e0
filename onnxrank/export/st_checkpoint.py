"""What a sentence-transformers checkpoint stores about its CrossEncoder: the activation it
applies to the logits (``activation_fn``), read as sentence-transformers 6 reads it.

Two readers need it: the manifest's activation (onnxrank.export.source) and the score kind of a
decoder checkpoint's recipe (onnxrank.export.recipes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from onnxrank._optional import require
from onnxrank.errors import ExportError

ST_SIGMOID = "torch.nn.modules.activation.Sigmoid"
ST_IDENTITY = "torch.nn.modules.linear.Identity"
# the short spellings sentence-transformers also writes, as the class paths above
_SHORT_PATHS = {"torch.nn.Sigmoid": ST_SIGMOID, "torch.nn.Identity": ST_IDENTITY}


def stored_activation_fn(location: str, *, local: bool) -> str | None:
    """The activation_fn class path stored for the checkpoint at `location` (a directory, or a Hub
    id when not `local`), in sentence-transformers 6's order; None where none is stored:

    1. ``activation_fn`` in config_sentence_transformers.json, read when modules.json exists
       (sentence-transformers 6's module-stack checkpoints);
    2. ``activation_fn`` under config.json's ``sentence_transformers`` key (versions 4 and 5:
       cross-encoder/ms-marco-MiniLM-L6-v2 stores Identity there, so its scores are logits);
    3. config.json's ``sbert_ce_default_activation_function`` (before version 4).

    The short spellings (``torch.nn.Sigmoid``) come back as ST_SIGMOID / ST_IDENTITY.
    """
    transformers = require("transformers", extra="export")

    def checkpoint_file(name: str) -> str | None:
        return transformers.utils.cached_file(
            location, name, local_files_only=local, _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False)

    def stored(name: str) -> dict[str, Any]:
        path = checkpoint_file(name)
        if path is None:
            return {}
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ExportError(f"could not read {path}: {err}") from err
        return data if isinstance(data, dict) else {}

    activation = None
    if checkpoint_file("modules.json") is not None:
        activation = stored("config_sentence_transformers.json").get("activation_fn")
    if activation is None:
        config = stored("config.json")
        block = config.get("sentence_transformers")
        activation = (block.get("activation_fn") if isinstance(block, dict) else None) or \
            config.get("sbert_ce_default_activation_function")
    return None if activation is None else _SHORT_PATHS.get(str(activation), str(activation))
