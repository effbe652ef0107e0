"""`onnxrank score`: batch-score a file of (query, document) pairs, locally or on Ray Data."""

from __future__ import annotations

import argparse
import sys

from onnxrank.cli.common import HelpFormatter
from onnxrank.cli.options import (
    add_engine_options,
    add_flag,
    engine_overrides,
    load_reranker,
    locate_model,
)
from onnxrank.scoring.job import DEFAULT_SHARD_ROWS, score_file
from onnxrank.scoring.ray_job import DEFAULT_BATCH_ROWS
from onnxrank.scoring.records import file_format

COMMAND = "score"
LOCAL_RAY = "local"

EPILOG = """examples:
  onnxrank score --input pairs.jsonl --output scores.parquet --model minilm-standin
  onnxrank score --input pairs.parquet --output scores.jsonl --id-columns qid,docid
  onnxrank score --input pairs.parquet --output scores-dir --ray --actors 2 --threads 1
  onnxrank score --input pairs.parquet --output scores-dir --ray ray://head:10001 --actors 8

Input: JSONL or Parquet (by suffix) with `query` and `document` fields and optional id columns.
Output (local): `row` (0-based input row), the id columns and `score` (the model's raw logit),
in input order; rows that cannot be scored go to the --bad-rows JSONL side file. The run writes
shards beside the output (OUTPUT.parts/) and resumes from them when restarted after a kill.
Output (--ray): a directory of Parquet files, in input order, with the id columns, `score` and
`error` (the reason a row was not scored). See docs/scale.md.
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        COMMAND, help="batch-score a JSONL/Parquet file of pairs (resumable; Ray scale-out)",
        description="Score every (query, document) row of a JSONL or Parquet file.",
        epilog=EPILOG, formatter_class=HelpFormatter,
    )
    add_flag(parser, COMMAND, "--input", required=True, metavar="PAIRS",
             help="JSONL (.jsonl/.ndjson/.json) or Parquet (.parquet/.pq) file of pairs")
    add_flag(parser, COMMAND, "--output", required=True, metavar="SCORES",
             help="scores file, JSONL or Parquet by suffix (with --ray: a directory of Parquet files)")
    add_flag(parser, COMMAND, "--bad-rows", metavar="FILE", default=None,
             help="JSONL side file for rows that cannot be scored; default: "
                  "OUTPUT_STEM.bad_rows.jsonl beside the output (not with --ray)")
    add_flag(parser, COMMAND, "--id-columns", default="id", metavar="NAMES",
             help="comma-separated input columns copied to the output ('' for none)")
    add_flag(parser, COMMAND, "--shard-rows", type=int, default=None, metavar="N",
             help=f"input rows per shard, the unit a resumed run skips; default: "
                  f"{DEFAULT_SHARD_ROWS} (not with --ray)")
    add_flag(parser, COMMAND, "--overwrite", action=argparse.BooleanOptionalAction, default=False,
             help="replace an existing output")
    add_flag(parser, COMMAND, "--progress", action=argparse.BooleanOptionalAction, default=True,
             help="show a progress bar with pairs/s on stderr")
    add_flag(parser, COMMAND, "--ray", nargs="?", const=LOCAL_RAY, default=None, metavar="ADDRESS",
             help="run on Ray Data: a local instance, or the cluster at ADDRESS "
                  "(e.g. ray://head:10001); extra 'ray'")
    add_flag(parser, COMMAND, "--actors", type=int, default=None, metavar="N",
             help="with --ray: model replicas, each loading the model once and running "
                  "--threads threads (1 unless set); default: 1")
    add_flag(parser, COMMAND, "--batch-rows", type=int, default=None, metavar="N",
             help=f"with --ray: rows per map_batches call; default: {DEFAULT_BATCH_ROWS}")
    add_engine_options(parser)
    parser.set_defaults(handler=run_score)


def _id_columns(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    clashes = sorted(set(names) & {"query", "document", "row", "score", "error"})
    if clashes:
        raise ValueError(f"--id-columns {text!r} names {clashes}, which the input or output uses "
                         "for something else; choose other columns")
    return names


def run_score(args: argparse.Namespace) -> int:
    """Score the input locally (resumable) or on Ray Data.

    Raises:
        ValueError: Bad flags, inputs or outputs (see score_file / score_file_on_ray).
        ModelLoadError: --model is not an exported model.
        MissingDependencyError: Parquet without pyarrow, --ray without ray[data].
    """
    id_columns = _id_columns(args.id_columns)
    if args.ray is not None:
        return _run_on_ray(args, id_columns)
    for flag, value in (("--actors", args.actors), ("--batch-rows", args.batch_rows)):
        if value is not None:
            raise ValueError(f"{flag} {value} applies only with --ray")
    # check the file names before the (slower) model load
    file_format(args.input, flag="--input")
    file_format(args.output, flag="--output")
    reranker = load_reranker(args)
    summary = score_file(
        reranker, args.input, args.output, bad_rows_path=args.bad_rows, id_columns=id_columns,
        shard_rows=args.shard_rows if args.shard_rows is not None else DEFAULT_SHARD_ROWS,
        overwrite=args.overwrite, show_progress=args.progress,
    )
    if summary.resumed_shards:
        print(f"resumed: {summary.resumed_shards} of {summary.shards} shards were already scored "
              "and were not scored again", file=sys.stderr)
    rate = summary.scored / summary.seconds if summary.seconds > 0 else 0.0
    print(f"scored {summary.scored} pairs -> {summary.output} ({summary.bad_rows} bad rows -> "
          f"{summary.bad_rows_path}) in {summary.seconds:.1f} s ({rate:.0f} pairs/s this run)")
    if not reranker.spec.relevance_trained:
        print(f"note: {args.model} is not relevance-trained; its scores are not relevance scores",
              file=sys.stderr)
    return 0


def _run_on_ray(args: argparse.Namespace, id_columns: list[str]) -> int:
    from onnxrank.scoring.ray_job import score_file_on_ray

    for flag, value in (("--bad-rows", args.bad_rows), ("--shard-rows", args.shard_rows)):
        if value is not None:
            raise ValueError(f"{flag} does not apply with --ray (bad rows stay in the output with "
                             "their reason in the 'error' column; Ray retries failed tasks itself)")
    model_dir = locate_model(args, args.model)
    summary = score_file_on_ray(
        model_dir, args.input, args.output, engine_options=engine_overrides(args),
        id_columns=id_columns, actors=args.actors if args.actors is not None else 1,
        batch_rows=args.batch_rows if args.batch_rows is not None else DEFAULT_BATCH_ROWS,
        address=None if args.ray == LOCAL_RAY else args.ray, overwrite=args.overwrite,
        show_progress=args.progress,
    )
    print(f"scored {summary.rows} rows on Ray ({summary.address}, {summary.actors} actors) -> "
          f"{summary.output}/ in {summary.seconds:.1f} s (Ray start-up included)")
    return 0
