"""Measures OpenVINO int8 with and without outlier channels split off (docs/export.md, "OpenVINO int8").

A research script, not part of the package: it chose the ladder's rung 5 in
onnxrank.export.quantize_openvino.DEFAULT_OV_INT8_RECIPES. It quantizes ``model.onnx`` as the
export does (the classification head fp32), with ``--ratio`` the outlier channels of every quantized
weight MatMul split off into fp32 (onnxrank.export.outlier_split) and with ``--down-fp32`` every
feed-forward down-projection in fp32, or with ``--rung N`` as the ladder's rung N does, saves the IR
at ``--out``, and prints the fidelity on the tuning part (what the ladder chooses by) and the
held-out part (reported only) against onnxruntime fp32. Time the saved files with
research/int8_speed.py, or give ``--model-copy DIR`` for a copy of the model directory whose
``ov_int8`` variant is the new IR (manifest hashes, quantization record and fidelity rewritten, the
name suffixed ``-scratch``), which ``onnxrank bench --model DIR`` runs end to end. Run from the
repository root::

    python research/ov_outlier_split.py --model-dir models/minilm-standin --ratio 6 --down-fp32 \\
        --out /tmp/split-down.xml
    python research/ov_outlier_split.py --model-dir models/minilm-standin --rung 2 --out /tmp/rung2.xml
    python research/ov_outlier_split.py --model-dir models/minilm-standin --rung 1 --out /tmp/rung1.xml \\
        --model-copy /tmp/standin-rung1
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path
from typing import Any

from onnxrank.engine.runtime import open_model_file
from onnxrank.engine.spec import ModelSpec, load_model_spec, sha256_file, write_manifest
from onnxrank.export.quantize_openvino import (
    DEFAULT_OV_INT8_RECIPES,
    OvInt8Settings,
    quantize_openvino_int8,
    weights_path,
)
from onnxrank.export.tasks import export_task
from onnxrank.export.validate import (
    compare,
    encode_validation,
    load_calibration_pairs,
    load_validation_pairs,
    run_batches,
)


def main() -> None:
    """Command-line entry: writes the IR and prints one Markdown table row."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="exported model directory")
    parser.add_argument("--ratio", type=float, default=None,
                        help="split off channels whose max exceeds RATIO x the median channel's")
    parser.add_argument("--down-fp32", action="store_true",
                        help="keep every feed-forward down-projection in fp32")
    parser.add_argument("--rung", type=int, choices=range(1, len(DEFAULT_OV_INT8_RECIPES) + 1),
                        default=None, help="quantize as the ov_int8 ladder's rung N instead")
    parser.add_argument("--out", type=Path, required=True, help="IR to write (.xml)")
    parser.add_argument("--model-copy", type=Path, default=None,
                        help="also write a copy of --model-dir with this IR as its ov_int8 variant")
    args = parser.parse_args()
    spec = load_model_spec(args.model_dir)
    fp32_path = args.model_dir / "model.onnx"
    layers = int(spec.model_config.get("num_hidden_layers") or 12)
    if args.model_copy is not None and args.model_copy.exists():
        parser.error(f"--model-copy {args.model_copy} exists: give a new directory")
    if args.model_copy is not None and "ov_int8" not in spec.variants:
        parser.error(f"--model-copy: {args.model_dir} has no ov_int8 variant to replace")

    def encode(pairs: object) -> object:
        return encode_validation(pairs, args.model_dir / spec.tokenizer_file,
                                 task=export_task(spec.task), max_length=spec.max_length,
                                 pad_id=spec.pad_token_id)

    fp32 = open_model_file(fp32_path, precision="fp32")
    rows = [{key: feeds[key] for key in fp32.input_names}
            for feeds in encode(load_calibration_pairs()).single_rows()]
    if args.rung is not None and (args.ratio is not None or args.down_fp32):
        parser.error("--rung takes its rung's settings: not with --ratio or --down-fp32")
    settings = (DEFAULT_OV_INT8_RECIPES[args.rung - 1] if args.rung is not None else
                OvInt8Settings(fp32_head=True, fp32_ffn_down_layers=layers if args.down_fp32 else 0,
                               outlier_channel_ratio=args.ratio))
    record = quantize_openvino_int8(fp32_path=fp32_path, out_path=args.out, settings=settings,
                                    calibration=rows, layers=layers)
    inputs = encode(load_validation_pairs())
    reference = run_batches(inputs.batches(), fp32.run, len(inputs.rows))
    runner = open_model_file(args.out, backend="openvino", precision="int8")
    metrics = compare(inputs, reference, run_batches(inputs.batches(), runner.run, len(inputs.rows)))
    split, cls_rows = record["outlier_channels"], record["float_cls_row"]
    channels = "none" if split is None else (
        f"{len(split['channels_per_matmul'])} MatMuls, {sum(split['channels_per_matmul'].values())}")
    if cls_rows is not None:
        channels = f"position 0 float in {len(cls_rows['split'])} MatMuls"
    if args.model_copy is not None:
        copy_with_ov_int8(spec, args.model_dir, args.out, args.model_copy,
                          quantization=record, fidelity=metrics)
    held_out = metrics["held_out"]
    down = "fp32" if settings.fp32_ffn_down_layers else "int8"
    print(f"| {args.rung or args.ratio or 'off'} | {channels} | {down} | "
          f"{metrics['spearman_per_query_mean']:.4f} | {metrics['top10_overlap']:.3f} | "
          f"{held_out['spearman_per_query_mean']:.4f} | {held_out['top10_overlap']:.3f} |")


def copy_with_ov_int8(spec: ModelSpec, model_dir: Path, ir: Path, copy: Path, *,
                      quantization: dict[str, Any], fidelity: dict[str, Any]) -> None:
    """Copy `model_dir` to `copy` with `ir` (and its .bin) as the ``ov_int8`` variant's files."""
    shutil.copytree(model_dir, copy)
    old = spec.variants["ov_int8"]
    names = (old.file, *old.extra_files)
    shutil.copyfile(ir, copy / old.file)
    shutil.copyfile(weights_path(ir), copy / next(iter(old.extra_files)))
    variant = dataclasses.replace(
        old, sha256=sha256_file(copy / old.file),
        size_bytes=sum((copy / name).stat().st_size for name in names),
        extra_files={name: sha256_file(copy / name) for name in old.extra_files},
        quantization=quantization, fidelity=fidelity)
    write_manifest(dataclasses.replace(spec, name=f"{spec.name}-scratch",
                                       variants={**spec.variants, "ov_int8": variant}), copy)


if __name__ == "__main__":
    main()
