"""One ladder runner for every quantizer: try recipes in order until one meets the thresholds.

A quantizer's ladder is a list of Rungs (its recipes, bound to their quantize call); `run_ladder`
quantizes and validates each in turn, chooses on the tuning pairs only (a rung passes when its file
does, and so does every bf16 run of it this CPU can validate), records every attempt in
the kept variant's ``quantization.attempts`` (or in its failed_variants entry), and leaves the
final gate on both parts to the caller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxrank.engine.variants import RunAs
from onnxrank.export.context import BuiltVariant, ExportContext, VariantFailed
from onnxrank.export.gate import attempt_metrics, attempt_record, bf16_runs, tuning_failures, validate_file
from onnxrank.export.validate import batch_dependence

logger = logging.getLogger(__name__)

SKIPPED = "no operator of this graph was quantized"


@dataclass(frozen=True, slots=True)
class Rung:
    """One recipe of a quantizer's ladder.

    Attributes:
        recipe: The quantizer's settings (named in the log when the rung misses).
        quantize: Writes the variant's file and returns its ``quantization`` record; a record with
            ``quantized_nodes`` 0 means the recipe's operators are absent from the graph (the
            file is still fp32) and the rung is skipped.
        batch_dependent: The file's activation scales are computed per batch or per row at run
            time: measure how much a row's score depends on its batch mates on the kept file
            (``batch_1_vs_64_max_abs_diff``), which precision="auto" bounds.
    """

    recipe: Any
    quantize: Callable[[], dict[str, Any]]
    batch_dependent: bool


def run_ladder(context: ExportContext, variant: str, rungs: Sequence[Rung]) -> BuiltVariant:
    """Quantize and validate `rungs` in order until one meets the thresholds on the tuning pairs.

    The last rung tried is kept whether or not it passed: the caller's gate judges it on both
    parts.

    Raises:
        VariantFailed: The last rung quantized nothing (stage ``quantization``, with every
            attempt).
    """
    attempts: list[dict[str, Any]] = []
    metrics: dict[str, Any] = {}
    runner: Any = None
    outputs: dict[RunAs, np.ndarray] = {}
    for index, rung in enumerate(rungs):
        context.progress.step(f"{variant} recipe {index + 1} of {len(rungs)}")
        quantization = rung.quantize()
        if quantization.get("quantized_nodes") == 0:
            attempts.append({**quantization, "passed_on_tuning": False, "skipped": SKIPPED})
            continue
        metrics, runner, outputs = validate_file(context, variant)
        passed = not tuning_failures(context, variant, metrics)
        reduced: dict[str, Any] = {}
        if passed:
            # this CPU would run the file with bf16 for what stays float: that must pass too,
            # or precision="auto" refuses it and runs slower than an earlier-passing rung would
            for key, (run, record, run_outputs) in bf16_runs(context, variant).items():
                metrics[key] = reduced[key] = record
                if run_outputs is not None:
                    outputs[run] = run_outputs
            passed = not any(record.get("validated") and tuning_failures(context, key, record)
                             for key, record in reduced.items())
        attempts.append({**attempt_record(quantization, metrics, passed),
                         **{key: attempt_metrics(record) for key, record in reduced.items()}})
        if passed:
            break
        logger.info("%s recipe %s missed the thresholds on the tuning pairs", variant, rung.recipe)
    if "skipped" in attempts[-1]:
        raise VariantFailed("quantization", f"the last {variant} recipe quantized no operator of "
                            "this graph and every earlier one missed the thresholds on the "
                            "tuning pairs", attempts=attempts)
    if rung.batch_dependent:
        metrics.update(batch_dependence(runner.run, context.inputs))
    return BuiltVariant(metrics, quantization={**quantization, "attempts": attempts},
                        outputs=outputs)
