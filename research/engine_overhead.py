"""Where a rerank call's time goes besides the runtime's infer, on the bench's own workload.

    python research/engine_overhead.py MODEL_DIR [--queries 20] [--rounds 3] [--held-out DIR ...]

Prints, per regime (short, mixed; 50 candidates per query, the bench's seed and dataset), the
median milliseconds per query of:
- the documents' ids (each way's ids as lists, which the engine's rows are built from) through the
  tokenizer's own ``encode_batch_fast``, the engine's PlainTokenizer (``encode``: its ASCII twin)
  and PlainTokenizer's ``ids`` (words looked up), back to back in a tight loop (``ids`` after the
  first round looks up words it has seen);
- each stage of ``Reranker.rerank`` on that model (time inside the stage's function, over all
  queries and rounds): plain tokenization (ids), all row encoding (tokenization included), batch
  planning, padding, the runner's infer, the scatter of scores and the ranking; and the call's
  time outside the infer.
The stage timers wrap the engine's functions, so they add a little time of their own.

With ``--held-out``, each dataset directory's documents (corpus.jsonl, as ``onnxrank eval`` reads
it) in calls of 50, in file order, through the tokenizer, PlainTokenizer's ``encode`` and a fresh
PlainTokenizer's ``ids`` (no word seen before the first call): the first call's milliseconds and
the mean over all calls, for text the workload above never showed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from tokenizers import Tokenizer

from onnxrank import Reranker
from onnxrank.bench.paths import DEFAULT_DATASET
from onnxrank.bench.workloads import REGIMES, PassageSource, build_workload, load_dataset
from onnxrank.engine import execution
from onnxrank.engine import reranker as reranker_module
from onnxrank.engine.plain_tokens import PlainTokenizer
from onnxrank.engine.tokenize import PairEncoder


def _timed(owner: Any, name: str, totals: dict[str, float], key: str) -> None:
    function: Callable[..., Any] = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            totals[key] = totals.get(key, 0.0) + time.perf_counter() - started

    setattr(owner, name, timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--held-out", nargs="*", default=[], metavar="DIR")
    args = parser.parse_args()

    reranker = Reranker.from_dir(args.model_dir)
    if not isinstance(reranker._encoder, PairEncoder):
        parser.error(f"{args.model_dir} is not a cross-encoder: its rows are not pair rows")
    print(f"{reranker.device_info.backend} {reranker.device_info.precision}")
    source = PassageSource(load_dataset(DEFAULT_DATASET), reranker.tokenizer)
    plain = PlainTokenizer(reranker.tokenizer)
    totals: dict[str, float] = {}
    _timed(reranker._encoder._texts, "ids", totals, "plain tokenization")
    _timed(reranker._encoder, "encode", totals, "rows (tokenization included)")
    _timed(reranker, "_plan", totals, "plan")
    _timed(execution, "batch_feeds", totals, "pad")
    _timed(reranker._runner, "run", totals, "infer")
    _timed(reranker, "_merge", totals, "scatter")
    _timed(reranker_module, "rank", totals, "rank")
    for regime in ("short", "mixed"):
        requests = build_workload(source, REGIMES[regime], queries=args.queries).requests
        tight: dict[str, list[float]] = {"tokenizer": [], "PlainTokenizer": [],
                                         "PlainTokenizer.ids": []}
        for _ in range(args.rounds):
            for request in requests:
                documents = list(request.documents)
                started = time.perf_counter()
                [encoding.ids for encoding in reranker.tokenizer.encode_batch_fast(
                    documents, add_special_tokens=False)]
                tight["tokenizer"].append(time.perf_counter() - started)
                started = time.perf_counter()
                [encoding.ids for encoding in plain.encode(documents)]
                tight["PlainTokenizer"].append(time.perf_counter() - started)
                started = time.perf_counter()
                plain.ids(documents)
                tight["PlainTokenizer.ids"].append(time.perf_counter() - started)
        print(regime, "tight loop, ms per query:",
              {name: round(statistics.median(times) * 1000, 2) for name, times in tight.items()})
        for request in requests:  # OpenVINO prepares each new shape on its first run
            reranker.rerank(request.query, list(request.documents))
        totals.clear()
        calls, total = 0, 0.0
        for _ in range(args.rounds):
            for request in requests:
                started = time.perf_counter()
                reranker.rerank(request.query, list(request.documents))
                total += time.perf_counter() - started
                calls += 1
        stages = {name: round(seconds / calls * 1000, 3) for name, seconds in totals.items()}
        print(regime, "rerank, ms per query:", {"call": round(total / calls * 1000, 2), **stages,
                                                "outside infer": round(
                                                    (total - totals["infer"]) / calls * 1000, 2)})
    for directory in args.held_out:
        _held_out(reranker.tokenizer, directory)


def _held_out(tokenizer: Tokenizer, directory: str) -> None:
    documents = load_dataset(directory).documents
    plain, fresh = PlainTokenizer(tokenizer), PlainTokenizer(tokenizer)
    ways: dict[str, Callable[[list[str]], object]] = {
        "tokenizer": lambda texts: [encoding.ids for encoding in tokenizer.encode_batch_fast(
            texts, add_special_tokens=False)],
        "PlainTokenizer": lambda texts: [encoding.ids for encoding in plain.encode(texts)],
        "PlainTokenizer.ids (fresh)": fresh.ids,
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for start in range(0, len(documents) - 49, 50):
        texts = list(documents[start:start + 50])
        for name, way in ways.items():
            started = time.perf_counter()
            way(texts)
            times[name].append(time.perf_counter() - started)
    print(directory, f"{len(times['tokenizer'])} calls of 50 documents, ms (first call, mean):",
          {name: (round(spent[0] * 1000, 2), round(statistics.mean(spent) * 1000, 2))
           for name, spent in times.items()})


if __name__ == "__main__":
    main()
