"""How much prefix reuse can gain on the bench's decoder requests, from the planned batches alone.

A research script, not part of the package. Every padded token of a decoder's batch costs about
the same, so the whole rows' padded tokens over the prefix plan's (each query's prefix counted
once, Batch.tokens) bound what reuse can gain on a workload. This script plans (no model runs)
the bench's requests of one regime (its dataset, seed and lengths) both ways with the engine's
own planner. Run from the repository root on an exported decoder::

    python research/prefix_plan_bound.py models/qwen3-0.6b-random-reranker short 50

It prints each plan's batches for the first request, the padded tokens over all requests, and
the bound, at padding multiples of 16 (what the batch check measured on avx512_vnni_bf16) and 8.
"""

from __future__ import annotations

import sys

from onnxrank.bench.paths import DEFAULT_DATASET
from onnxrank.bench.workloads import (
    DEFAULT_SEED,
    PassageSource,
    build_workload,
    load_dataset,
    parse_regimes,
)
from onnxrank.engine.reranker import Reranker, planned_batches

QUERIES = 6  # the bench's decoder scenario's requests per comparison
OPTIONS = {"backend": "openvino", "precision": "int8+bf16", "threads": 2}


def main() -> None:
    model, regime_name, candidates = sys.argv[1], sys.argv[2], int(sys.argv[3])
    regime = parse_regimes(regime_name)[0]
    for multiple in (16, 8):
        engines = {name: Reranker.from_dir(model, prefix_reuse=name == "prefix reuse",
                                           pad_to_multiple=multiple, **OPTIONS)
                   for name in ("whole rows", "prefix reuse")}
        source = PassageSource(load_dataset(DEFAULT_DATASET), engines["whole rows"].tokenizer)
        workload = build_workload(source, regime, queries=QUERIES, candidates=candidates,
                                  seed=DEFAULT_SEED)
        padded = dict.fromkeys(engines, 0)
        for number, request in enumerate(workload.requests):
            pairs = [(request.query, document) for document in request.documents]
            plans = {name: planned_batches(engine, pairs).batches
                     for name, engine in engines.items()}
            for name, plan in plans.items():
                padded[name] += sum(batch.tokens for batch in plan)
            if number == 0:
                for name, plan in plans.items():
                    shapes = [(len(batch.rows), batch.padded_length, batch.prefix_length)
                              for batch in plan]
                    print(f"multiple {multiple}, {name}: batches (rows, padded length, prefix) "
                          f"{shapes}")
        print(f"multiple {multiple}, {QUERIES} requests of {candidates} {regime.name}: padded "
              f"tokens whole rows {padded['whole rows']}, prefix reuse {padded['prefix reuse']}; "
              f"bound {padded['whole rows'] / padded['prefix reuse']:.3f}x")


if __name__ == "__main__":
    main()
