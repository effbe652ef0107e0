"""`onnxrank serve`: the HTTP rerank server (flags generated from ServeConfig and EngineConfig)."""

from __future__ import annotations

import argparse

from onnxrank.cli.common import HelpFormatter
from onnxrank.cli.options import (
    add_config_options,
    add_engine_options,
    config_overrides,
    load_reranker,
)
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


def run_serve(args: argparse.Namespace) -> int:
    """Load the model, then serve it until SIGTERM or SIGINT.

    Raises:
        ValueError: A server setting out of range.
        ModelLoadError: --model is not an exported model.
        MissingDependencyError: The `serve` extra is not installed.
    """
    from onnxrank.serve.server import serve

    config = ServeConfig(**config_overrides(args, ServeConfig))  # checked before the model loads
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
    add_config_options(parser.add_argument_group("server options"), ServeConfig, "serve")
    parser.set_defaults(handler=run_serve)
