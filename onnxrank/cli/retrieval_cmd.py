"""Subcommands `index`, `query` and `eval`: the embedded hybrid retriever."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from onnxrank.cli.common import HelpFormatter, env_default
from onnxrank.errors import ModelLoadError

logger = logging.getLogger(__name__)

INDEX_EPILOG = """example:
  onnxrank index --source docs --index indexes/docs --embedder minilm-embedder
  onnxrank index --source ../shared/data/cacm/corpus.jsonl --index indexes/cacm --chunk-words 1000
"""
QUERY_EPILOG = """example:
  onnxrank query "how are int8 models validated" --index indexes/docs --mode hybrid \\
      --rerank --model minilm-standin --k 5
  onnxrank query "wing lift" --index indexes/papers --filter '{"year": {"gte": 1960}}' --json
"""
EVAL_EPILOG = """example:
  onnxrank eval --dataset ../shared/data/cranfield --index indexes/cranfield \\
      --modes vector,lexical,hybrid --out reports/cranfield
  onnxrank eval --dataset ../shared/data/cacm --index indexes/cacm --max-queries 20
"""
STANDIN_NOTE = (
    "note: reranker {name!r} is not relevance-trained (manifest relevance_trained=false); "
    "its scores are not relevance scores and the reranked order is not a quality result"
)


def _env_bool(flag: str, default: bool) -> bool:
    value = env_default(flag, None)
    if value is None:
        return default
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models-dir",
        default=env_default("models-dir", "models"),
        help="where model names are looked up (env ONNXRANK_MODELS_DIR)",
    )
    parser.add_argument(
        "--device",
        default=env_default("device", "auto"),
        choices=["auto", "cpu", "cuda"],
        help="device for the models (env ONNXRANK_DEVICE)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=env_default("threads", None),
        help="intra-op threads per model; default: all usable CPUs (env ONNXRANK_THREADS)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `index`, `query` and `eval` to the top-level parser."""
    index = subparsers.add_parser(
        "index",
        help="build or update a hybrid (FTS5 + HNSW) index",
        epilog=INDEX_EPILOG,
        formatter_class=HelpFormatter,
        description="Index a folder of .txt/.md files or a JSONL file; re-runs are incremental.",
    )
    index.add_argument(
        "--source",
        required=env_default("source", None) is None,
        default=env_default("source", None),
        help="folder of .txt/.md files, or a .jsonl of {id, title, text, metadata} records "
        "(env ONNXRANK_SOURCE)",
    )
    index.add_argument(
        "--index",
        required=env_default("index", None) is None,
        default=env_default("index", None),
        help="index directory (env ONNXRANK_INDEX)",
    )
    index.add_argument(
        "--embedder",
        default=env_default("embedder", "minilm-embedder"),
        help="embedding model name under --models-dir, or a path (env ONNXRANK_EMBEDDER)",
    )
    index.add_argument(
        "--precision",
        default=env_default("precision", "auto"),
        choices=["auto", "fp32", "opt", "int8", "fp16"],
        help="embedder variant; auto = int8 on CPU (env ONNXRANK_PRECISION)",
    )
    index.add_argument(
        "--chunk-words",
        type=int,
        default=env_default("chunk-words", 400),
        help="words per chunk, about 520 MiniLM tokens (env ONNXRANK_CHUNK_WORDS)",
    )
    index.add_argument(
        "--overlap-words",
        type=int,
        default=env_default("overlap-words", 80),
        help="words shared by consecutive chunks (env ONNXRANK_OVERLAP_WORDS)",
    )
    index.add_argument(
        "--hnsw-m",
        type=int,
        default=env_default("hnsw-m", 16),
        help="HNSW links per node, fixed at creation (env ONNXRANK_HNSW_M)",
    )
    index.add_argument(
        "--ef-construction",
        type=int,
        default=env_default("ef-construction", 200),
        help="HNSW build beam, fixed at creation (env ONNXRANK_EF_CONSTRUCTION)",
    )
    index.add_argument(
        "--ef-search",
        type=int,
        default=env_default("ef-search", 200),
        help="HNSW query beam stored as the index default (env ONNXRANK_EF_SEARCH)",
    )
    index.add_argument(
        "--reconcile",
        action=argparse.BooleanOptionalAction,
        default=None if env_default("reconcile", None) is None else _env_bool("reconcile", True),
        help="remove documents missing from the source; default: on for folders, "
        "off for JSONL (env ONNXRANK_RECONCILE)",
    )
    index.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=_env_bool("progress", sys.stderr.isatty()),
        help="show a progress bar; default: when stderr is a terminal (env ONNXRANK_PROGRESS)",
    )
    _add_model_flags(index)
    index.set_defaults(handler=run_index)

    query = subparsers.add_parser(
        "query",
        help="search an index (vector, lexical or hybrid, optionally reranked)",
        epilog=QUERY_EPILOG,
        formatter_class=HelpFormatter,
        description="Search an index built by `onnxrank index` and print a table or JSON.",
    )
    query.add_argument("text", help="the query")
    query.add_argument(
        "--index",
        required=env_default("index", None) is None,
        default=env_default("index", None),
        help="index directory (env ONNXRANK_INDEX)",
    )
    query.add_argument(
        "--mode",
        default=env_default("mode", "hybrid"),
        choices=["vector", "lexical", "hybrid"],
        help="retrieval mode (env ONNXRANK_MODE)",
    )
    query.add_argument("--k", type=int, default=env_default("k", 10), help="hits to show (env ONNXRANK_K)")
    query.add_argument(
        "--filter",
        default=env_default("filter", None),
        help='metadata filters as JSON, e.g. \'{"topic": "aero", "year": {"gte": 1960}}\' '
        "(env ONNXRANK_FILTER)",
    )
    query.add_argument(
        "--depth",
        type=int,
        default=env_default("depth", None),
        help="candidates per side; default max(100, k, rerank-top-n) (env ONNXRANK_DEPTH)",
    )
    query.add_argument(
        "--rrf-k",
        type=int,
        default=env_default("rrf-k", 60),
        help="reciprocal rank fusion offset (env ONNXRANK_RRF_K)",
    )
    query.add_argument(
        "--rerank",
        action=argparse.BooleanOptionalAction,
        default=_env_bool("rerank", False),
        help="rerank the top fused candidates with --model (env ONNXRANK_RERANK)",
    )
    query.add_argument(
        "--model",
        default=env_default("model", "minilm-standin"),
        help="rerank model name under --models-dir, or a path (env ONNXRANK_MODEL)",
    )
    query.add_argument(
        "--rerank-top-n",
        type=int,
        default=env_default("rerank-top-n", None),
        help="fused candidates to rerank; default max(5*k, 50) (env ONNXRANK_RERANK_TOP_N)",
    )
    query.add_argument(
        "--deadline-ms",
        type=float,
        default=env_default("deadline-ms", None),
        help="rerank time budget; unscored candidates keep fused order (env ONNXRANK_DEADLINE_MS)",
    )
    query.add_argument(
        "--on-error",
        default=env_default("on-error", "raise"),
        choices=["raise", "fallback"],
        help="fallback: keep the fused order (reranked=false) if the rerank model "
        "fails to load or run (env ONNXRANK_ON_ERROR)",
    )
    query.add_argument(
        "--embedder",
        default=env_default("embedder", None),
        help="query embedder; default: the one recorded in the index (env ONNXRANK_EMBEDDER)",
    )
    query.add_argument(
        "--json",
        action=argparse.BooleanOptionalAction,
        default=_env_bool("json", False),
        help="print a JSON payload instead of a table (env ONNXRANK_JSON)",
    )
    _add_model_flags(query)
    query.set_defaults(handler=run_query)

    evaluate = subparsers.add_parser(
        "eval",
        help="nDCG/MRR/Recall/MAP and latency of each retrieval mode on a dataset",
        epilog=EVAL_EPILOG,
        formatter_class=HelpFormatter,
        description="Evaluate an index on corpus.jsonl/queries.jsonl/qrels.tsv; indexes the "
        "corpus first (one chunk per document) when --index does not exist.",
    )
    evaluate.add_argument(
        "--dataset",
        required=env_default("dataset", None) is None,
        default=env_default("dataset", None),
        help="dataset directory with corpus.jsonl, queries.jsonl, qrels.tsv (env ONNXRANK_DATASET)",
    )
    evaluate.add_argument(
        "--index",
        required=env_default("index", None) is None,
        default=env_default("index", None),
        help="index directory (env ONNXRANK_INDEX)",
    )
    evaluate.add_argument(
        "--modes",
        default=env_default("modes", "vector,lexical,hybrid,hybrid+rerank"),
        help="comma-separated modes: vector, lexical, hybrid, hybrid+rerank (env ONNXRANK_MODES)",
    )
    evaluate.add_argument(
        "--k",
        type=int,
        default=env_default("k", 10),
        help="cutoff of nDCG, MRR and Recall (env ONNXRANK_K)",
    )
    evaluate.add_argument(
        "--model",
        default=env_default("model", "minilm-standin"),
        help="rerank model for hybrid+rerank (env ONNXRANK_MODEL)",
    )
    evaluate.add_argument(
        "--rerank-top-n",
        type=int,
        default=env_default("rerank-top-n", 50),
        help="fused candidates reranked per query (env ONNXRANK_RERANK_TOP_N)",
    )
    evaluate.add_argument(
        "--max-queries",
        type=int,
        default=env_default("max-queries", None),
        help="evaluate only the first N judged queries (env ONNXRANK_MAX_QUERIES)",
    )
    evaluate.add_argument(
        "--embedder",
        default=env_default("embedder", "minilm-embedder"),
        help="embedder used when this command builds the index (env ONNXRANK_EMBEDDER)",
    )
    evaluate.add_argument(
        "--chunk-words",
        type=int,
        default=env_default("chunk-words", 1000),
        help="words per chunk when this command builds the index; 1000 keeps each "
        "abstract in one chunk (env ONNXRANK_CHUNK_WORDS)",
    )
    evaluate.add_argument(
        "--out",
        default=env_default("out", None),
        help="directory for eval.json and eval.md; default INDEX/eval (env ONNXRANK_OUT)",
    )
    _add_model_flags(evaluate)
    evaluate.set_defaults(handler=run_eval)


