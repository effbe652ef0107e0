"""Subcommands `index`, `query` and `eval`: the embedded hybrid retriever."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, cast

from onnxrank.cli.common import HelpFormatter
from onnxrank.cli.options import (
    DEFAULT_MODELS_DIR,
    add_config_options,
    add_engine_options,
    add_flag,
    config_overrides,
    engine_overrides,
    load_reranker,
    locate_model,
)
from onnxrank.engine.config import DEVICES, EngineConfig, option_metadata
from onnxrank.options import field_flag
from onnxrank.rerankers.base import DEFAULT_ON_ERROR, DEFAULT_TIMEOUT_S, ON_ERRORS
from onnxrank.rerankers.llm import CHAT_APIS, DEFAULT_MAX_CONCURRENCY
from onnxrank.rerankers.registry import BACKEND_NAMES, DEFAULT_BACKEND
from onnxrank.retrieval.compression import (
    COMPRESSION_METHODS,
    DEFAULT_MAX_SEGMENTS,
    DEFAULT_SEGMENT_TOKENS,
)
from onnxrank.retrieval.dense import HnswSettings
from onnxrank.retrieval.document_vectors import DEFAULT_VECTOR_PRECISION, VECTOR_PRECISIONS
from onnxrank.retrieval.eval import DEFAULT_EVAL_RERANK_TOP_N, EVAL_CHUNK_WORDS, EVAL_MODES
from onnxrank.retrieval.fusion import DEFAULT_FUSION_WEIGHT, DEFAULT_RRF_K, FUSIONS, FusionConfig
from onnxrank.retrieval.hybrid import DEFAULT_DEPTH, DEFAULT_K
from onnxrank.retrieval.indexer import DEFAULT_CHUNK_WORDS, DEFAULT_EMBEDDER, DEFAULT_OVERLAP_WORDS
from onnxrank.retrieval.results import MODES, LoadTimings

logger = logging.getLogger(__name__)

INDEX_EPILOG = """example:
  onnxrank index --source docs --index indexes/docs --embedder minilm-embedder
  onnxrank index --source ../shared/data/cacm/corpus.jsonl --index indexes/cacm --chunk-words 1000
  onnxrank index --source docs --index indexes/docs --document-vectors colbert-small
"""
QUERY_EPILOG = """example:
  onnxrank query "how are int8 models validated" --index indexes/docs --mode hybrid \\
      --rerank --model minilm-standin --k 5
  onnxrank query "wing lift" --index indexes/papers --reranker cohere \\
      --reranker-url http://127.0.0.1:8080 --json
  onnxrank query "wing lift" --index indexes/papers --rerank --compress
  onnxrank query "wing lift" --index indexes/papers --fusion convex --fusion-weight 0.3
  onnxrank query "wing lift" --index indexes/docs --cascade colbert-small:50,minilm-standin \
      --rerank-top-n 1000 --deadline-ms 200
"""
EVAL_EPILOG = """example:
  onnxrank eval --dataset cranfield-sample --index indexes/cranfield-sample \\
      --modes vector,lexical,hybrid --out reports/sample
  onnxrank eval --dataset ../shared/data/cacm --index indexes/cacm --max-queries 20
  onnxrank eval --dataset ../shared/data/cacm --index indexes/cacm --modes hybrid \\
      --fusions rrf,convex --fusion-weights 0.3,0.5,0.7
"""
HNSW_DEFAULTS = HnswSettings()
ENGINE_DEFAULTS = EngineConfig()


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `index`, `query` and `eval` to the top-level parser."""
    _register_index(subparsers)
    _register_query(subparsers)
    _register_eval(subparsers)


def _add_embedder_runtime_flags(parser: argparse.ArgumentParser) -> None:
    """--models-dir, --device, --threads for commands that only embed (global engine twins)."""
    add_flag(parser, None, "--models-dir", default=DEFAULT_MODELS_DIR, help="where model names are looked up")
    add_flag(parser, None, "--device", default=ENGINE_DEFAULTS.device, choices=DEVICES,
             help="where inference runs")
    add_flag(parser, None, "--threads", type=int, default=ENGINE_DEFAULTS.threads,
             help="intra-op threads; default: the CPUs this process may use")


