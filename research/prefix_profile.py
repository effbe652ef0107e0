"""Where a decoder's prefix reuse spends its time: the same planned batches of one query run whole
and through the prefix graph, timed alone, and OpenVINO's own time per operation type.

A research script, not part of the package. It needs an exported decoder with an OpenVINO int8
prefix graph (docs/export.md "Decoder rerankers"; the random Qwen3-0.6B shape is speed only) and
runs on a CPU with native bf16, as OpenVINO int8+bf16. Run from the repository root::

    python research/prefix_profile.py models/qwen3-0.6b-random-reranker

One query with 50 validation passages cut to 70 words. It prints the batches each path plans,
their real and padded tokens (the padded ratio bounds what reuse can gain), the run-only times
of both plans in alternating order (`ROUNDS` rounds; `rerank`'s tokenizing and planning are not
timed) and, with OpenVINO's PERF_COUNT, the time per operation type of one pass over each plan.
"""

from __future__ import annotations

import collections
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import openvino as ov

from onnxrank.engine.prefix import PREFIX_INPUT
from onnxrank.engine.reranker import Reranker, planned_feeds
from onnxrank.export.validate import load_validation_pairs

PASSAGES = 50
WORDS = 70
ROUNDS = 6
OPTIONS = {"backend": "openvino", "precision": "int8+bf16", "threads": 2}
Feeds = dict[str, np.ndarray]


def _seconds(feeds: list[Feeds], run: Callable[[Feeds], np.ndarray]) -> float:
    started = time.perf_counter()
    for feed in feeds:
        run(feed)
    return time.perf_counter() - started


def _tokens(feeds: list[Feeds]) -> tuple[int, int]:
    """Real and padded tokens of a plan, a prefix counted once per batch."""
    real = padded = 0
    for feed in feeds:
        prefix = feed[PREFIX_INPUT].shape[1] if PREFIX_INPUT in feed else 0
        real += int(feed["attention_mask"].sum()) + prefix
        padded += feed["input_ids"].size + prefix
    return real, padded


def _op_seconds(xml: str, feeds: list[Feeds]) -> collections.Counter[str]:
    compiled = ov.Core().compile_model(xml, "CPU", {
        "PERF_COUNT": True, "INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": 2})
    request = compiled.create_infer_request()
    names = [port.get_any_name() for port in compiled.inputs]
    for feed in feeds:  # warm up every shape
        request.infer({name: feed[name] for name in names if name in feed})
    seconds: collections.Counter[str] = collections.Counter()
    for feed in feeds:
        request.infer({name: feed[name] for name in names if name in feed})
        for info in request.profiling_info:
            seconds[info.node_type] += info.real_time.total_seconds()
    return seconds


def main() -> None:
    model = sys.argv[1]
    pairs = load_validation_pairs()
    query = pairs[0].query
    passages = [" ".join(pair.passage.split()[:WORDS]) for pair in pairs[:PASSAGES]]
    reuse = Reranker.from_dir(model, **OPTIONS)
    whole = Reranker.from_dir(model, prefix_reuse=False, **OPTIONS)
    assert reuse.uses_prefix_graph and not whole.uses_prefix_graph, "needs an ov_int8 prefix graph"
    plans = {"whole rows": (whole, planned_feeds(whole, [(query, text) for text in passages])),
             "prefix reuse": (reuse, planned_feeds(reuse, [(query, text) for text in passages]))}
    padded = {}
    for name, (_, feeds) in plans.items():
        real, padded[name] = _tokens(feeds)
        shapes = [tuple(feed["input_ids"].shape) for feed in feeds]
        print(f"{name}: batches {shapes}, tokens {real}, padded {padded[name]}")
    print(f"padded-token bound: {padded['whole rows'] / padded['prefix reuse']:.3f}x")

    times: dict[str, list[float]] = {name: [] for name in plans}
    for round_number in range(ROUNDS):
        order = list(plans) if round_number % 2 == 0 else list(reversed(plans))
        for name in order:
            engine, feeds = plans[name]
            times[name].append(_seconds(feeds, engine._run))
    ratios = [a / b for a, b in zip(times["whole rows"], times["prefix reuse"])]
    for name, seconds in times.items():
        print(f"{name}: run-only {statistics.median(seconds):.2f} s (median of {ROUNDS}; "
              f"{', '.join(f'{value:.2f}' for value in seconds)})")
    print(f"whole / reuse per round: {', '.join(f'{r:.2f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.3f}x")

    files = {"whole rows": "model_ov_int8.xml", "prefix reuse": "model_prefix_ov_int8.xml"}
    for name, (_, feeds) in plans.items():
        seconds = _op_seconds(f"{model}/{files[name]}", feeds)
        total = sum(seconds.values())
        top = ", ".join(f"{op} {value:.2f} s ({value / total:.0%})"
                        for op, value in seconds.most_common(5))
        print(f"{name}: OpenVINO op time {total:.2f} s ({total / padded[name] * 1e3:.2f} ms per "
              f"padded token): {top}")


if __name__ == "__main__":
    main()
