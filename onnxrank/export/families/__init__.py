"""Model families: one module per family, each defining ``FAMILY`` (a base.Family), chosen by the
checkpoint's ``config.model_type`` through `family_for`.

A new family is one new module in this package with a ``FAMILY`` instance; nothing else changes
(tests/export/test_families*.py test every registered family).
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from typing import Any

from onnxrank.export.families.base import Family, applicable_variants
from onnxrank.export.families.unknown import UnknownFamily

NOT_FAMILY_MODULES = ("base", "checkpoint_config", "unknown")


@cache
def registry() -> dict[str, Family]:
    """model_type -> family, from every module of this package that defines ``FAMILY``."""
    families: dict[str, Family] = {}
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda info: info.name):
        if module_info.name in NOT_FAMILY_MODULES:
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        family = getattr(module, "FAMILY", None)
        if not isinstance(family, Family):
            continue
        for model_type in family.model_types:
            if model_type in families:
                raise RuntimeError(f"model_type {model_type!r} is claimed by the families "
                                   f"{families[model_type].name} and {family.name}")
            families[model_type] = family
    return families


def family_for(config: Any) -> Family:
    """The family of a checkpoint's config; an UnknownFamily (plain fp32 only) when none claims
    its ``model_type``."""
    model_type = str(getattr(config, "model_type", "") or "")
    return registry().get(model_type) or UnknownFamily(model_type)


def families() -> list[Family]:
    """Every registered family once, in name order."""
    return sorted({id(family): family for family in registry().values()}.values(),
                  key=lambda family: family.name)


__all__ = ["Family", "UnknownFamily", "applicable_variants", "families", "family_for", "registry"]