def _register_index(subparsers: argparse._SubParsersAction) -> None:
    command = "index"
    index = subparsers.add_parser(
        command,
        help="build or update a hybrid (FTS5 + HNSW) index",
        epilog=INDEX_EPILOG,
        formatter_class=HelpFormatter,
        description="Index a folder of .txt/.md files or a JSONL file; re-runs are incremental.",
    )
    add_flag(index, command, "--source", required=True,
             help="folder of .txt/.md files, or a .jsonl of {id, title, text, metadata} records")
    add_flag(index, command, "--index", required=True, help="index directory")
    add_flag(index, command, "--embedder", default=DEFAULT_EMBEDDER,
             help="embedding model name under --models-dir, or a path")
    add_flag(index, None, "--precision", default=ENGINE_DEFAULTS.precision,
             choices=["auto", "fp32", "opt", "int8", "fp16"],
             help="embedder variant; auto = the fastest variant that passed the export's gate")
    add_flag(index, None, field_flag("export_on_first_use"), action=argparse.BooleanOptionalAction,
             default=ENGINE_DEFAULTS.export_on_first_use,
             help=option_metadata("export_on_first_use")["help"])
    add_flag(index, command, "--chunk-words", type=int, default=DEFAULT_CHUNK_WORDS,
             help="words per chunk (400 words are about 520 MiniLM tokens)")
    add_flag(index, command, "--overlap-words", type=int, default=DEFAULT_OVERLAP_WORDS,
             help="words shared by consecutive chunks")
    add_flag(index, command, "--hnsw-m", type=int, default=HNSW_DEFAULTS.M,
             help="HNSW links per node, fixed at creation")
    add_flag(index, command, "--ef-construction", type=int, default=HNSW_DEFAULTS.ef_construction,
             help="HNSW build beam, fixed at creation")
    add_flag(index, command, "--ef-search", type=int, default=HNSW_DEFAULTS.ef_search,
             help="HNSW query beam stored as the index default")
    add_flag(index, command, "--reconcile", action=argparse.BooleanOptionalAction, default=None,
             help="remove documents missing from the source; default: on for folders, off for JSONL")
    add_flag(index, command, "--document-vectors", default=None,
             help="late-interaction model (name under --models-dir, or a path) whose token vectors "
                  "of every chunk are stored, so a rerank with it encodes only the query")
    add_flag(index, command, "--vector-precision", default=DEFAULT_VECTOR_PRECISION,
             choices=VECTOR_PRECISIONS,
             help="stored token vectors: fp16 (2 bytes a value) or int8 (1 byte a value and a "
                  "scale per vector); fixed when the index first stores vectors")
    add_flag(index, command, "--progress", action=argparse.BooleanOptionalAction,
             default=sys.stderr.isatty(), help="show a progress bar; default: when stderr is a terminal")
    _add_embedder_runtime_flags(index)
    index.set_defaults(handler=run_index)


def add_reranker_options(parser: argparse.ArgumentParser) -> None:
    """--reranker and the options of its backends (global twins: one meaning in every command)."""
    # add_flag takes a parser; an argument group has the same add_argument
    group = cast(argparse.ArgumentParser,
                 parser.add_argument_group("reranker backend (same meaning in every command)"))
    add_flag(group, None, "--reranker", default=None, choices=BACKEND_NAMES,
             help=f"rerank backend; default: {DEFAULT_BACKEND}. local: --model in this process; "
                  "cohere: a Cohere v2 rerank endpoint (Cohere, onnxrank serve); llm: a chat model's "
                  "0-10 ratings; none: the fused order")
    add_flag(group, None, "--reranker-url", default=None,
             help="cohere: endpoint root (default: Cohere's API); llm: the root holding "
                  "/chat/completions (openai) or /api/chat (ollama)")
    add_flag(group, None, "--reranker-model", default=None,
             help="cohere/llm: model name sent to the endpoint (local uses --model)")
    add_flag(group, None, "--reranker-api", default="openai", choices=CHAT_APIS,
             help="llm: chat API shape")
    add_flag(group, None, "--reranker-api-key", default=None,
             help="cohere/llm: API key (cohere also reads COHERE_API_KEY / CO_API_KEY)")
    add_flag(group, None, "--reranker-timeout", type=float, default=DEFAULT_TIMEOUT_S,
             help="cohere/llm: total seconds per rerank call")
    add_flag(group, None, "--reranker-concurrency", type=int, default=DEFAULT_MAX_CONCURRENCY,
             help="llm: chat requests in flight")
    add_flag(group, None, "--on-error", default=DEFAULT_ON_ERROR, choices=ON_ERRORS,
             help="fallback: keep the fused order (reranked=false) with one warning when the "
                  "backend cannot rerank; raise: fail the command")


