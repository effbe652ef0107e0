"""One ladder runner for every quantizer: try recipes in order until one meets the thresholds.

A quantizer's ladder is a list of Rungs (its recipes, bound to their quantize call); `run_ladder`
quantizes and validates each in turn, chooses on the tuning pairs only (a rung passes when its file
does, and so does every bf16 run of it this CPU can validate; when none does, the first rung
whose file passed is kept), records every attempt in
the kept variant's ``quantization.attempts`` (or in its failed_variants entry), and leaves the
final gate on both parts to the caller.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnxrank.engine.variants import VARIANTS, RunAs
from onnxrank.export.context import BuiltVariant, ExportContext, VariantFailed
from onnxrank.export.gate import (
    attempt_metrics,
    attempt_record,
    bf16_runs,
    open_variant,
    tuning_failures,
    validate_file,
)
from onnxrank.export.validate import batch_dependence

logger = logging.getLogger(__name__)

SKIPPED = "no operator of this graph was quantized"
# why a ladder kept an earlier rung than its last (quantization.kept_because)
KEPT_WITHOUT_BF16 = ("no rung passed with its bf16 runs: the first whose file passed is kept, and "
                     "its failed bf16 record keeps precision='auto' from running it with bf16")
# the suffix of a set-aside rung's files while later rungs are tried
ASIDE_SUFFIX = ".set-aside"


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


@dataclass(slots=True)
class _SetAside:
    """A rung whose file passed the gate while a bf16 run of it did not, kept aside while later
    rungs overwrite the variant's files."""

    index: int
    quantization: dict[str, Any]
    metrics: dict[str, Any]
    outputs: dict[RunAs, np.ndarray]
    files: dict[Path, Path]  # the variant's file (and the files beside it) -> where they wait

    def restore(self) -> None:
        for path, aside in self.files.items():
            os.replace(aside, path)

    def discard(self) -> None:
        for aside in self.files.values():
            aside.unlink(missing_ok=True)


def _set_aside(context: ExportContext, variant: str, index: int, quantization: dict[str, Any],
               metrics: dict[str, Any], outputs: dict[RunAs, np.ndarray]) -> _SetAside:
    path = context.paths[variant]
    names = (path.name, *VARIANTS[variant].extra_files)
    files = {path.parent / name: path.parent / f"{name}{ASIDE_SUFFIX}" for name in names}
    for source, aside in files.items():
        os.replace(source, aside)
    return _SetAside(index, quantization, dict(metrics), dict(outputs), files)


def run_ladder(context: ExportContext, variant: str, rungs: Sequence[Rung]) -> BuiltVariant:
    """Quantize and validate `rungs` in order until one meets the thresholds on the tuning pairs,
    its bf16 runs included.

    When none does, the first rung whose file passed while a bf16 run of it missed is kept (its
    failed bf16 record keeps ``precision="auto"`` from running it that way; it still runs at
    its own precision); when no file passed, the last rung tried. The caller's gate judges the
    kept rung on both parts.

    Raises:
        VariantFailed: The last rung quantized nothing (stage ``quantization``, with every
            attempt).
    """
    attempts: list[dict[str, Any]] = []
    metrics: dict[str, Any] = {}
    outputs: dict[RunAs, np.ndarray] = {}
    aside: _SetAside | None = None
    passed = False
    try:
        for index, rung in enumerate(rungs):
            context.progress.step(f"{variant} recipe {index + 1} of {len(rungs)}")
            quantization = rung.quantize()
            if quantization.get("quantized_nodes") == 0:
                attempts.append({**quantization, "passed_on_tuning": False, "skipped": SKIPPED})
                continue
            metrics, outputs = validate_file(context, variant)
            file_passed = passed = not tuning_failures(context, variant, metrics)
            reduced: dict[str, Any] = {}
            if file_passed:
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
            logger.info("%s recipe %s missed the thresholds on the tuning pairs", variant,
                        rung.recipe)
            if file_passed and aside is None and index + 1 < len(rungs):
                aside = _set_aside(context, variant, index, quantization, metrics, outputs)
        if not passed and aside is not None:
            aside.restore()
            quantization, metrics, outputs = aside.quantization, aside.metrics, aside.outputs
            rung = rungs[aside.index]
            quantization = {**quantization, "kept_attempt": aside.index + 1,
                            "kept_because": KEPT_WITHOUT_BF16}
            aside = None
        elif "skipped" in attempts[-1]:
            raise VariantFailed("quantization", f"the last {variant} recipe quantized no "
                                "operator of this graph and every earlier one missed the "
                                "thresholds on the tuning pairs", attempts=attempts)
    finally:
        if aside is not None:
            aside.discard()
    if rung.batch_dependent:
        metrics.update(batch_dependence(open_variant(context, variant).run, context.inputs))
    return BuiltVariant(metrics, quantization={**quantization, "attempts": attempts},
                        outputs=outputs)
