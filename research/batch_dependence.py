"""How much a row's score moves with its batch mates, per backend and precision, on an export.

A research script, not part of the package: it measured the float-rounding movement that
onnxrank.engine.runtime.gate_refusal leaves to the fidelity gate. Run from the repository root::

    python research/batch_dependence.py --model-dir models/minilm-standin

For each way of running the model it scores the first 64 shipped validation pairs in one call
(length-sorted batches, as the engine runs them) and each pair alone, and prints the largest
|difference| in logits and as a multiple of the scores' std.
"""

from __future__ import annotations

import argparse
import json
from importlib import resources

import numpy as np

from onnxrank.engine.reranker import Reranker

RUNS = (("onnxruntime", "fp32"), ("onnxruntime", "int8"), ("openvino", "fp32"),
        ("openvino", "bf16"), ("openvino", "int8"), ("openvino", "int8+bf16"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--pairs", type=int, default=64)
    args = parser.parse_args()
    lines = resources.files("onnxrank.data").joinpath("validation_pairs.jsonl").read_text(
        "utf-8").splitlines()[:args.pairs]
    pairs = [(row["query"], row["passage"]) for row in map(json.loads, lines)]
    for backend, precision in RUNS:
        try:
            reranker = Reranker.from_dir(args.model_dir, device="cpu", backend=backend,
                                         precision=precision, threads=2)
        except (ValueError, ImportError) as err:
            print(f"{backend}/{precision}: not run ({err})")
            continue
        together = reranker.score(pairs)
        alone = np.array([reranker.score([pair])[0] for pair in pairs])
        moved = float(np.abs(together - alone).max())
        print(f"{backend}/{precision}: max |alone - in one call| {moved:.4g} logits, "
              f"{moved / float(np.std(together)):.2g} x the score std")


if __name__ == "__main__":
    main()
