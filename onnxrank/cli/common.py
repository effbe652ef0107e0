"""What the subcommands share besides their flags (those come from onnxrank/cli/options.py)."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps example blocks as written and shows each flag's default."""
