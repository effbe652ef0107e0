"""Where OpenVINO's CPU dynamic quantization makes a row's score depend on its batch.

A research script, not part of the package: it explains why the weight-compressed IR with the CPU
plugin's dynamic quantization (activations quantized per token at run time) is not an `ov_int8`
rung (docs/export.md, "Per-row int8"). Run from the repository root on an exported model::

    python research/ov_dynamic_quantization.py --model-dir models/minilm-standin-r4

It compresses ``model.onnx``'s weights with NNCF (INT8_ASYM, the head kept fp32, as the
weight-only families do), then prints one row's score at growing padded lengths and batch sizes
with dynamic quantization off (group size 0) and on (group size 32), and the largest difference
between 64 rows scored together (padded to the longest) and each alone at its own length.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np
import openvino
from tokenizers import Encoding, Tokenizer

from onnxrank.engine.spec import load_model_spec
from onnxrank.export.quantize import head_projections
from onnxrank.export.quantize_openvino import compress_openvino_int8_weights


def feeds(rows: list[Encoding], length: int, names: list[str]) -> dict[str, np.ndarray]:
    """Right-padded inputs of `rows` at `length` positions."""
    ids = np.zeros((len(rows), length), np.int64)
    mask, types = np.zeros_like(ids), np.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, :len(row.ids)], mask[i, :len(row.ids)] = row.ids, 1
        types[i, :len(row.ids)] = row.type_ids
    all_feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    return {name: all_feeds[name] for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    args = parser.parse_args()
    spec = load_model_spec(args.model_dir)
    tokenizer = Tokenizer.from_file(str(args.model_dir / spec.tokenizer_file))
    tokenizer.no_padding()
    tokenizer.enable_truncation(spec.max_length)
    lines = resources.files("onnxrank.data").joinpath("validation_pairs.jsonl").read_text(
        "utf-8").splitlines()[:64]
    rows = [tokenizer.encode(item["query"], item["passage"]) for item in map(json.loads, lines)]
    fp32 = args.model_dir / "model.onnx"
    core = openvino.Core()
    with tempfile.TemporaryDirectory() as scratch:
        ir = Path(scratch) / "weights_int8.xml"
        compress_openvino_int8_weights(fp32, ir, keep_fp32=head_projections(fp32))
        compiled = {group: core.compile_model(str(ir), "CPU", {
            "INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 2,
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": str(group)}) for group in (0, 32)}
        names = [port.get_any_name() for port in compiled[0].inputs]
        row = min(rows, key=lambda r: abs(len(r.ids) - 120))
        print(f"one row of {len(row.ids)} tokens: score with dynamic quantization off / on")
        for length in sorted({len(row.ids), 127, 128, 256, spec.max_length}):
            for batch in (1, 4):
                off, on = (float(compiled[group](feeds([row] * batch, length, names))[0][0, 0])
                           for group in (0, 32))
                print(f"  {length:4d} positions, batch {batch}: {off:.5f} / {on:.5f}")
        on = compiled[32]
        longest = max(len(r.ids) for r in rows)
        together = on(feeds(rows, longest, names))[0][:, 0]
        alone = np.array([on(feeds([r], len(r.ids), names))[0][0, 0] for r in rows])
        alone_padded = np.array([on(feeds([r], longest, names))[0][0, 0] for r in rows])
        print(f"64 rows together vs alone at their own length: max |diff| "
              f"{np.abs(together - alone).max():.4g}; vs alone padded to {longest}: "
              f"{np.abs(together - alone_padded).max():.4g}")


if __name__ == "__main__":
    main()
