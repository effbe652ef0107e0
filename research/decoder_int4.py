"""Whether a decoder reranker's weights can be int4: NNCF's data-free weight compression of an
exported decoder's fp32 graph, scored against that graph on the validation pairs.

A research script, not part of the package: it explains why the export has no int4 variant
(docs/export.md, "The weight-compressed route"). Run from the repository root on a decoder
exported with its fp32 file (docs/export.md "Decoder rerankers"; the random Qwen3-0.6B shape
is speed and machinery only)::

    python research/decoder_int4.py --model-dir models/qwen3-0.6b-random-reranker

Each mode compresses ``model.onnx``'s weights (the score head kept in float, as the export keeps
it, and NNCF's default of int8 for the embedding table) and prints the export's gate metrics of
its scores against ``model.onnx``'s under onnxruntime, on the same planned batches: the rank
correlation over all pairs, its mean per query and the top-10 overlap, with the gate's floors.
``int8``, the export's own weight-only compression (the shipped ``ov_int8``), is the control.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import nncf
import numpy as np
import onnxruntime
import openvino
from nncf.quantization.advanced_parameters import (
    AdvancedCompressionParameters,
    GroupSizeFallbackMode,
)

from onnxrank.engine.execution import batch_feeds
from onnxrank.engine.reranker import Reranker, planned_batches
from onnxrank.export.fidelity import FidelityThresholds, score_metrics
from onnxrank.export.quantize_openvino import compress_int8_weights
from onnxrank.export.validate import load_validation_pairs

# int4 mode -> its group size (inputs per scale); "int8" is the export's own compression
INT4_GROUPS = {"int4-g128": 128, "int4-g32": 32}
MODES = ("int8", *INT4_GROUPS)


def compressed(model_dir: Path, mode: str) -> openvino.Model:
    """model.onnx with its weights compressed as `mode` says, the score head left in float."""
    manifest = json.loads((model_dir / "manifest.json").read_text(encoding="utf-8"))
    kept = manifest["variants"]["ov_int8"]["quantization"]["ops_kept_fp32"]
    model = openvino.Core().read_model(model_dir / "model.onnx")
    if mode == "int8":
        return compress_int8_weights(model, kept)
    advanced = AdvancedCompressionParameters(group_size_fallback_mode=GroupSizeFallbackMode.ADJUST)
    return nncf.compress_weights(
        model, mode=nncf.CompressWeightsMode.INT4_ASYM, group_size=INT4_GROUPS[mode], ratio=1.0,
        ignored_scope=nncf.IgnoredScope(names=kept, validate=False),
        advanced_parameters=advanced)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--modes", default="int8,int4-g128,int4-g32",
                        help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--pairs", type=int, default=48, help="about this many validation pairs")
    parser.add_argument("--hint", default="f32", choices=("f32", "bf16"),
                        help="OpenVINO's inference precision hint")
    args = parser.parse_args()
    modes = [name.strip() for name in args.modes.split(",") if name.strip()]
    unknown = [mode for mode in modes if mode not in MODES]
    if unknown or not modes:
        parser.error(f"--modes: {', '.join(unknown) or 'nothing'}; choose from {', '.join(MODES)}")

    pairs = load_validation_pairs(args.pairs)
    engine = Reranker.from_dir(args.model_dir, backend="onnxruntime", precision="fp32",
                               prefix_reuse=False)
    plan = planned_batches(engine, [(pair.query, pair.passage) for pair in pairs])
    feeds = [batch_feeds(plan, batch) for batch in plan.batches]
    groups = [pairs[int(row)].query for batch in plan.batches for row in batch.rows]

    session = onnxruntime.InferenceSession(str(args.model_dir / "model.onnx"),
                                           providers=["CPUExecutionProvider"])
    names = [node.name for node in session.get_inputs()]
    reference = np.concatenate([session.run(None, {name: feed[name] for name in names})[0]
                                .reshape(-1) for feed in feeds])
    floors = FidelityThresholds()
    print(f"{len(reference)} pairs, {len(set(groups))} queries; gate floors: Spearman "
          f">= {floors.int8_min_spearman}, per query >= {floors.int8_min_spearman_per_query}, "
          f"top-10 >= {floors.int8_min_top10_overlap}")
    for mode in modes:
        started = time.perf_counter()
        model = compressed(args.model_dir, mode)
        compress_seconds = time.perf_counter() - started
        compiled = openvino.Core().compile_model(model, "CPU", {
            "INFERENCE_PRECISION_HINT": args.hint, "PERFORMANCE_HINT": "LATENCY"})
        inputs = [port.get_any_name() for port in compiled.inputs]
        started = time.perf_counter()
        scores = np.concatenate([compiled({name: feed[name] for name in inputs if name in feed})[0]
                                 .reshape(-1) for feed in feeds])
        metrics = score_metrics(reference, scores, groups)
        print(f"{mode} ({args.hint}): Spearman {metrics['spearman']:.4f}, per query "
              f"{metrics['spearman_per_query_mean']:.4f}, top-10 {metrics['top10_overlap']:.3f}, "
              f"max |diff| {metrics['max_abs_diff']:.3f} (reference std {reference.std():.3f}); "
              f"compressed in {compress_seconds:.0f} s, scored in "
              f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
