"""OpenVINO's int8 and bf16 kernels on the same layers of one model: is int8 the faster arithmetic?

A research script, not part of the package. Both files run on OpenVINO CPU with
INFERENCE_PRECISION_HINT=bf16 (2 threads, one stream, latency hint) at each ROWSxLENGTH shape, with
the plugin's per-layer counters on; for every weight product the int8 file runs as an int8 kernel,
it prints the time of that layer against the same layer of the float file (the pruned last layer's
products and ``cls_row`` halves stay float in both and are left out). Run from the repository root::

    python research/ov_int8_layers.py models/minilm-standin/model.onnx \\
        models/minilm-standin/model_ov_int8.xml 50x96 16x256 8x512

The counters' kernel names (``brgemm_avx512_amx_I8``, ``brgemm_avx512_amx_bf16``, ...) say which
instructions ran. A profile is a measurement: run it alone.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import numpy as np
import openvino as ov

RUNS = 10  # counted runs per shape, after WARM_UP untimed ones
WARM_UP = 3


def layer_times(core: ov.Core, path: str, rows: int, length: int) -> dict[str, tuple[str, float]]:
    """Mean milliseconds and kernel of every FullyConnected layer, by node name."""
    model = core.read_model(path)
    model.reshape({port.get_any_name(): [rows, length] for port in model.inputs})
    compiled = core.compile_model(model, "CPU", {
        "INFERENCE_PRECISION_HINT": "bf16", "PERF_COUNT": True, "INFERENCE_NUM_THREADS": 2,
        "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 20000, (rows, length))
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "token_type_ids": np.zeros_like(ids)}
    feeds = {port.get_any_name(): feeds[port.get_any_name()] for port in model.inputs}
    for _ in range(WARM_UP):
        request.infer(feeds)
    total: dict[str, float] = defaultdict(float)
    kernel: dict[str, str] = {}
    for _ in range(RUNS):
        request.infer(feeds)
        for layer in request.profiling_info:
            if layer.node_type == "FullyConnected":
                total[layer.node_name] += layer.real_time.total_seconds() * 1000 / RUNS
                kernel[layer.node_name] = layer.exec_type
    return {name: (kernel[name], total[name]) for name in total}


def float_twin(name: str, floats: dict[str, tuple[str, float]]) -> tuple[str, float] | None:
    """The float file's layer for an int8 file's product: NNCF's graph names it by its MatMul,
    the float graph's fused layer keeps the name of the bias Add after it."""
    return floats.get(name) or floats.get(name.replace("/MatMul", "/Add"))


def main(float_path: str, int8_path: str, shapes: list[str]) -> None:
    core = ov.Core()
    for shape in shapes:
        rows, length = (int(part) for part in shape.split("x"))
        floats = layer_times(core, float_path, rows, length)
        int8s = layer_times(core, int8_path, rows, length)
        matched = []  # (float layer, int8 layer) timings of each product run as int8
        for name, timing in int8s.items():
            twin = float_twin(name, floats)
            if timing[0].endswith("I8") and twin is not None:
                matched.append((twin, timing))
        float_ms = sum(twin[1] for twin, _ in matched)
        int8_ms = sum(timing[1] for _, timing in matched)
        kernels = sorted({timing[0] for pair in matched for timing in pair})
        print(f"{shape}: {len(matched)} layers int8 in {int8_path}; the same layers: "
              f"float file {float_ms:.2f} ms, int8 file {int8_ms:.2f} ms, "
              f"int8 / float time {int8_ms / float_ms:.2f} ({', '.join(kernels)})")


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
