"""Prefix reuse against whole rows on a Qwen3-0.6B-shaped decoder reranker (random weights).

A research script, not part of the package (speed only: the weights are random). Run from the
repository root; it builds the checkpoint (Qwen/Qwen3-0.6B's published config, onnxrank's
stand-in tokenizer) and exports fp32 with its prefix graph if they are not there yet (about 16
minutes and 14 GB on a 2-core machine), then times one query with 50 passages of 40 words::

    python research/prefix_speed.py checkpoints/qwen3-0.6b-prefix models/qwen3-0.6b-prefix openvino bf16

It prints the prefix graph's gate record, the prefix and own tokens per row, the largest score
difference between the two paths, and the times of `rerank` with and without prefix reuse
(interleaved, 3 each) with the backend and precision given (default: the engine's own choice,
whose probe takes minutes at this size).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from onnxrank.engine.reranker import Reranker, planned_feeds
from onnxrank.export.decoder_standin import build_decoder_checkpoint
from onnxrank.export.validate import load_validation_pairs

PASSAGES = 50
WORDS = 40
ROUNDS = 3


def main() -> None:
    checkpoint, model = Path(sys.argv[1]), Path(sys.argv[2])
    if not (checkpoint / "config.json").exists():
        build_decoder_checkpoint(checkpoint, size="qwen3-0.6b")
    if not (model / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "onnxrank", "export", "--model", str(checkpoint),
                        "--recipe", "qwen3-reranker", "--out", str(model), "--max-length",
                        "1024", "--validation-pairs", "16", "--variants", "fp32", "--quiet"],
                       check=True)
    manifest = json.loads((model / "manifest.json").read_text())
    for variant, entry in manifest["prefix_graphs"].items():
        fidelity = entry["fidelity"]
        print(f"prefix graph of {variant}: max |diff| {fidelity['max_abs_diff']:.3g} "
              f"(limit {fidelity['max_abs_diff_limit']:.3g}), passed {fidelity['passed']}")
    pairs = load_validation_pairs()
    query = pairs[0].query
    documents = [" ".join(pair.passage.split()[:WORDS]) for pair in pairs[:PASSAGES]]
    chosen: dict[str, object] = dict(zip(("backend", "precision"), sys.argv[3:5], strict=False))
    reuse = Reranker.from_dir(model, None, device="cpu", threads=2, **chosen)
    whole = Reranker.from_dir(model, device="cpu", threads=2, prefix_reuse=False,
                              backend=reuse.device_info.backend,
                              precision=reuse.device_info.precision)
    items = [(query, document) for document in documents]
    feeds = planned_feeds(reuse, items)
    prefix = feeds[0]["prefix_ids"].shape[1] if "prefix_ids" in feeds[0] else 0
    own = np.concatenate([batch["attention_mask"].sum(1) for batch in feeds]).mean()
    full = np.concatenate([batch["attention_mask"].sum(1) for batch in planned_feeds(whole, items)]
                          ).mean()
    print(f"{reuse.device_info.backend} {reuse.device_info.precision}: prefix reuse "
          f"{reuse.uses_prefix_graph}, prefix {prefix} tokens, own {own:.1f} vs whole {full:.1f} "
          "tokens per row")
    moved = np.abs(reuse.score(items) - whole.score(items)).max()
    print(f"max |score difference| {moved:.3g}")
    times: dict[str, list[float]] = {"reuse": [], "whole": []}
    for round_index in range(ROUNDS):
        order = [("reuse", reuse), ("whole", whole)]
        for name, reranker in order if round_index % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            reranker.rerank(query, documents)
            times[name].append(time.perf_counter() - start)
    print(f"rerank of {PASSAGES} passages, median of {ROUNDS}: reuse "
          f"{np.median(times['reuse']):.2f} s, whole rows {np.median(times['whole']):.2f} s, "
          f"{np.median(times['whole']) / np.median(times['reuse']):.2f}x")


if __name__ == "__main__":
    main()