def make_backend(args: argparse.Namespace) -> Any:
    """The rerank backend the flags describe (the local model is loaded on first use)."""
    from onnxrank.rerankers import make_reranker

    name = args.reranker or DEFAULT_BACKEND
    overrides = engine_overrides(args)
    return make_reranker(
        name,
        model=args.model if name == "local" else args.reranker_model,
        models_dir=args.models_dir,
        config=EngineConfig().with_overrides(**overrides) if overrides else None,
        base_url=args.reranker_url,
        api_key=args.reranker_api_key,
        api=args.reranker_api,
        timeout_s=args.reranker_timeout,
        max_concurrency=args.reranker_concurrency,
        on_error=args.on_error,
    )


def add_fusion_options(parser: argparse.ArgumentParser, command: str) -> None:
    """--fusion, --rrf-k, --fusion-weight: one flag per FusionConfig field, scoped by `command`."""
    add_config_options(parser.add_argument_group("fusion (hybrid mode)"), FusionConfig, command)


def fusion_config(args: argparse.Namespace) -> FusionConfig:
    """The FusionConfig of the flags the user set; the library's defaults for the rest."""
    return FusionConfig(**config_overrides(args, FusionConfig))


def _register_query(subparsers: argparse._SubParsersAction) -> None:
    command = "query"
    query = subparsers.add_parser(
        command,
        help="search an index (vector, lexical or hybrid, optionally reranked)",
        epilog=QUERY_EPILOG,
        formatter_class=HelpFormatter,
        description="Search an index built by `onnxrank index` and print a table or JSON.",
    )
    query.add_argument("text", help="the query")
    add_flag(query, command, "--index", required=True, help="index directory")
    add_flag(query, command, "--mode", default="hybrid", choices=MODES, help="retrieval mode")
    add_flag(query, command, "--k", type=int, default=DEFAULT_K, help="hits to show")
    add_flag(query, command, "--filter", default=None,
             help='metadata filters as JSON, e.g. \'{"topic": "aero", "year": {"gte": 1960}}\'')
    add_flag(query, command, "--depth", type=int, default=None,
             help=f"candidates per side; default max({DEFAULT_DEPTH}, k, rerank-top-n)")
    add_flag(query, command, "--rerank", action=argparse.BooleanOptionalAction, default=None,
             help="rerank the top fused candidates; default: on when --reranker or --cascade is given")
    add_flag(query, command, "--rerank-top-n", type=int, default=None,
             help="fused candidates to rerank; default max(5*k, 50)")
    add_flag(query, command, "--deadline-ms", type=float, default=None,
             help="rerank time budget; local: unscored candidates keep the fused order; remote: "
                  "the call gives up and keeps the fused order; cascade: the whole cascade's budget")
    add_flag(query, command, "--cascade", default=None,
             help="rerank through local models in stages, MODEL[:KEEP] separated by commas, e.g. "
                  "colbert-small:50,minilm-standin: each stage keeps its best KEEP for the next; a "
                  "late-interaction stage reads the index's stored document vectors")
    add_flag(query, command, "--embedder", default=None,
             help="query embedder; default: the one recorded in the index")
    add_flag(query, command, "--json", action=argparse.BooleanOptionalAction, default=False,
             help="print a JSON payload instead of a table")
    add_flag(query, command, "--compress", action=argparse.BooleanOptionalAction, default=False,
             help="print each hit's best segments instead of the whole chunk")
    add_flag(query, command, "--compress-method", default="auto", choices=COMPRESSION_METHODS,
             help="model: the local cross-encoder scores token windows; keywords: query-word "
                  "overlap; auto: model when the local reranker is loaded, else keywords")
    add_flag(query, command, "--max-segments", type=int, default=DEFAULT_MAX_SEGMENTS,
             help="segments kept per hit with --compress")
    add_flag(query, command, "--segment-tokens", type=int, default=DEFAULT_SEGMENT_TOKENS,
             help="tokens per segment with --compress (words in keyword mode without a model)")
    add_fusion_options(query, command)
    add_reranker_options(query)
    add_engine_options(query)
    query.set_defaults(handler=run_query)