def run_index(args: argparse.Namespace) -> int:
    """Handler of `onnxrank index`."""
    from onnxrank.retrieval import Embedder, build_index
    from onnxrank.retrieval.dense import HnswSettings
    from onnxrank.retrieval.embedder import resolve_model_dir

    embedder = Embedder.from_dir(
        resolve_model_dir(args.embedder, args.models_dir),
        device=args.device,
        precision=args.precision,
        threads=args.threads,
    )
    report = build_index(
        args.source,
        args.index,
        embedder,
        chunk_words=args.chunk_words,
        overlap_words=args.overlap_words,
        hnsw=HnswSettings(M=args.hnsw_m, ef_construction=args.ef_construction, ef_search=args.ef_search),
        reconcile=args.reconcile,
        show_progress=args.progress,
    )
    print(
        f"indexed {args.source} into {args.index} in {report.seconds:.1f} s: "
        f"{report.added} added, {report.updated} updated, {report.unchanged} unchanged, "
        f"{report.removed} removed; {report.documents} documents, {report.chunks} chunks "
        f"(embedder {embedder.spec.name}, {embedder.device_info.variant})"
    )
    return 0


def _load_reranker(args: argparse.Namespace) -> Any:
    from onnxrank.engine.reranker import Reranker

    try:
        return Reranker.from_pretrained(
            args.model, models_dir=args.models_dir, device=args.device, threads=args.threads
        )
    except ModelLoadError as err:
        if getattr(args, "on_error", "raise") != "fallback":
            raise
        print(
            f"warning: rerank model failed to load ({err}); keeping the fused order",
            file=sys.stderr,
        )
        return None


