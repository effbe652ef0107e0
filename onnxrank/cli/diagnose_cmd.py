"""`onnxrank diagnose`: what reranking did to each query's top 10, with plots."""

from __future__ import annotations

import argparse
import logging

from onnxrank.cli.common import HelpFormatter
from onnxrank.cli.options import add_engine_options, add_flag
from onnxrank.cli.retrieval_cmd import (
    add_fusion_options,
    add_reranker_options,
    fusion_config,
    make_backend,
)

logger = logging.getLogger(__name__)

COMMAND = "diagnose"
EPILOG = """example:
  onnxrank index --source onnxrank/bench/suite/data/cranfield-sample/corpus.jsonl \\
      --index indexes/sample --chunk-words 1000
  onnxrank diagnose --index indexes/sample \\
      --queries onnxrank/bench/suite/data/cranfield-sample/queries.jsonl --out reports/diagnose
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `diagnose` to the top-level parser."""
    parser = subparsers.add_parser(
        COMMAND,
        help="what reranking changed: top-10 overlap, top-1 changes, score distribution, "
             "length bias, stage times",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
        description="Run each query fused and reranked; write report.md, report.json, "
                    "rerank_scores.png and score_vs_length.png into --out.",
    )
    add_flag(parser, COMMAND, "--index", required=True, help="index directory")
    add_flag(parser, COMMAND, "--queries", required=True,
             help="queries.jsonl ({id, text} per line) or a text file with one query per line")
    add_flag(parser, COMMAND, "--out", required=True, help="report directory")
    add_flag(parser, COMMAND, "--max-queries", type=int, default=None, help="use only the first N queries")
    add_flag(parser, COMMAND, "--rerank-top-n", type=int, default=None,
             help="fused candidates reranked per query; default: search's own for k=10 (50)")
    add_fusion_options(parser, COMMAND)
    add_reranker_options(parser)
    add_engine_options(parser)
    parser.set_defaults(handler=run_diagnose)


def run_diagnose(args: argparse.Namespace) -> int:
    """Handler of `onnxrank diagnose`."""
    from onnxrank.retrieval import HybridRetriever, LoadTimings
    from onnxrank.retrieval.diagnostics import diagnose, load_queries, write_report

    queries = load_queries(args.queries, max_queries=args.max_queries)
    retriever = HybridRetriever.open(args.index, models_dir=args.models_dir)
    try:
        diagnosis = diagnose(retriever, queries, make_backend(args), rerank_top_n=args.rerank_top_n,
                             fusion=fusion_config(args))
    finally:
        retriever.close()
    paths = write_report(diagnosis, args.out)
    summary = diagnosis.summary()
    if diagnosis.warning:
        print(diagnosis.warning)
    for note in diagnosis.notes:
        print(f"note: {note}")
    print(
        f"{summary['queries']} queries, reranker {diagnosis.reranker} ({diagnosis.reranker_backend}): "
        f"mean top-10 overlap {summary['mean_overlap_at_10']:.2f}, top 1 changed on "
        f"{summary['top1_changed']} of {summary['queries_reranked']}, score-length Pearson "
        f"{summary['length_score_pearson']:.3f}"
    )
    print(f"({LoadTimings(**diagnosis.load_ms).summary()})")
    print("wrote " + ", ".join(str(path) for path in paths))
    return 0
