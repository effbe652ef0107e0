"""Measures OpenVINO int8 recipes (NNCF post-training quantization) on an exported fp32 graph.

A research script, not part of the package: it informed the ladder in
onnxrank.export.quantize_openvino.DEFAULT_OV_INT8_RECIPES (docs/export.md, "OpenVINO int8").
Run from the repository root on an exported model directory::

    python research/ov_int8_study.py --model-dir models/minilm-standin

For each recipe it quantizes ``model.onnx`` with ``nncf.quantize`` (calibrated on the shipped
calibration pairs, one unpadded row per item), runs the result with the OpenVINO runtime through
the engine's runtime layer, and compares its scores with onnxruntime fp32 ``model.onnx`` (which
matches PyTorch within the fp32 gate) on the tuning part of the validation pairs only: the held-out
part is never used for choices. No timing: fidelity only.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path
from typing import Any

from onnxrank.engine.runtime import open_model_file
from onnxrank.engine.spec import load_model_spec
from onnxrank.export.quantize_openvino import OvInt8Settings, quantize_openvino_int8
from onnxrank.export.tasks import export_task
from onnxrank.export.validate import (
    compare,
    encode_validation,
    load_calibration_pairs,
    load_validation_pairs,
    run_batches,
)

logger = logging.getLogger(__name__)

RECIPES = {
    "default": OvInt8Settings(),
    "alpha-0.5": OvInt8Settings(smooth_quant_alpha=0.5),
    "alpha-0.25": OvInt8Settings(smooth_quant_alpha=0.25),
    "smoothquant-off": OvInt8Settings(smooth_quant_alpha=-1.0),
    "ffn-up-fp32-top1": OvInt8Settings(fp32_ffn_up_layers=1),
    "ffn-up-fp32-top3": OvInt8Settings(fp32_ffn_up_layers=3),
    "ffn-up-fp32-all": OvInt8Settings(fp32_ffn_up_layers=12),
    "ffn-down-fp32-all": OvInt8Settings(fp32_ffn_down_layers=12),
    "ffn-fp32-all": OvInt8Settings(fp32_ffn_up_layers=12, fp32_ffn_down_layers=12),
    "ffn-fp32-top3": OvInt8Settings(fp32_ffn_up_layers=3, fp32_ffn_down_layers=3),
    "ffn-fp32-top1": OvInt8Settings(fp32_ffn_up_layers=1, fp32_ffn_down_layers=1),
    "attention-products-fp32": OvInt8Settings(fp32_attention_products=True),
    "head-fp32": OvInt8Settings(fp32_head=True),
    "head-ffn-top3-fp32": OvInt8Settings(fp32_head=True, fp32_ffn_up_layers=3,
                                         fp32_ffn_down_layers=3),
    "head-ffn-fp32": OvInt8Settings(fp32_head=True, fp32_ffn_up_layers=12,
                                    fp32_ffn_down_layers=12),
    "head-ffn-down-fp32": OvInt8Settings(fp32_head=True, fp32_ffn_down_layers=12),
    "head-ffn-up-fp32": OvInt8Settings(fp32_head=True, fp32_ffn_up_layers=12),
}


def study(model_dir: Path, recipes: list[str], items: int | None, part: str) -> list[dict[str, Any]]:
    """Tuning-part fidelity of each named recipe against onnxruntime fp32."""
    spec = load_model_spec(model_dir)
    tokenizer = model_dir / spec.tokenizer_file
    inputs = encode_validation(load_validation_pairs(part=part), tokenizer, task=export_task(spec.task),
                               max_length=spec.max_length, pad_id=spec.pad_token_id)
    fp32 = open_model_file(model_dir / "model.onnx", precision="fp32")
    reference = run_batches(inputs.batches(), fp32.run, len(inputs.rows))
    calibration = encode_validation(load_calibration_pairs(), tokenizer, task=export_task(spec.task),
                                    max_length=spec.max_length, pad_id=spec.pad_token_id)
    names = fp32.input_names
    rows = [{key: feeds[key] for key in names} for feeds in calibration.single_rows()][:items]
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in recipes:
            out = Path(scratch) / f"{name}.xml"
            quantize_openvino_int8(fp32_path=model_dir / "model.onnx", out_path=out,
                                   settings=RECIPES[name], calibration=rows,
                                   layers=int(spec.model_config.get("num_hidden_layers") or 12))
            runner = open_model_file(out, backend="openvino", precision="int8")
            outputs = run_batches(inputs.batches(), runner.run, len(inputs.rows))
            row = {"recipe": name, "items": len(rows), **compare(inputs, reference, outputs)}
            results.append(row)
            print(f"| {name} | {len(rows)} | {row['max_abs_diff']:.3f} | {row['spearman']:.4f} | "
                  f"{row['spearman_per_query_mean']:.4f} | {row['top10_overlap']:.3f} | "
                  f"{row['top10_overlap_min']:.2f} |", flush=True)
    return results


def main() -> None:
    """Command-line entry: prints a Markdown table row per recipe as it finishes."""
    parser = argparse.ArgumentParser(description="Compare OpenVINO int8 (NNCF) recipes on a model.")
    parser.add_argument("--model-dir", type=Path, required=True, help="exported model directory")
    parser.add_argument("--recipes", default=",".join(RECIPES),
                        help=f"comma-separated recipes from {', '.join(RECIPES)}")
    parser.add_argument("--calibration-items", type=int, default=None,
                        help="use the first N calibration rows; default all 320")
    parser.add_argument("--part", choices=("tuning", "held_out"), default="tuning",
                        help="validation part to score; choices use tuning only")
    args = parser.parse_args()
    print("| recipe | calibration rows | max abs Δ | Spearman | per-query Spearman | top-10 overlap "
          "| worst query top-10 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    study(args.model_dir, args.recipes.split(","), args.calibration_items, args.part)


if __name__ == "__main__":
    main()
