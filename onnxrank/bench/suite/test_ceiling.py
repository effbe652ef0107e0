"""The ceiling: this machine's fastest int8, bf16 and fp32 GEMMs on the model's own shapes.

Every GEMM path of onnxrank.bench.ceiling (onnxruntime MatMul, MatMulInteger and
DynamicQuantizeMatMul; OpenVINO f32, bf16 and int8) runs on every shape of one batch of 8 pairs of
100 tokens through the model (feed-forward up and down, the square projections, attention's two
batched products), interleaved like any scenario. A precision's ceiling is its fastest path on
the weight GEMMs (feed-forward and projections); every later scenario reports each contender's
effective model ops/s as a share of the ceiling of its precision. This file runs first in every
session (conftest.py). Paths that cannot run here (openvino not installed, no BF16, OpenVINO not
compiling an int8 GEMM) are skipped with the reason. Budgets (budgets.toml): scenario "ceiling"
(none shipped).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from onnxrank.bench.ceiling import CPU_ONLY_CEILING, GEMM_PATHS, ceilings, model_shapes, repeats_for
from onnxrank.bench.harness import Contender, ScenarioResult, measure_interleaved, time_stats
from onnxrank.bench.suite.bench_run import BenchRun
from onnxrank.errors import DeviceUnavailableError, MissingDependencyError
from onnxrank.types import Device

SCENARIO = "ceiling"
REGIME = "gemm"


def test_ceiling(benchmark: Any, bench: BenchRun, device: str) -> None:
    if device != Device.CPU.value:
        bench.skip_scenario(SCENARIO, REGIME, device, CPU_ONLY_CEILING)
    flops = bench.model_flops
    if isinstance(flops, str):
        bench.ceiling_note = flops
        bench.skip_scenario(SCENARIO, REGIME, device, flops)
    shapes = model_shapes(flops)
    contenders: list[Contender[int]] = []
    skipped: dict[str, str] = {}
    for path in GEMM_PATHS:
        for shape in shapes:
            if path.shapes is not None and shape.name not in path.shapes:
                continue
            name = f"{path.name}:{shape.name}"
            try:
                kernel = path.build(shape, bench.threads)
            except MissingDependencyError as err:
                skipped[path.name] = f"skipped: {err}"
                break  # the whole path: its runtime is not installed
            except (DeviceUnavailableError, RuntimeError, ValueError) as err:
                # RuntimeError: what onnxruntime and OpenVINO raise for a kernel they refuse
                skipped[name] = f"skipped: {err}"
                continue
            repeats = repeats_for(kernel, bench.sizes.ceiling_sample_seconds)
            contenders.append(Contender(
                name=name, label=f"{path.label}, {shape.name} {shape.describe()}",
                run=_loop(kernel.run, repeats),
                settings={**kernel.settings, "path": path.name, "precision": path.precision,
                          "shape": shape.name, "dims": shape.describe(), "ops": shape.ops,
                          "products_per_sample": repeats},
            ))
    if not contenders:
        bench.ceiling_note = "no GEMM path could run: " + "; ".join(skipped.values())
        bench.skip_scenario(SCENARIO, REGIME, device, bench.ceiling_note)
    samples = list(range(bench.sizes.ceiling_samples))
    timings = measure_interleaved(benchmark, contenders, samples, [1] * len(samples))
    measured = {}
    for contender in contenders:
        settings = contender.settings
        stats = time_stats(timings.seconds[contender.name],
                           [settings["products_per_sample"]] * len(samples))
        # The median sample: one slow sample (another process took a core) does not lower it.
        stats["ops_per_s"] = (settings["ops"] * settings["products_per_sample"]
                              / (stats["p50_ms"] / 1000.0))
        measured[contender.name] = {"label": contender.label, "settings": settings,
                                    "stats": stats}
    bench.ceilings = ceilings(measured)
    bench.record(benchmark, ScenarioResult(
        scenario=SCENARIO, regime=REGIME, device=device, contenders=measured, skipped=skipped,
        workload={"shapes": [dataclasses.asdict(shape) for shape in shapes],
                  "samples": len(samples), "sample_seconds": bench.sizes.ceiling_sample_seconds},
    ))


def _loop(run: Callable[[], object], repeats: int) -> Callable[[int], None]:
    """One timed sample: `repeats` products back to back (a sample of about 20 ms)."""
    def sample(_: int) -> None:
        for _ in range(repeats):
            run()
    return sample
