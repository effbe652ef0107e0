"""`onnxrank serve`: rerank, embedding and search over HTTP (flags generated from ServeConfig and
EngineConfig)."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxrank._optional import require
from onnxrank.cli.common import HelpFormatter
from onnxrank.cli.options import (
    add_config_options,
    add_flag,
    config_overrides,
    engine_overrides,
    locate_model,
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
  onnxrank serve --models-file models.toml --index indexes/docs
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
getting the remainder, at least 1 each; a model given `threads` in --models-file keeps them and
the others share the rest. SIGTERM stops accepting, finishes what is queued, then exits. See
docs/serve.md.

--models-file is TOML, one [[model]] table per model:
  [[model]]
  id = "reranker"              # optional; default: the manifest's name
  model = "minilm-standin"     # a name under --models-dir, or a model directory
  threads = 1                  # optional; default: its share of --threads
"""
MODEL_FILE_KEYS = ("id", "model", "threads")


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One model to serve: its id (None: the manifest's name), where it is, and its threads
    (None: a share of the process's)."""

    model_id: str | None
    model: str
    threads: int | None = None



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


def read_models_file(path: Path) -> list[ModelEntry]:
    """The [[model]] tables of a --models-file (see EPILOG).

    Raises:
        ValueError: Not TOML, no [[model]] table, an unknown key, a missing or non-string
            `model`, a non-string `id`, or `threads` not a positive integer; the message names
            the file and the table.
    """
    tomllib = require("tomllib" if sys.version_info >= (3, 11) else "tomli", extra="serve")
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except OSError as err:
        raise ValueError(f"--models-file {path} cannot be read: {err}") from err
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"--models-file {path} is not valid TOML: {err}") from err
    tables = document.get("model")
    if not isinstance(tables, list) or not tables:
        raise ValueError(f"--models-file {path} has no [[model]] table; write one per model with "
                         "`model = \"NAME_OR_DIR\"`")
    entries = []
    for number, table in enumerate(tables, 1):
        where = f"--models-file {path}, [[model]] number {number}"
        unknown = sorted(set(table) - set(MODEL_FILE_KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown keys {', '.join(unknown)}; allowed: "
                             f"{', '.join(MODEL_FILE_KEYS)}")
        model, model_id, threads = table.get("model"), table.get("id"), table.get("threads")
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"{where}: `model` must be a model name or directory, got "
                             f"{model!r}")
        if model_id is not None and (not isinstance(model_id, str) or not model_id.strip()):
            raise ValueError(f"{where}: `id` must be a non-empty string, got {model_id!r}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)
                                    or threads < 1):
            raise ValueError(f"{where}: `threads` must be a positive integer, got {threads!r}")
        entries.append(ModelEntry(model_id, model, threads))
    return entries


def model_entries(args: argparse.Namespace) -> list[ModelEntry]:
    """The models to serve: --models-file's, else the --model entries.

    Raises:
        ValueError: Both --models-file and --model on the command line, or a bad entry.
    """
    if args.models_file is not None:
        if isinstance(args.model, list):
            raise ValueError("give the models either with --model or in --models-file, not both")
        return read_models_file(args.models_file)
    entries = args.model if isinstance(args.model, list) else [args.model]
    return [ModelEntry(*split_model_entry(entry)) for entry in entries]


def engine_threads(fixed: list[int | None], total: int | None, available: int) -> list[int | None]:
    """Threads of each engine: a fixed count where given, else a share of what the fixed ones
    leave of `total` (None: `available`, the usable CPUs). A lone engine without a fixed count
    keeps None: the engine's own default, every usable CPU."""
    if fixed == [None]:
        return [total]
    free = [index for index, threads in enumerate(fixed) if threads is None]
    left = (total or available) - sum(threads for threads in fixed if threads is not None)
    shares = iter(thread_shares(max(left, 1), len(free)) if free else [])
    return [threads if threads is not None else next(shares) for threads in fixed]


def load_served(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The engines named by --model (by id) and the retriever of --index (or None).

    Raises:
        ModelLoadError: A --model is not an exported model.
        RetrievalError: --index is not an index.
        ValueError: Two models with the same id, or a bad --model entry.
    """
    from onnxrank.engine.devices import usable_cpus
    from onnxrank.engine.kinds import KINDS
    from onnxrank.engine.spec import load_model_spec

    located = []
    for entry in model_entries(args):
        model_dir = locate_model(args, entry.model)
        located.append((entry, model_dir, load_model_spec(model_dir)))
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
    fixed = [entry.threads for entry, _, _ in located] + ([None] if own_embedder else [])
    shares = engine_threads(fixed, options.get("threads"), usable_cpus())
    engines: dict[str, Any] = {}
    for (entry, model_dir, spec), threads in zip(located, shares):
        engine = KINDS[spec.kind].from_dir(model_dir, **{**options, "threads": threads})
        name = entry.model_id or spec.name
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

    if hasattr(signal, "SIGUSR1"):  # `kill -USR1 PID` prints every thread's stack (a hang's why)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
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
    add_flag(parser, "serve", "--models-file", default=None, type=Path,
             help="a TOML file of the models to serve, with their ids and threads (see below); "
                  "instead of --model")
    add_flag(parser, "serve", "--index", default=None, type=Path,
             help="an index built by `onnxrank index`, opened read-only for POST /v1/search; "
                  "its query embedder is the served embedding model that built it, else the one "
                  "its manifest records")
    add_config_options(parser.add_argument_group("server options"), ServeConfig, "serve")
    parser.set_defaults(handler=run_serve)
