"""Where a decoder's OpenVINO batch spends its time, by type of operation.

A research script, not part of the package. It compiles an exported decoder's int8 IRs (the
whole-row `model_ov_int8.xml` and the prefix graph `model_prefix_ov_int8.xml`) with the engine's
compile settings (int8+bf16, 2 threads) and OpenVINO's per-node counters on, runs one batch of
random tokens on each (the prefix graph against a random cache), and prints each graph's wall
time and its nodes' time summed per node type (``Subgraph`` is the fused attention; the
weight layers are ``FullyConnected*``).

Run from the repository root on an exported decoder::

    python research/decoder_op_profile.py models/qwen3-0.6b-random-reranker 29 96 99

(ROWS, the rows' own TOKENS and the PREFIX length: 29 x 96 + 99 is the first batch the engine
plans for the bench's first short/50 request; the whole-row graph runs the same rows as
ROWS x (PREFIX + TOKENS) rounded up to 16.)
"""

from __future__ import annotations

import collections
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from onnxrank.engine.backends.openvino import compile_config, openvino_core
from onnxrank.engine.batching import round_up
from onnxrank.engine.prefix import CACHE_INPUT

ROUNDS = 3  # runs per graph after a warm-up; the median's counters are printed
SHOWN = 8  # node types printed per graph, slowest first


def profile(path: Path, feeds: dict[str, np.ndarray]) -> None:
    compiled = openvino_core().compile_model(
        str(path), "CPU", {**compile_config(2, "int8+bf16"), "PERF_COUNT": True})
    request = compiled.create_infer_request()
    request.infer(feeds)
    runs: list[tuple[float, Any]] = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        request.infer(feeds)
        runs.append((time.perf_counter() - start, request.get_profiling_info()))
    wall, counters = sorted(runs, key=lambda run: run[0])[ROUNDS // 2]
    totals: dict[str, float] = collections.defaultdict(float)
    for node in counters:
        totals[node.node_type] += node.real_time.total_seconds()
    shape = ", ".join(f"{name} {list(value.shape)}" for name, value in feeds.items())
    print(f"{path.name} ({shape}): wall {wall * 1e3:.0f} ms (median of {ROUNDS}), nodes "
          f"{math.fsum(totals.values()) * 1e3:.0f} ms")
    for node_type, seconds in sorted(totals.items(), key=lambda item: -item[1])[:SHOWN]:
        print(f"  {node_type:28s} {seconds * 1e3:7.0f} ms")


def main() -> None:
    model = Path(sys.argv[1])
    rows, tokens, prefix = (int(value) for value in sys.argv[2:5])
    rng = np.random.default_rng(0)
    declared = openvino_core().read_model(str(model / "model_prefix_ov_int8.xml"))
    layers, kv_heads, _, head_dim = (dim.get_length() if dim.is_static else 0
                                     for dim in declared.input(CACHE_INPUT).get_partial_shape())
    whole = round_up(prefix + tokens, 16)
    profile(model / "model_prefix_ov_int8.xml", {
        CACHE_INPUT: rng.standard_normal((layers, kv_heads, prefix, head_dim)).astype(np.float32),
        "input_ids": rng.integers(100, 10_000, (rows, tokens)),
        "attention_mask": np.ones((rows, tokens), dtype=np.int64)})
    profile(model / "model_ov_int8.xml", {
        "input_ids": rng.integers(100, 10_000, (rows, whole)),
        "attention_mask": np.ones((rows, whole), dtype=np.int64)})


if __name__ == "__main__":
    main()