def run_query(args: argparse.Namespace) -> int:
    """Handler of `onnxrank query`."""
    from onnxrank.retrieval import HybridRetriever

    try:
        filters = json.loads(args.filter) if args.filter else None
    except ValueError as err:
        raise ValueError(f"--filter must be a JSON object, got {args.filter!r}: {err}") from err
    if filters is not None and not isinstance(filters, dict):
        raise ValueError(f"--filter must be a JSON object, got {args.filter!r}")
    retriever = HybridRetriever.open(
        args.index,
        embedder=args.embedder,
        models_dir=args.models_dir,
        device=args.device,
        threads=args.threads,
    )
    reranker = _load_reranker(args) if args.rerank else None
    notes = []
    if reranker is not None and not reranker.spec.relevance_trained:
        notes.append(STANDIN_NOTE.format(name=reranker.spec.name))
    result = retriever.search_detailed(
        args.text,
        args.k,
        mode=args.mode,
        filters=filters,
        depth=args.depth,
        rrf_k=args.rrf_k,
        rerank=args.rerank,
        reranker=reranker,
        rerank_top_n=args.rerank_top_n,
        rerank_deadline_ms=args.deadline_ms,
        rerank_on_error=args.on_error,
    )
    if args.rerank and reranker is None:
        notes.append("note: no rerank model could be loaded; hits are in fused order (reranked=false)")
    if args.json:
        payload = {
            "query": args.text,
            "k": args.k,
            "mode": args.mode,
            "filters": filters,
            "rerank": args.rerank,
            "reranker": None if reranker is None else reranker.spec.name,
            "notes": notes,
            "timings_ms": asdict(result.timings),
            "results": [asdict(hit) for hit in result.hits],
        }
        print(json.dumps(payload, indent=2, ensure_ascii=False))
        return 0
    for note in notes:
        print(note)
    print(_hits_table(result.hits, rerank=args.rerank))
    timings = result.timings
    print(
        f"({len(result.hits)} hits; lexical {timings.lexical_ms:.1f} ms, dense "
        f"{timings.dense_ms:.1f} ms, fusion {timings.fusion_ms:.1f} ms, rerank "
        f"{timings.rerank_ms:.1f} ms)"
    )
    return 0


