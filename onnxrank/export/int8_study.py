"""Measures the int8 options on an exported model: dynamic vs static QDQ, per-tensor vs per-channel.

The numbers in docs/export.md ("Choosing the int8 recipe") come from::

    python -m onnxrank.export.int8_study --model-dir models/minilm-standin --threads 1

For each recipe it quantizes the model's fp32 (or fused) graph, scores all validation pairs, and
reports fidelity against the fp32 ONNX scores (which match PyTorch within the fp32 threshold,
see the manifest) and scoring speed (length-sorted batches of 16, best of `--repeats` runs).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from onnxrank.engine.session import CPU_PROVIDER, session_options
from onnxrank.engine.spec import load_model_spec
from onnxrank.export.quantize import Int8Settings, quantize_int8
from onnxrank.export.validate import (
    ValidationInputs,
    batch_dependence,
    compare,
    encode_validation,
    load_validation_pairs,
    run_batches,
    session_runner,
)

logger = logging.getLogger(__name__)

ATTENTION_AND_EMBEDDINGS = ("Attention", "EmbedLayerNormalization")
RECIPES = (
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


def _timed_outputs(path: Path, inputs: ValidationInputs, threads: int, repeats: int
                   ) -> tuple[np.ndarray, float, ort.InferenceSession]:
    session = ort.InferenceSession(str(path), sess_options=session_options(threads),
                                   providers=[CPU_PROVIDER])
    run = session_runner(session)
    batches = inputs.batches()
    best = float("inf")
    outputs = np.zeros(0)
    for _ in range(repeats):
        start = time.perf_counter()
        outputs = run_batches(batches, run, len(inputs.rows))
        best = min(best, time.perf_counter() - start)
    return outputs, len(inputs.rows) / best, session


def study(model_dir: Path, *, threads: int, repeats: int, limit: int | None) -> list[dict[str, Any]]:
    """Fidelity and speed of every recipe in RECIPES (plus fp32 and opt for scale)."""
    spec = load_model_spec(model_dir)
    names = ("input_ids", "attention_mask", "token_type_ids")
    inputs = encode_validation(load_validation_pairs(limit), model_dir / spec.tokenizer_file,
                               task=spec.task, max_length=spec.max_length,
                               pad_id=spec.pad_token_id, input_names=names)
    reference, fp32_speed, _ = _timed_outputs(model_dir / "model.onnx", inputs, threads, repeats)
    results = [{"recipe": "fp32 (reference)", "size_mb": (model_dir / "model.onnx").stat().st_size / 1e6,
                "pairs_per_s": fp32_speed, **compare(inputs, reference, reference)}]
    opt_outputs, opt_speed, _ = _timed_outputs(model_dir / "model_opt.onnx", inputs, threads, repeats)
    results.append({"recipe": "opt (fp32 fused)",
                    "size_mb": (model_dir / "model_opt.onnx").stat().st_size / 1e6,
                    "pairs_per_s": opt_speed, **compare(inputs, reference, opt_outputs)})
    calibration = [feeds for _, feeds in inputs.batches()]
    with tempfile.TemporaryDirectory() as scratch:
        for index, (label, settings, fused) in enumerate(RECIPES):
            out = Path(scratch) / f"int8_{index}.onnx"
            quantize_int8(fp32_path=model_dir / "model.onnx",
                          opt_path=model_dir / "model_opt.onnx" if fused else None,
                          out_path=out, settings=settings, calibration=calibration)
            outputs, speed, session = _timed_outputs(out, inputs, threads, repeats)
            row = {"recipe": label, "size_mb": out.stat().st_size / 1e6, "pairs_per_s": speed,
                   **compare(inputs, reference, outputs)}
            if settings.method == "dynamic":
                row.update(batch_dependence(session, inputs))
            results.append(row)
            logger.info("%s: %s", label, row)
    return results


def main() -> None:
    """Command-line entry: prints a Markdown table."""
    parser = argparse.ArgumentParser(description="Compare int8 quantization recipes on a model.")
    parser.add_argument("--model-dir", type=Path, required=True, help="exported model directory")
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per recipe (best kept)")
    parser.add_argument("--validation-pairs", type=int, default=None, help="subset size")
    args = parser.parse_args()
    rows = study(args.model_dir, threads=args.threads, repeats=args.repeats,
                 limit=args.validation_pairs)
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
