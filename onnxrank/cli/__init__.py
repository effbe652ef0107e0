"""The `onnxrank` console script: argparse subcommands, one module per area."""

from __future__ import annotations

import argparse
import logging
import sys

from onnxrank.cli import bench_cmd, export_cmd, retrieval_cmd
from onnxrank.cli.common import HelpFormatter
from onnxrank.errors import MissingDependencyError, RerankError

EXAMPLES = """examples:
  onnxrank export --model minilm-standin --out models/minilm-standin
  onnxrank models list
  onnxrank index --source docs --index indexes/docs --embedder minilm-embedder
  onnxrank query "how are int8 models validated" --index indexes/docs --mode hybrid \\
      --rerank --model minilm-standin
  onnxrank eval --dataset ../shared/data/cranfield --index indexes/cranfield
  onnxrank bench --quick
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="onnxrank",
        description="Export cross-encoders to ONNX, rerank with them, retrieve and benchmark.",
        epilog=EXAMPLES,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log INFO messages to stderr")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    export_cmd.register(subparsers)
    retrieval_cmd.register(subparsers)
    bench_cmd.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.handler(args) or 0)
    except (RerankError, MissingDependencyError, ValueError, TypeError) as err:
        print(f"onnxrank {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