def _hits_table(hits: list[Any], *, rerank: bool) -> str:
    header = f"{'#':>3} {'lex':>4} {'dense':>5} {'rrf':>7}"
    if rerank:
        header += f" {'rerank':>7}"
    header += "  source / text"
    lines = [header, "-" * 100]
    for hit in hits:
        line = (
            f"{hit.final_rank:>3} {hit.lexical_rank or '-':>4} {hit.dense_rank or '-':>5} "
            f"{hit.rrf_score:>7.4f}"
        )
        if rerank:
            line += f" {hit.rerank_score:>7.3f}" if hit.rerank_score is not None else f" {'-':>7}"
        snippet = " ".join(hit.text.split())[:80]
        lines.append(f"{line}  {hit.source}#{hit.chunk_index}  {hit.title[:40]}")
        lines.append(f"{'':>{len(line)}}  {snippet}")
    return "\n".join(lines)


def run_eval(args: argparse.Namespace) -> int:
    """Handler of `onnxrank eval`."""
    from onnxrank.retrieval import Embedder, HybridRetriever, build_index
    from onnxrank.retrieval.embedder import resolve_model_dir
    from onnxrank.retrieval.eval import EVAL_MODES, evaluate, load_dataset

    dataset = load_dataset(args.dataset)
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    unknown = [mode for mode in modes if mode not in EVAL_MODES]
    if unknown:
        raise ValueError(f"--modes has unknown modes {unknown}; allowed: {', '.join(EVAL_MODES)}")
    index_dir = Path(args.index)
    if not (index_dir / "index.sqlite").exists():
        embedder = Embedder.from_dir(
            resolve_model_dir(args.embedder, args.models_dir),
            device=args.device,
            threads=args.threads,
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
    retriever = HybridRetriever.open(index_dir, device=args.device, threads=args.threads)
    reranker = _load_reranker(args) if "hybrid+rerank" in modes else None
    result = evaluate(
        retriever,
        dataset,
        modes=modes,
        k=args.k,
        reranker=reranker,
        rerank_top_n=args.rerank_top_n,
        max_queries=args.max_queries,
    )
    out = Path(args.out) if args.out else index_dir / "eval"
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n", encoding="utf-8")
    (out / "eval.md").write_text(result.to_markdown(), encoding="utf-8")
    print(
        f"{dataset.name}: {result.queries} queries, embedder {result.embedder}"
        + (f", reranker {result.reranker} (top {result.rerank_top_n})" if result.reranker else "")
    )
    print(result.to_table())
    print(f"wrote {out / 'eval.json'} and {out / 'eval.md'}")
    return 0
