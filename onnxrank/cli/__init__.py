"""The `onnxrank` console script: argparse subcommands, one module per area."""

from __future__ import annotations

import argparse
import logging
import sys

from onnxrank.cli import bench_cmd, diagnose_cmd, export_cmd, retrieval_cmd, score_cmd, serve_cmd
from onnxrank.cli.common import HelpFormatter
from onnxrank.errors import MissingDependencyError, RerankError

EXAMPLES = """examples:
  onnxrank export --model minilm-standin --out models/minilm-standin
  onnxrank models list
  onnxrank index --source docs --index indexes/docs --embedder minilm-embedder
  onnxrank query "how are int8 models validated" --index indexes/docs --mode hybrid \\
      --rerank --model minilm-standin
  onnxrank eval --dataset cranfield-sample --index indexes/cranfield-sample
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
    diagnose_cmd.register(subparsers)
    bench_cmd.register(subparsers)
    serve_cmd.register(subparsers)
    score_cmd.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    try:
        parser = build_parser()  # environment twins are read (and checked) here
    except ValueError as err:
        print(f"onnxrank: error: {err}", file=sys.stderr)
        return 2
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
