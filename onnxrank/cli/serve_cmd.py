"""`onnxrank serve`: the HTTP rerank server (flags generated from ServeConfig and EngineConfig)."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from onnxrank.cli.common import HelpFormatter
from onnxrank.cli.options import UNSET, add_engine_options, add_flag, load_reranker
from onnxrank.serve.config import ServeConfig

EPILOG = """examples:
  onnxrank serve --model minilm-standin                      # http://127.0.0.1:8080
  onnxrank serve --model minilm-standin --port 9000 --api-key "$KEY" --max-queue 64
  ONNXRANK_SERVE_PORT=9000 ONNXRANK_THREADS=2 onnxrank serve

  curl -s http://127.0.0.1:8080/v1/rerank -H 'Content-Type: application/json' \\
      -d '{"query": "wing flutter", "documents": ["flutter of wings", "boundary layers"]}'

Endpoints: POST /v1/rerank (Cohere v1 and Jina), POST /v2/rerank (Cohere v2), POST /rerank
(text-embeddings-inference), GET /health, /ready, /metrics, /v1/models. SIGTERM stops accepting,
finishes what is queued, then exits. See docs/serve.md.
"""


def _serve_options(args: argparse.Namespace) -> dict[str, Any]:
    return {spec.name: getattr(args, spec.name) for spec in fields(ServeConfig)
            if hasattr(args, spec.name)}


def run_serve(args: argparse.Namespace) -> int:
    """Load the model, then serve it until SIGTERM or SIGINT.

    Raises:
        ValueError: A server setting out of range.
        ModelLoadError: --model is not an exported model.
        MissingDependencyError: The `serve` extra is not installed.
    """
    from onnxrank.serve.server import serve

    config = ServeConfig(**_serve_options(args))  # checked before the model loads
    serve(load_reranker(args), config)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `serve` subcommand."""
    parser = subparsers.add_parser(
        "serve",
        help="serve a rerank model over HTTP (Cohere, Jina and TEI APIs)",
        description="Serve a rerank model over HTTP with the request and response shapes of the "
                    "Cohere v1/v2, Jina and text-embeddings-inference APIs. Concurrent requests "
                    "share the engine's token-budget batches; a bounded queue answers 429 when "
                    "full. Binds 127.0.0.1 unless --host says otherwise.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    add_engine_options(parser)
    group = parser.add_argument_group("server options")
    defaults = ServeConfig()
    for spec in fields(ServeConfig):
        flag = "--" + spec.name.replace("_", "-")
        help_text = f"{spec.metadata['help']}; default: {getattr(defaults, spec.name)}"
        if spec.metadata["kind"] is bool:
            add_flag(group, "serve", flag, action=argparse.BooleanOptionalAction, default=UNSET,
                     help=help_text)
        else:
            add_flag(group, "serve", flag, type=spec.metadata["kind"], default=UNSET,
                     help=help_text, metavar=spec.name.upper())
    parser.set_defaults(handler=run_serve)
