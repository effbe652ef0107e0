"""Lazy imports of optional dependencies with an actionable error."""

from __future__ import annotations

import importlib
from types import ModuleType

from onnxrank.errors import MissingDependencyError


def require(module: str, *, extra: str) -> ModuleType:
    """Import `module` or raise MissingDependencyError naming the extra that provides it.

    Args:
        module: Importable module name, e.g. "hnswlib".
        extra: The onnxrank extra that installs it, e.g. "dense".

    Returns:
        The imported module.

    Raises:
        MissingDependencyError: The module is not installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingDependencyError(
            f"{module} is required for this feature but is not installed; "
            f'install it with: pip install "onnxrank[{extra}]"'
        ) from err
