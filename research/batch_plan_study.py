"""Measures what a query costs when its batch shapes are new to the runtime, under batch-planning
settings.

A research script, not part of the package: it informed docs/benchmarks.md ("Explaining a share",
first runs of new shapes) and OpenVINO's per-run charge in the batch planner
(``OpenvinoRunner.cpu_run_overhead_tokens``). Run from the repository root, alone on the machine::

    python research/batch_plan_study.py --model minilm-standin --regime mixed --queries 12

Each setting (engine options such as ``pad_to_multiple`` and ``max_batch_size``, or OpenVINO's
per-run charge) runs in a fresh process, so that no shape is known to the runtime at the start, on
the queries of a bench workload (the latency scenario's seed and 50 candidates). One untimed query
first, as the bench does; then every query once ("first run": most of its shapes are new, as in
the latency scenario) and then every query again ("again": every shape known). The settings
alternate over ``--rounds`` rounds so that drift over the run does not favour one. Printed: per
setting and round, the median per-query times, the batches per query and the distinct batch
shapes the workload needed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

# Engine options, and "charge": OpenVINO's per-run charge in the planner
# (OpenvinoRunner.cpu_run_overhead_tokens), which is not an option, set here for the study only.
SETTINGS: dict[str, dict[str, int]] = {
    "default (OpenVINO charge 128, the measured multiple)": {},
    "pad 8 (the default before the batch check)": {"pad_to_multiple": 8},
    "charge 256": {"charge": 256},
    "no charge (the planner before 2026-11-25)": {"charge": 0},
    "no charge, pad 16": {"charge": 0, "pad_to_multiple": 16},
    "one row per run": {"max_batch_size": 1},
}


def measure(model: str, regime: str, queries: int, overrides: dict[str, int]) -> dict[str, Any]:
    """First-run and repeat times of a workload's queries in this process."""
    from onnxrank.bench.paths import DEFAULT_DATASET
    from onnxrank.bench.workloads import (
        DEFAULT_CANDIDATES,
        DEFAULT_SEED,
        REGIMES,
        PassageSource,
        build_workload,
        load_dataset,
    )
    from onnxrank.engine.reranker import Reranker

    options = dict(overrides)
    if "charge" in options:
        from onnxrank.engine.backends.openvino import OpenvinoRunner

        OpenvinoRunner.cpu_run_overhead_tokens = options.pop("charge")
    reranker = Reranker.from_pretrained(model, device="cpu", **options)
    source = PassageSource(load_dataset(DEFAULT_DATASET), reranker.tokenizer)
    workload = build_workload(source, REGIMES[regime], queries=queries + 1,
                              candidates=DEFAULT_CANDIDATES, seed=DEFAULT_SEED)
    requests = [[(request.query, document) for document in request.documents]
                for request in workload.requests]
    reranker.score(requests[-1])  # untimed, as the bench's warm-up item
    first, again, batches, shapes = [], [], [], set()
    for pairs in requests[:-1]:
        started = time.perf_counter()
        run = reranker.score_detailed(pairs)
        first.append(time.perf_counter() - started)
        batches.append(len(run.batches))
        shapes.update(run.batches)
    for pairs in requests[:-1]:
        started = time.perf_counter()
        reranker.score(pairs)
        again.append(time.perf_counter() - started)
    return {
        "runtime": f"{reranker.device_info.backend} {reranker.device_info.precision}",
        "first_run_ms": round(1000 * statistics.median(first), 1),
        "again_ms": round(1000 * statistics.median(again), 1),
        "batches_per_query": statistics.median(batches),
        "distinct_shapes": len(shapes),
    }


def main() -> None:
    """Command-line entry: one fresh process per setting and round, a Markdown row each."""
    parser = argparse.ArgumentParser(description="First-run cost of new batch shapes per setting.")
    parser.add_argument("--model", default="minilm-standin", help="model name or directory")
    parser.add_argument("--regime", default="short", help="bench regime (short, medium, long, mixed)")
    parser.add_argument("--queries", type=int, default=24, help="queries per setting")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the settings")
    parser.add_argument("--only", nargs="+", choices=list(SETTINGS), default=list(SETTINGS),
                        metavar="SETTING", help="settings to run (default: all)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.model, args.regime, args.queries, SETTINGS[args.child])))
        return
    print("| setting | round | runtime | first run ms | again ms | batches / query | shapes |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for round_index in range(1, args.rounds + 1):
        for name in args.only:
            child = subprocess.run(
                [sys.executable, __file__, "--model", args.model, "--regime", args.regime,
                 "--queries", str(args.queries), "--child", name],
                check=True, capture_output=True, text=True)
            row = json.loads(child.stdout.strip().splitlines()[-1])
            print(f"| {name} | {round_index} | {row['runtime']} | {row['first_run_ms']} | "
                  f"{row['again_ms']} | {row['batches_per_query']} | {row['distinct_shapes']} |",
                  flush=True)


if __name__ == "__main__":
    main()