def _register_eval(subparsers: argparse._SubParsersAction) -> None:
    command = "eval"
    evaluate = subparsers.add_parser(
        command,
        help="nDCG/MRR/Recall/MAP and latency of each retrieval mode on a dataset",
        epilog=EVAL_EPILOG,
        formatter_class=HelpFormatter,
        description="Evaluate an index on corpus.jsonl/queries.jsonl/qrels.tsv; indexes the "
        "corpus first (one chunk per document) when --index does not exist.",
    )
    add_flag(evaluate, command, "--dataset", required=True,
             help="dataset directory with corpus.jsonl, queries.jsonl, qrels.tsv, or the name of "
                  "the shipped sample, cranfield-sample")
    add_flag(evaluate, command, "--index", required=True, help="index directory")
    add_flag(evaluate, command, "--modes", default=",".join(EVAL_MODES),
             help=f"comma-separated modes: {', '.join(EVAL_MODES)}")
    add_flag(evaluate, command, "--k", type=int, default=DEFAULT_K, help="cutoff of nDCG, MRR and Recall")
    add_flag(evaluate, command, "--rerank-top-n", type=int, default=DEFAULT_EVAL_RERANK_TOP_N,
             help="fused candidates reranked per query")
    add_flag(evaluate, command, "--max-queries", type=int, default=None,
             help="evaluate only the first N judged queries")
    add_flag(evaluate, command, "--embedder", default=DEFAULT_EMBEDDER,
             help="embedder used when this command builds the index")
    add_flag(evaluate, command, "--chunk-words", type=int, default=EVAL_CHUNK_WORDS,
             help="words per chunk when this command builds the index; the default keeps each "
                  "abstract in one chunk")
    add_flag(evaluate, command, "--out", default=None,
             help="directory for eval.json and eval.md; default INDEX/eval")
    add_flag(evaluate, command, "--fusions", default=",".join(FUSIONS),
             help=f"comma-separated fusions; hybrid modes get one row per fusion (and per convex "
                  f"weight): {', '.join(FUSIONS)}")
    add_flag(evaluate, command, "--rrf-k", type=int, default=DEFAULT_RRF_K, help="rrf rank offset")
    add_flag(evaluate, command, "--fusion-weights", default=str(DEFAULT_FUSION_WEIGHT),
             help="comma-separated convex weights of the vector side, each 0 to 1, e.g. 0.3,0.5,0.7")
    add_reranker_options(evaluate)
    add_engine_options(evaluate)
    evaluate.set_defaults(handler=run_eval)


