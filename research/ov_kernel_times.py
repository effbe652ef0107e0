"""Where one batch's time goes in an OpenVINO model, by layer type and kernel.

A research script, not part of the package. The file runs on OpenVINO CPU with
INFERENCE_PRECISION_HINT=HINT (2 threads, one stream, latency hint) at one ROWSxLENGTH shape, with
the plugin's per-layer counters on; it prints the mean milliseconds of each (layer type, kernel)
group, largest first, with the layers of the ``ov_int8`` ladder's Hadamard rotations
(onnxrank.export.hadamard_rotation) counted apart. Run from the repository root::

    python research/ov_kernel_times.py models/minilm-standin/model_ov_int8.xml bf16 50x96

Any IR or ONNX file with BERT-style inputs runs (sentence-transformers' static int8 IR included).
A profile is a measurement: run it alone.
"""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import openvino as ov

from onnxrank.export.hadamard_rotation import ROTATION_SUFFIX

RUNS = 10  # counted runs, after WARM_UP untimed ones
WARM_UP = 3


def kernel_times(path: str, hint: str, rows: int, length: int) -> tuple[Counter, Counter]:
    """Mean milliseconds and layer count per (layer type, kernel, "rotation" or "") group."""
    core = ov.Core()
    model = core.read_model(path)
    compiled = core.compile_model(model, "CPU", {
        "INFERENCE_PRECISION_HINT": hint, "PERF_COUNT": True, "INFERENCE_NUM_THREADS": 2,
        "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    ids = np.random.default_rng(0).integers(1000, 20000, (rows, length))
    ids[:, 0] = 101
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "token_type_ids": np.zeros_like(ids)}
    feeds = {port.get_any_name(): feeds[port.get_any_name()] for port in compiled.inputs}
    for _ in range(WARM_UP):
        request.infer(feeds)
    times: Counter = Counter()
    layers: Counter = Counter()
    for _ in range(RUNS):
        request.infer(feeds)
        for layer in request.profiling_info:
            if layer.status != layer.Status.EXECUTED:
                continue
            group = (layer.node_type, layer.exec_type,
                     "rotation" if ROTATION_SUFFIX in layer.node_name else "")
            times[group] += layer.real_time.total_seconds() * 1000 / RUNS
            layers[group] += 1
    return times, layers


def main(path: str, hint: str, shape: str) -> None:
    rows, length = (int(part) for part in shape.split("x"))
    times, layers = kernel_times(path, hint, rows, length)
    for group, ms in times.most_common():
        print(f"{ms:8.2f} ms  {layers[group] // RUNS:3d} layers  {' '.join(filter(None, group))}")
    print(f"{sum(times.values()):8.2f} ms  in all ({path}, {hint}, {rows}x{length})")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
