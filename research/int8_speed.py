"""Times model files interleaved on the same batches: the int8 table of docs/export.md.

A research script, not part of the package. Each round runs every candidate once per shape
(16 pairs x 60 and x 200 random tokens, BERT-style inputs), after two untimed runs each; it prints
each candidate's median and its speed relative to the first. Run from the repository root::

    python research/int8_speed.py 15 \\
        ovint8bf16,ov,models/minilm-standin/model_ov_int8.xml,bf16 \\
        ovbf16,ov,models/minilm-standin/model.onnx,bf16 \\
        ort_int8,ort,models/minilm-standin/model_int8.onnx

A candidate is ``label,ort,FILE`` (onnxruntime, every graph optimisation, 2 threads) or
``label,ov,FILE,HINT`` (OpenVINO CPU, INFERENCE_PRECISION_HINT=HINT, 2 threads, latency hint).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np

Feeds = dict[str, np.ndarray]
SHAPES = {"16x60": (16, 60), "16x200": (16, 200)}


def feeds(rows: int, length: int, rng: np.random.Generator) -> Feeds:
    ids = rng.integers(1000, 20000, (rows, length))
    ids[:, 0], ids[:, -1] = 101, 102
    return {"input_ids": ids.astype(np.int64),
            "attention_mask": np.ones((rows, length), np.int64),
            "token_type_ids": np.zeros((rows, length), np.int64)}


def onnxruntime_runner(path: str) -> Callable[[Feeds], object]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = {node.name for node in session.get_inputs()}
    return lambda batch: session.run(None, {k: v for k, v in batch.items() if k in names})


def openvino_runner(path: str, hint: str) -> Callable[[Feeds], object]:
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(path), "CPU", {
        "INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": "2",
        "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    names = {name for port in compiled.inputs for name in port.get_names()}
    return lambda batch: request.infer({k: v for k, v in batch.items() if k in names})


def main() -> None:
    rounds, specs = int(sys.argv[1]), sys.argv[2:]
    rng = np.random.default_rng(0)
    batches = {label: feeds(*shape, rng) for label, shape in SHAPES.items()}
    runners = {}
    for spec in specs:
        label, kind, path, *hint = spec.split(",")
        runners[label] = onnxruntime_runner(path) if kind == "ort" else openvino_runner(path, hint[0])
    for run in runners.values():
        for batch in batches.values():
            run(batch), run(batch)
    times: dict[tuple[str, str], list[float]] = {(label, shape): [] for label in runners for shape in batches}
    for _ in range(rounds):
        for shape, batch in batches.items():
            for label, run in runners.items():
                start = time.perf_counter()
                run(batch)
                times[(label, shape)].append(time.perf_counter() - start)
    first = specs[0].split(",")[0]
    for shape in batches:
        base = float(np.median(times[(first, shape)]))
        for label in runners:
            median = float(np.median(times[(label, shape)]))
            print(f"{shape:7s} {label:14s} {median * 1000:8.1f} ms  speed vs {first}: "
                  f"{base / median:5.2f}x")


if __name__ == "__main__":
    main()