def _embedder_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Device and threads for the embedder, when the user set them."""
    return {name: getattr(args, name) for name in ("device", "threads")
            if getattr(args, name, None) is not None}


def run_index(args: argparse.Namespace) -> int:
    """Handler of `onnxrank index`."""
    from onnxrank.engine.embedder import Embedder
    from onnxrank.retrieval import build_index

    embedder = Embedder.from_dir(
        locate_model(args, args.embedder, task="embedding"),
        precision=args.precision,
        **_embedder_overrides(args),
    )
    document_vectors = None
    if args.document_vectors is not None:
        from onnxrank.engine.late_interaction import LateInteractionReranker
        from onnxrank.engine.reranker import Reranker

        model = Reranker.from_dir(locate_model(args, args.document_vectors), **_embedder_overrides(args))
        if not isinstance(model, LateInteractionReranker):
            raise ValueError(f"--document-vectors needs a late-interaction model, got "
                             f"{model.spec.name!r} ({model.spec.task})")
        document_vectors = model
    report = build_index(
        args.source,
        args.index,
        embedder,
        chunk_words=args.chunk_words,
        overlap_words=args.overlap_words,
        hnsw=HnswSettings(M=args.hnsw_m, ef_construction=args.ef_construction, ef_search=args.ef_search),
        reconcile=args.reconcile,
        show_progress=args.progress,
        document_vectors=document_vectors,
        vector_precision=args.vector_precision,
    )
    print(
        f"indexed {args.source} into {args.index} in {report.seconds:.1f} s: "
        f"{report.added} added, {report.updated} updated, {report.unchanged} unchanged, "
        f"{report.removed} removed; {report.documents} documents, {report.chunks} chunks "
        f"(embedder {embedder.spec.name}, {embedder.device_info.variant})"
    )
    if report.vector_chunks:
        print(f"stored document vectors: {report.vector_chunks} chunks, {report.vector_rows} "
              f"vectors, {report.vector_bytes} bytes ({report.vector_bytes / report.vector_chunks:.0f} "
              f"bytes a chunk, {report.vector_bytes / max(report.vector_rows, 1):.0f} a vector)")
    return 0


def _parse_filter(text: str | None) -> dict[str, Any] | None:
    try:
        filters = json.loads(text) if text else None
    except ValueError as err:
        raise ValueError(f"--filter must be a JSON object, got {text!r}: {err}") from err
    if filters is not None and not isinstance(filters, dict):
        raise ValueError(f"--filter must be a JSON object, got {text!r}")
    return filters


def _wants_rerank(args: argparse.Namespace) -> bool:
    if args.rerank is not None:
        return bool(args.rerank)
    return args.reranker is not None or getattr(args, "cascade", None) is not None


def _query_backend(args: argparse.Namespace, retriever: Any) -> Any:
    """The --cascade backend (with the index's stored vectors), else the --reranker one."""
    if args.cascade is None:
        return make_backend(args)
    if args.reranker is not None:
        raise ValueError("--cascade runs local models; leave --reranker unset")
    from onnxrank.rerankers.cascade import build_cascade, parse_stages
    from onnxrank.retrieval.document_vectors import open_document_vectors

    overrides = engine_overrides(args)
    return build_cascade(
        parse_stages(args.cascade),
        models_dir=args.models_dir,
        config=EngineConfig().with_overrides(**overrides) if overrides else None,
        document_vectors=open_document_vectors(retriever.store),
        on_error=args.on_error,
    )


def run_query(args: argparse.Namespace) -> int:
    """Handler of `onnxrank query`."""
    from onnxrank.retrieval import HybridRetriever

    filters = _parse_filter(args.filter)
    fusion = fusion_config(args)
    started = time.perf_counter()
    retriever = HybridRetriever.open(
        args.index, embedder=args.embedder, models_dir=args.models_dir, **_embedder_overrides(args)
    )
    open_ms = (time.perf_counter() - started) * 1000
    try:
        rerank = _wants_rerank(args)
        backend = _query_backend(args, retriever) if rerank else None
        # Models load here, not inside the first search's stage times.
        load = retriever.preload(mode=args.mode, reranker=backend)
        if args.embedder is not None:  # open() loaded the named embedder
            load = dataclasses.replace(load, embedder_ms=load.embedder_ms + open_ms)
        result = retriever.search_detailed(
            args.text,
            args.k,
            mode=args.mode,
            filters=filters,
            depth=args.depth,
            fusion=fusion.fusion,
            rrf_k=fusion.rrf_k,
            fusion_weight=fusion.fusion_weight,
            rerank=rerank,
            reranker=backend,
            rerank_top_n=args.rerank_top_n,
            rerank_deadline_ms=args.deadline_ms,
        )
    finally:
        retriever.close()
    if args.compress:
        result = _compress(args, result, backend)
    if args.json:
        payload = result.to_dict()
        payload["load_ms"] = load.to_dict()
        print(json.dumps(payload, indent=2, ensure_ascii=False))
        return 0
    for note in result.notes:
        print(note)
    print(_hits_table(result))
    timings = result.timings
    print(
        f"({len(result.hits)} hits, {result.fusion.label if args.mode == 'hybrid' else args.mode}; "
        f"lexical {timings.lexical_ms:.1f} ms, dense {timings.dense_ms:.1f} ms, fusion "
        f"{timings.fusion_ms:.1f} ms, rerank {timings.rerank_ms:.1f} ms)"
    )
    print(f"({load.summary()})")
    return 0



def _compress(args: argparse.Namespace, result: Any, backend: Any) -> Any:
    """The search result with each hit's best segments (see onnxrank.retrieval.compression)."""
    from onnxrank.errors import MissingDependencyError, ModelLoadError
    from onnxrank.rerankers import LocalReranker
    from onnxrank.retrieval.compression import compress

    reranker = None
    if args.compress_method == "model":
        reranker = backend.load() if isinstance(backend, LocalReranker) else load_reranker(args)
    elif args.compress_method == "auto" and isinstance(backend, LocalReranker):
        try:
            reranker = backend.load()
        except (ModelLoadError, MissingDependencyError):
            reranker = None  # the search already warned; keywords need no model
    compressed = compress(
        args.text,
        [hit.text for hit in result.hits],
        max_segments=args.max_segments,
        segment_tokens=args.segment_tokens,
        reranker=reranker,
        method=args.compress_method,
    )
    return dataclasses.replace(result, compressed=tuple(compressed))


def _hits_table(result: Any) -> str:
    rerank = result.reranker is not None
    header = f"{'#':>3} {'lex':>4} {'dense':>5} {'fused':>7}"
    if rerank:
        header += f" {'rerank':>7}"
    header += "  source / text"
    lines = [header, "-" * 100]
    for position, hit in enumerate(result.hits):
        line = (
            f"{hit.final_rank:>3} {hit.lexical_rank or '-':>4} {hit.dense_rank or '-':>5} "
            f"{hit.fused_score:>7.4f}"
        )
        if rerank:
            line += f" {hit.rerank_score:>7.3f}" if hit.rerank_score is not None else f" {'-':>7}"
        lines.append(f"{line}  {hit.source}#{hit.chunk_index}  {hit.title[:40]}")
        indent = " " * len(line)
        if result.compressed is None:
            lines.append(f"{indent}  {' '.join(hit.text.split())[:80]}")
            continue
        compressed = result.compressed[position]
        if not compressed.segments:
            lines.append(f"{indent}  (no segment matched the query)")
        for segment in compressed.segments:
            lines.append(f"{indent}  [{segment.start}:{segment.end}] {' '.join(segment.text.split())}")
        lines.append(
            f"{indent}  ({compressed.method}: kept {compressed.kept_tokens} of "
            f"{compressed.document_tokens} {compressed.unit})"
        )
    return "\n".join(lines)


def _eval_fusions(args: argparse.Namespace) -> list[FusionConfig]:
    """One FusionConfig per --fusions entry, and per --fusion-weights entry for convex."""
    names = [name.strip() for name in args.fusions.split(",") if name.strip()]
    unknown = [name for name in names if name not in FUSIONS]
    if unknown or not names:
        raise ValueError(f"--fusions has unknown fusions {unknown}; allowed: {', '.join(FUSIONS)}")
    try:
        weights = [float(weight) for weight in args.fusion_weights.split(",") if weight.strip()]
    except ValueError as err:
        raise ValueError(
            f"--fusion-weights must be comma-separated numbers from 0 to 1, got {args.fusion_weights!r}"
        ) from err
    if "convex" in names and not weights:
        raise ValueError("--fusion-weights needs at least one weight for the convex fusion, got none")
    configs = []
    for name in dict.fromkeys(names):
        if name == "convex":
            configs += [FusionConfig(fusion=name, rrf_k=args.rrf_k, fusion_weight=weight)
                        for weight in dict.fromkeys(weights)]
        else:
            configs.append(FusionConfig(fusion=name, rrf_k=args.rrf_k))
    return configs


def run_eval(args: argparse.Namespace) -> int:
    """Handler of `onnxrank eval`."""
    from onnxrank.engine.embedder import Embedder
    from onnxrank.retrieval import HybridRetriever, build_index
    from onnxrank.retrieval.eval import evaluate, load_dataset

    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = [mode for mode in modes if mode not in EVAL_MODES]
    if unknown or not modes:
        raise ValueError(f"--modes has unknown modes {unknown}; allowed: {', '.join(EVAL_MODES)}")
    fusions = _eval_fusions(args)
    dataset = load_dataset(args.dataset)
    index_dir = Path(args.index)
    if not (index_dir / "index.sqlite").exists():
        embedder = Embedder.from_dir(
            locate_model(args, args.embedder, task="embedding"), **_embedder_overrides(args)
        )
        report = build_index(
            dataset.corpus_path,
            index_dir,
            embedder,
            chunk_words=args.chunk_words,
            show_progress=sys.stderr.isatty(),
        )
        print(
            f"indexed {dataset.corpus_path}: {report.documents} documents, "
            f"{report.chunks} chunks in {report.seconds:.1f} s"
        )
    retriever = HybridRetriever.open(index_dir, models_dir=args.models_dir, **_embedder_overrides(args))
    try:
        backend = make_backend(args) if "hybrid+rerank" in modes else None
        result = evaluate(
            retriever,
            dataset,
            modes=modes,
            k=args.k,
            reranker=backend,
            rerank_top_n=args.rerank_top_n,
            max_queries=args.max_queries,
            fusions=fusions,
        )
    finally:
        retriever.close()
    out = Path(args.out) if args.out else index_dir / "eval"
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    (out / "eval.md").write_text(result.to_markdown(), encoding="utf-8")
    print(
        f"{dataset.name}: {result.queries} queries, embedder {result.embedder}"
        + (f", reranker {result.reranker} (top {result.rerank_top_n})" if result.reranker else "")
    )
    print(result.to_table())
    print(f"({LoadTimings(**result.load_ms).summary()})")
    print(f"wrote {out / 'eval.json'} and {out / 'eval.md'}")
    return 0

