"""The rule from an option's field name to its command-line flag, for the CLI and the library.

The CLI generates its flags with it (onnxrank/cli/options.py); library code that starts a command
in a subprocess (the bench's server processes) or names a flag in a message (export's fidelity
thresholds) uses the same rule, without importing the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FLAG_PREFIX = "--"
NEGATED_FLAG_PREFIX = "--no-"


def field_flag(name: str) -> str:
    """The command-line flag of a config field: max_batch_tokens -> --max-batch-tokens."""
    return FLAG_PREFIX + name.replace("_", "-")


def config_flags(overrides: Mapping[str, Any]) -> list[str]:
    """The command line that the CLI's ``config_overrides`` reads back as `overrides` (for a
    subprocess): a boolean field gives ``--x`` or ``--no-x``, any other ``--x VALUE``."""
    flags = []
    for name, value in overrides.items():
        if isinstance(value, bool):  # argparse.BooleanOptionalAction's pair
            flag = field_flag(name)
            flags.append(flag if value else NEGATED_FLAG_PREFIX + flag.removeprefix(FLAG_PREFIX))
        else:
            flags += [field_flag(name), str(value)]
    return flags
