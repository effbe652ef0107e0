"""`onnxrank serve`: rerank, embedding and search over HTTP (flags generated from ServeConfig and
EngineConfig)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from onnxrank.cli.common import HelpFormatter
from onnxrank.cli.options import (
    add_config_options,
    add_flag,
    config_overrides,
    engine_overrides,
)
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.runtime import DEFAULT_MODELS_DIR
from onnxrank.rerankers.local import DEFAULT_LOCAL_MODEL
from onnxrank.serve.config import ServeConfig

logger = logging.getLogger(__name__)

EPILOG = """examples:
  onnxrank serve --model minilm-standin                      # http://127.0.0.1:8080
  onnxrank serve --model minilm-standin --model minilm-embedder --index indexes/docs
  onnxrank serve --model reranker=minilm-standin --model embedder=minilm-embedder --threads 2
  onnxrank serve --model minilm-standin --port 9000 --api-key "$KEY" --max-queue 64
  ONNXRANK_SERVE_PORT=9000 ONNXRANK_THREADS=2 onnxrank serve

  curl -s http://127.0.0.1:8080/v1/rerank -H 'Content-Type: application/json' \\
      -d '{"query": "wing flutter", "documents": ["flutter of wings", "boundary layers"]}'

Endpoints: POST /v1/rerank (Cohere v1 and Jina), POST /v2/rerank (Cohere v2), POST /rerank (TEI),
POST /v1/embeddings (OpenAI), POST /embed (TEI), POST /v1/search (with --index), GET /health,
/ready, /metrics, /v1/models. Each --model is a rerank or an embedding model (its manifest says
which); clients pick one by its id in the request's `model` field (default: the first of the
endpoint's task). --threads is the process's total: it is divided evenly between the models
(and the index's own query embedder when no served model built the index), the first ones
getting the remainder, at least 1 each. SIGTERM stops accepting, finishes what is queued, then
exits. See docs/serve.md.
"""


class _ModelEntries(argparse.Action):
    """--model repeated: the first occurrence on the command line replaces the default (or the
    ONNXRANK_MODEL twin's single model), each later one adds a model."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        current = getattr(namespace, self.dest, None)
        entries = current if isinstance(current, list) else []
        setattr(namespace, self.dest, [*entries, values])


def split_model_entry(entry: str) -> tuple[str | None, str]:
    """``ID=MODEL`` -> (ID, MODEL); ``MODEL`` -> (None, MODEL): the id is then the manifest's name.

    Raises:
        ValueError: An empty id or model.
    """
    model_id, separator, model = entry.partition("=")
    if not separator:
        return None, entry
    if not model_id.strip() or not model.strip():
        raise ValueError(f"--model must be MODEL or ID=MODEL with a non-empty ID and MODEL, got "
                         f"{entry!r}")
    return model_id.strip(), model.strip()


def thread_shares(total: int, engines: int) -> list[int]:
    """`total` threads divided between `engines`: even shares, the remainder to the first ones,
    at least 1 each (so with more engines than threads the cores are oversubscribed)."""
    base, remainder = divmod(total, engines)
    return [max(1, base + (1 if index < remainder else 0)) for index in range(engines)]


def load_served(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The engines named by --model (by id) and the retriever of --index (or None).

    Raises:
        ModelLoadError: A --model is not an exported model.
        RetrievalError: --index is not an index.
        ValueError: Two models with the same id, or a bad --model entry.
    """
    from onnxrank.engine.devices import usable_cpus
    from onnxrank.engine.reranker import Reranker
    from onnxrank.engine.runtime import resolve_model_dir
    from onnxrank.engine.spec import load_model_spec
    from onnxrank.retrieval.embedder import Embedder

    entries = args.model if isinstance(args.model, list) else [args.model]
    located = []
    for entry in entries:
        model_id, name = split_model_entry(entry)
        model_dir = resolve_model_dir(name, args.models_dir)
        located.append((model_id, model_dir, load_model_spec(model_dir)))
    index_manifest = None
    if args.index is not None:
        from onnxrank.retrieval.hybrid import load_index_manifest
        from onnxrank.retrieval.store import ChunkStore

        store = ChunkStore(args.index)
        try:
            index_manifest = load_index_manifest(store)
        finally:
            store.close()
    index_hash = None if index_manifest is None else index_manifest.embedder.manifest_hash
    own_embedder = index_hash is not None and not any(
        spec.task == "embedding" and spec.manifest_hash() == index_hash for _, _, spec in located)
    options = engine_overrides(args)
    count = len(located) + (1 if own_embedder else 0)
    shares = ([options.get("threads")] * count if count == 1
              else thread_shares(options.get("threads") or usable_cpus(), count))
    engines: dict[str, Any] = {}
    for (model_id, model_dir, spec), threads in zip(located, shares):
        kind = Reranker if spec.task == "rerank" else Embedder
        engine = kind.from_dir(model_dir, **{**options, "threads": threads})
        name = model_id or spec.name
        if name in engines:
            raise ValueError(f"two --model entries are served as {name!r}; give each its own id "
                             "with --model ID=MODEL")
        engines[name] = engine
    retriever = None
    if args.index is not None:
        from onnxrank.errors import MissingDependencyError
        from onnxrank.retrieval.hybrid import HybridRetriever

        matching = next((engine for engine in engines.values()
                         if engine.spec.task == "embedding"
                         and engine.spec.manifest_hash() == index_hash), None)
        retriever = HybridRetriever.open(
            args.index, embedder=matching, models_dir=args.models_dir,
            device=options.get("device", EngineConfig().device), threads=shares[-1])
        try:  # load the query embedder and the HNSW file now, not on the first search
            retriever.embedder  # noqa: B018 - the property loads it
            retriever.dense  # noqa: B018
        except MissingDependencyError as err:
            logger.warning("vector and hybrid search are unavailable: %s", err)
    return engines, retriever


def run_serve(args: argparse.Namespace) -> int:
    """Load the models (and the index), then serve them until SIGTERM or SIGINT.

    Raises:
        ValueError: A server setting out of range, or a bad --model entry.
        ModelLoadError: A --model is not an exported model.
        RetrievalError: --index is not an index.
        MissingDependencyError: The `serve` extra is not installed.
    """
    from onnxrank.serve.server import serve

    config = ServeConfig(**config_overrides(args, ServeConfig))  # checked before models load
    engines, retriever = load_served(args)
    serve(engines, config, retriever=retriever)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `serve` subcommand."""
    parser = subparsers.add_parser(
        "serve",
        help="serve rerank and embedding models and hybrid search over HTTP (Cohere, Jina, TEI "
             "and OpenAI APIs)",
        description="Serve rerank and embedding models over HTTP with the request and response "
                    "shapes of the Cohere v1/v2, Jina, text-embeddings-inference and OpenAI "
                    "embeddings APIs, and hybrid search over an index (--index). Concurrent "
                    "requests to a model share its engine's token-budget batches; a bounded "
                    "queue per model answers 429 when full. Binds 127.0.0.1 unless --host says "
                    "otherwise.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    group = parser.add_argument_group("engine options (same meaning in every command)")
    add_flag(group, None, "--model", action=_ModelEntries, default=DEFAULT_LOCAL_MODEL,
             metavar="[ID=]MODEL",
             help="a rerank or embedding model (a name under --models-dir, or a model "
                  "directory), served as ID (default: the manifest's name); repeat for several "
                  "models")
    add_flag(group, None, "--models-dir", default=DEFAULT_MODELS_DIR,
             help="where model names are looked up")
    add_config_options(group, EngineConfig, None)
    add_flag(parser, "serve", "--index", default=None, type=Path,
             help="an index built by `onnxrank index`, opened read-only for POST /v1/search; "
                  "its query embedder is the served embedding model that built it, else the one "
                  "its manifest records")
    add_config_options(parser.add_argument_group("server options"), ServeConfig, "serve")
    parser.set_defaults(handler=run_serve)
