"""Helpers shared by the subcommands: environment twins of flags, error reporting."""

from __future__ import annotations

import argparse
import os
from typing import Any

ENV_PREFIX = "ONNXRANK_"


def env_default(flag: str, default: Any) -> Any:
    """Default for --FLAG from the environment twin ONNXRANK_FLAG (dashes become underscores).

    The value is returned as a string when set; argparse applies the flag's `type` to string defaults.
    """
    return os.environ.get(ENV_PREFIX + flag.upper().replace("-", "_"), default)


def env_name(flag: str) -> str:
    """The environment twin's name for a flag, for help texts."""
    return ENV_PREFIX + flag.upper().replace("-", "_")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps example blocks as written and shows each flag's default."""
