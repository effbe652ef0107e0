"""How much a row's score moves with its batch mates, per backend and precision, on an export.

A research script, not part of the package: it measured the float-rounding movement that the
load's batch check (onnxrank.engine.batch_invariance) removes by padding. Run from the repository
root::

    python research/batch_dependence.py --model-dir models/minilm-standin

For each way of running the model it scores 64 shipped validation pairs that the check does not
run (from the 17th on) in one call (length-sorted batches, as the engine runs them) and each pair
alone, padded to multiples of 8 (the default before the check) and to the multiple the check
measured, and prints the largest |difference| in logits and as a multiple of the scores' std.
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
    parser.add_argument("--skip", type=int, default=16,
                        help="validation pairs left out first (the check runs the first 16)")
    args = parser.parse_args()
    lines = resources.files("onnxrank.data").joinpath("validation_pairs.jsonl").read_text(
        "utf-8").splitlines()[args.skip:args.skip + args.pairs]
    pairs = [(row["query"], row["passage"]) for row in map(json.loads, lines)]
    print("| run | padded to multiples of | moved (logits) | x the score std |")
    print("|---|---|---|---|")
    for backend, precision in RUNS:
        for multiple in (8, None):
            try:
                reranker = Reranker.from_dir(args.model_dir, device="cpu", backend=backend,
                                             precision=precision, threads=2,
                                             pad_to_multiple=multiple)
            except (ValueError, ImportError) as err:
                print(f"| {backend}/{precision} | not run ({err}) | | |")
                break
            together = reranker.score(pairs)
            alone = np.array([reranker.score([pair])[0] for pair in pairs])
            moved = float(np.abs(together - alone).max())
            padding = (str(multiple) if multiple else
                       f"{reranker.padding_multiple} (measured)")
            print(f"| {backend}/{precision} | {padding} | {moved:.3g} | "
                  f"{moved / float(np.std(together)):.2g} |", flush=True)


if __name__ == "__main__":
    main()
