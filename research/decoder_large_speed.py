"""A large decoder's engine speed and prefix-graph agreement, where its export cannot be gated.

A research script, not part of the package (speed only: the weights are random). A random
Qwen3-4B shape misses the `ov_int8` gate (docs/export.md, "The weight-compressed route"), so its
export writes nothing, and the 25 minutes of float32 PyTorch reference say nothing about speed.
This script converts the checkpoint the export's way (`direct_openvino.convert_compressed`:
weight-only int8, score head in float) into both IRs, opens them as the engine opens `ov_int8`
(OpenvinoBackend, int8+bf16 or int8, 2 threads), and runs the batches the engine plans for one
query with 50 passages, both ways: whole rows and prefix reuse. The plans come from an exported
decoder with the same tokenizer and recipe (the random 0.6B shape), so the 4B runs exactly the
rows and batches the engine would give it. Run from the repository root (it builds the random
checkpoint at CHECKPOINT first if it is not there)::

    python research/decoder_large_speed.py CHECKPOINT PLANS_FROM OUT

for example CHECKPOINT `checkpoints/qwen3-4b-random`, PLANS_FROM
`models/qwen3-0.6b-random-reranker` and OUT `models/qwen3-4b-irs`.

It prints the conversion's time and peak memory (first run only), each plan's batches and tokens,
the run-only time of each plan (alternating, `ROUNDS` rounds), the process's resident memory with
both IRs compiled, and how far the prefix IR's scores are from the whole-row IR's on the same rows
(both int8: the prefix graph's own gate compares it with PyTorch, which this script skips).
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from onnxrank.engine.backends.openvino import OpenvinoBackend, cpu_capabilities
from onnxrank.engine.execution import batch_feeds
from onnxrank.engine.prefix import PrefixGraph
from onnxrank.engine.reranker import Reranker, planned_batches
from onnxrank.engine.variants import VARIANTS
from onnxrank.export.decoder_standin import build_decoder_checkpoint
from onnxrank.export.direct_openvino import DIRECT_VARIANT, convert_compressed
from onnxrank.export.source import load_checkpoint
from onnxrank.export.tasks import RERANK
from onnxrank.export.validate import load_validation_pairs
from onnxrank.types import Device

PASSAGES = 50
WORDS = 70  # the bench's short passages run 60-100 tokens
ROUNDS = 2
RECIPE = "qwen3-reranker"


def _resident_gib() -> float:
    """This process's resident memory now (VmRSS), GiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError("no VmRSS in /proc/self/status")


def _convert(checkpoint: Path, out: Path) -> None:
    facts = VARIANTS[DIRECT_VARIANT]
    started = time.perf_counter()
    loaded, family = load_checkpoint(str(checkpoint), kind="local", task=RERANK, recipe=RECIPE,
                                     variants=(DIRECT_VARIANT,))
    out.mkdir(parents=True, exist_ok=True)
    converted = convert_compressed(loaded, family, out / facts.file, out / facts.prefix_file)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"converted both IRs in {time.perf_counter() - started:.0f} s, peak resident "
          f"{peak:.1f} GiB; prefix graph: {converted.prefix_graph}")


def _plan(reranker: Reranker,
          pairs: list[tuple[str, str]]) -> tuple[list[dict], np.ndarray, int]:
    """The feeds of `reranker.score(pairs)`'s batches, the row each output belongs to and the
    tokens the batches run (Batch.tokens)."""
    plan = planned_batches(reranker, pairs)
    order = np.concatenate([batch.rows for batch in plan.batches])
    return ([batch_feeds(plan, batch) for batch in plan.batches], order,
            sum(batch.tokens for batch in plan.batches))


def main() -> None:
    checkpoint, plans_from, out = (Path(arg) for arg in sys.argv[1:4])
    facts = VARIANTS[DIRECT_VARIANT]
    if not (checkpoint / "config.json").exists():
        build_decoder_checkpoint(checkpoint, size="qwen3-4b")
    if not (out / facts.prefix_file).exists():
        _convert(checkpoint, out)
    precision = "int8+bf16" if "BF16" in cpu_capabilities() else "int8"
    options = {"backend": "openvino", "precision": precision, "threads": 2, "pad_to_multiple": 16}
    pairs = load_validation_pairs()
    query = pairs[0].query
    items = [(query, " ".join(pair.passage.split()[:WORDS])) for pair in pairs[:PASSAGES]]
    plans = {"whole rows": _plan(Reranker.from_dir(plans_from, prefix_reuse=False, **options),
                                 items),
             "prefix reuse": _plan(Reranker.from_dir(plans_from, **options), items)}
    before = _resident_gib()
    backend = OpenvinoBackend()
    runners = {}
    for name, file in (("whole rows", facts.file), ("prefix reuse", facts.prefix_file)):
        started = time.perf_counter()
        runners[name] = backend.open(out / file, device=Device.CPU, precision=precision,
                                     variant=DIRECT_VARIANT, threads=2)
        print(f"{name}: compiled {file} in {time.perf_counter() - started:.0f} s")
    prefix_graph = PrefixGraph(runners["prefix reuse"])
    for name, (feeds, _, tokens) in plans.items():
        print(f"{name}: batches {[feed['input_ids'].shape for feed in feeds]}, padded tokens "
              f"{tokens}")
    times: dict[str, list[float]] = {name: [] for name in plans}
    scores: dict[str, np.ndarray] = {}
    for round_number in range(ROUNDS):
        for name in plans if round_number % 2 == 0 else list(plans)[::-1]:
            feeds, order, _ = plans[name]
            # the prefix plan as the engine runs it: each query's cache once, then its batches
            run = runners[name].run if name == "whole rows" else prefix_graph.plan_run()
            started = time.perf_counter()
            outputs = [run(feed) for feed in feeds]
            times[name].append(time.perf_counter() - started)
            result = np.empty(len(order))
            result[order] = np.concatenate(outputs).ravel()
            scores[name] = result
        print(f"round {round_number + 1}: " + ", ".join(
            f"{name} {values[-1]:.1f} s" for name, values in times.items()))
    print(f"resident with both IRs compiled and run: {_resident_gib():.1f} GiB "
          f"({before:.1f} GiB before opening them; {precision}, {PASSAGES} passages)")
    whole, reuse = (statistics.median(times[name]) for name in plans)
    print(f"run-only, median of {ROUNDS}: whole rows {whole:.1f} s, prefix reuse {reuse:.1f} s, "
          f"{whole / reuse:.2f}x")
    difference = np.abs(scores["prefix reuse"] - scores["whole rows"]).max()
    spread = scores["whole rows"].std()
    print(f"prefix vs whole-row IR: max |diff| {difference:.4g} ({difference / spread:.3g} x the "
          f"score std {spread:.4g}), Spearman "
          f"{spearmanr(scores['prefix reuse'], scores['whole rows']).statistic:.4f}")


if __name__ == "__main__":
    main()
