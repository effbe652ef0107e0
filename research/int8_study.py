"""Measures the int8 options on an exported model: dynamic vs static QDQ, per-tensor vs per-channel.

A research script, not part of the package: it informed the ladder in
onnxrank.export.quantize.DEFAULT_INT8_RECIPES (docs/export.md, "Choosing the int8 recipe"). Run
from the repository root::

    python research/int8_study.py --model-dir models/minilm-standin

Defaults: the tuning part of the validation pairs (the held-out part is never used for choices),
1 onnxruntime thread, best of 2 timed runs per recipe. For each recipe it quantizes the model's
fp32 (or fused) graph, scores the pairs, and reports fidelity against the fp32 ONNX scores (which
match PyTorch within the fp32 threshold, see the manifest) and scoring speed (length-sorted batches
of 16). Sessions are opened through the engine's runtime layer (onnxrank.engine.runtime), so the
numbers are those of what the engine runs. Static recipes are calibrated on the shipped
calibration pairs, which share nothing with the validation pairs.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from onnxrank.engine.runtime import open_model_file
from onnxrank.engine.spec import load_model_spec
from onnxrank.export.quantize import Int8Settings, head_projections, quantize_int8
from onnxrank.export.tasks import export_task
from onnxrank.export.validate import (
    ValidationInputs,
    batch_dependence,
    compare,
    encode_validation,
    load_calibration_pairs,
    load_validation_pairs,
    run_batches,
)

logger = logging.getLogger(__name__)

ATTENTION_AND_EMBEDDINGS = ("Attention", "EmbedLayerNormalization")
RECIPES = (
    ("per-row, MatMulNBits 8-bit, block 32, head fp32 (unfused)", Int8Settings("per_row"), False),
    ("per-row, MatMulNBits 8-bit, block 128, head fp32 (unfused)",
     Int8Settings("per_row", block_size=128), False),
    ("dynamic, per-tensor, all ops (fused)", Int8Settings("dynamic", per_channel=False), True),
    ("dynamic, per-channel, all ops (fused)", Int8Settings("dynamic", per_channel=True), True),
    ("dynamic, per-tensor, all ops (unfused)", Int8Settings("dynamic", per_channel=False), False),
    ("dynamic, per-channel, all ops (unfused)", Int8Settings("dynamic", per_channel=True), False),
    ("dynamic, per-channel, reduce_range (fused)",
     Int8Settings("dynamic", per_channel=True, reduce_range=True), True),
    ("dynamic, per-channel, FFN up-projection fp32 in the top 3 layers (fused)",
     Int8Settings("dynamic", per_channel=True, fp32_ffn_up_layers=3), True),
    ("dynamic, per-channel, FFN up-projection fp32 in every layer (fused)",
     Int8Settings("dynamic", per_channel=True, fp32_ffn_up_layers=12), True),
    ("dynamic, per-channel, MatMul only (fused)",
     Int8Settings("dynamic", per_channel=True, op_types=("MatMul",)), True),
    ("dynamic, per-channel, Attention + EmbedLayerNormalization (fused)",
     Int8Settings("dynamic", per_channel=True, op_types=ATTENTION_AND_EMBEDDINGS), True),
    ("dynamic, per-tensor, Attention + EmbedLayerNormalization (fused)",
     Int8Settings("dynamic", per_channel=False, op_types=ATTENTION_AND_EMBEDDINGS), True),
    ("static QDQ, per-tensor", Int8Settings("static", per_channel=False), False),
    ("static QDQ, per-channel", Int8Settings("static", per_channel=True), False),
    ("static QDQ, per-channel, MatMul only",
     Int8Settings("static", per_channel=True, op_types=("MatMul",)), False),
)
PRECISION_OF_FILE = {"model.onnx": "fp32", "model_opt.onnx": "opt"}


def _timed_outputs(path: Path, inputs: ValidationInputs, threads: int, repeats: int,
                   precision: str) -> tuple[np.ndarray, float, Any]:
    runner = open_model_file(path, backend="onnxruntime", precision=precision, threads=threads)
    batches = inputs.batches()
    best = float("inf")
    outputs = np.zeros(0)
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = run_batches(batches, runner.run, len(inputs.rows))
        best = min(best, time.perf_counter() - start)
    return outputs, len(inputs.rows) / best, runner


def study(model_dir: Path, *, threads: int, repeats: int, limit: int | None,
          part: str | None) -> list[dict[str, Any]]:
    """Fidelity and speed of every recipe in RECIPES (plus fp32 and opt for scale)."""
    spec = load_model_spec(model_dir)
    tokenizer = model_dir / spec.tokenizer_file
    inputs = encode_validation(load_validation_pairs(limit, part=part), tokenizer,
                               task=export_task(spec.task),
                               max_length=spec.max_length, pad_id=spec.pad_token_id)
    reference, fp32_speed, _ = _timed_outputs(model_dir / "model.onnx", inputs, threads, repeats,
                                              "fp32")
    results = [{"recipe": "fp32 (reference)",
                "size_mb": (model_dir / "model.onnx").stat().st_size / 1e6,
                "pairs_per_s": fp32_speed, **compare(inputs, reference, reference)}]
    opt_outputs, opt_speed, _ = _timed_outputs(model_dir / "model_opt.onnx", inputs, threads,
                                               repeats, "opt")
    results.append({"recipe": "opt (fp32 fused)",
                    "size_mb": (model_dir / "model_opt.onnx").stat().st_size / 1e6,
                    "pairs_per_s": opt_speed, **compare(inputs, reference, opt_outputs)})
    calibration_inputs = encode_validation(load_calibration_pairs(), tokenizer, task=export_task(spec.task),
                                           max_length=spec.max_length, pad_id=spec.pad_token_id)
    calibration = calibration_inputs.padded_batches()
    with tempfile.TemporaryDirectory() as scratch:
        for index, (label, settings, fused) in enumerate(RECIPES):
            out = Path(scratch) / f"int8_{index}.onnx"
            quantize_int8(fp32_path=model_dir / "model.onnx",
                          opt_path=model_dir / "model_opt.onnx" if fused else None,
                          out_path=out, settings=settings, calibration=calibration,
                          keep_fp32=dict.fromkeys(head_projections(model_dir / "model.onnx"), "head")
                          if settings.method == "per_row" else None)
            outputs, speed, runner = _timed_outputs(out, inputs, threads, repeats, "int8")
            row = {"recipe": label, "size_mb": out.stat().st_size / 1e6, "pairs_per_s": speed,
                   **compare(inputs, reference, outputs)}
            if settings.method == "dynamic":
                row.update(batch_dependence(runner.run, inputs))
            results.append(row)
            logger.info("%s: %s", label, row)
    return results


def main() -> None:
    """Command-line entry: prints a Markdown table."""
    parser = argparse.ArgumentParser(description="Compare int8 quantization recipes on a model.")
    parser.add_argument("--model-dir", type=Path, required=True, help="exported model directory")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per recipe (best kept)")
    parser.add_argument("--validation-pairs", type=int, default=None,
                        help="about N pairs (whole query groups); default: all of --part")
    parser.add_argument("--part", choices=("tuning", "held_out", "all"), default="tuning",
                        help="which part of the validation pairs; choices use tuning only")
    args = parser.parse_args()
    rows = study(args.model_dir, threads=args.threads, repeats=args.repeats,
                 limit=args.validation_pairs, part=None if args.part == "all" else args.part)
    print(f"pairs: {rows[0]['pairs']} ({rows[0]['part']} part), threads {args.threads}, "
          f"best of {args.repeats}")
    print("| recipe | size MB | pairs/s | max abs Δ | Pearson | Spearman | top-10 overlap | "
          "batch 1 vs 64 max abs Δ |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        batch = row.get("batch_1_vs_64_max_abs_diff")
        print(f"| {row['recipe']} | {row['size_mb']:.1f} | {row['pairs_per_s']:.1f} | "
              f"{row['max_abs_diff']:.4f} | {row['pearson']:.4f} | {row['spearman']:.4f} | "
              f"{row['top10_overlap']:.3f} | {'' if batch is None else f'{batch:.4f}'} |")


if __name__ == "__main__":
    main()
