"""Prefix keys and values once per query, carried across its batches: how much faster than the
engine's prefix graph, which reruns the prefix in every batch?

A research script, not part of the package (speed only: the weights are random). The engine's
prefix graph (onnxrank.export.families.decoder.prefix_score_graph) runs a query's shared prompt
head once per batch; with 50 short passages a query takes three batches, and
`research/prefix_plan_bound.py` bounds what carrying the head's keys and values across them could
gain (1.79x -> 1.86x fewer padded tokens than whole rows). This script measures it: it splits
the prefix graph in two the same way (`PrefixCache`: prefix_ids -> every layer's keys and values;
`Continuation`: those, with the rows past the prefix -> scores), converts both like the export's
weight-only int8 route (`compress_int8_weights`, the score head in float) and runs them with the
engine's OpenVINO settings. On the bench's requests of one regime it times, alternating:

- whole rows: the exported whole-row IR on the engine's whole-row plan;
- prefix per batch: the exported prefix IR on the engine's prefix plan (what the engine runs);
- cache per query: the two new IRs on the same batches, the prefix run once per query;
- cache per query, own plan: the same, on batches planned without a prefix charge per batch.

Run from the repository root on the exported 0.6B shape and its checkpoint::

    python research/prefix_cache_speed.py checkpoints/qwen3-0.6b-random \\
        models/qwen3-0.6b-random-reranker models/qwen3-0.6b-cache-irs short 50

It prints the conversion time (first run), each plan's padded tokens, each way's run-only time per
request and its ratio to whole rows, and how far the split IRs' scores are from the prefix IR's.
"""

from __future__ import annotations

import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import openvino
import torch

from onnxrank.bench.paths import DEFAULT_DATASET
from onnxrank.bench.workloads import (
    DEFAULT_SEED,
    PassageSource,
    build_workload,
    load_dataset,
    parse_regimes,
)
from onnxrank.engine.backends.openvino import OpenvinoRunner, compile_config
from onnxrank.engine.batching import Batch, plan_batches, run_overhead_tokens
from onnxrank.engine.execution import RowPlan, batch_feeds
from onnxrank.engine.prefix import PREFIX_INPUT, plan_prefix_batches
from onnxrank.engine.reranker import Reranker, planned_batches
from onnxrank.export.families.decoder import (
    SCORE_HEAD,
    _primed_cache,
    causal_mask,
    score_graph,
    score_head_ops,
)
from onnxrank.export.quantize_openvino import compress_int8_weights
from onnxrank.export.recipes import BUILTIN_RECIPES, answer_token_ids
from onnxrank.export.source import load_checkpoint
from onnxrank.export.tasks import RERANK

QUERIES = 6  # the bench's decoder scenario's requests per comparison
ROUNDS = 2
PRECISION = "int8+bf16"
OPTIONS = {"backend": "openvino", "precision": PRECISION, "threads": 2}
CACHE_INPUT = "prefix_cache"


class PrefixCache(torch.nn.Module):
    """prefix_ids [1, P] -> every layer's keys and values [2 x layers, kv_heads, P, head_dim]."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.body = model.model

    def forward(self, prefix_ids: torch.Tensor) -> torch.Tensor:
        cache = _primed_cache(self.body.config, self.body.dtype)
        self.body(input_ids=prefix_ids, attention_mask=causal_mask(torch.ones_like(prefix_ids)),
                  past_key_values=cache, use_cache=True)
        return torch.cat([tensor for layer in cache.layers
                          for tensor in (layer.keys, layer.values)], dim=0)


class Continuation(torch.nn.Module):
    """(prefix_cache, input_ids, attention_mask) -> scores: the second half of the engine's
    prefix graph, with the prefix's keys and values given instead of computed."""

    def __init__(self, model: Any, answer_ids: tuple[int, ...], weights: tuple[float, ...]) -> None:
        super().__init__()
        self.body = model.model
        self.add_module(SCORE_HEAD, getattr(score_graph(model, answer_ids=answer_ids,
                                                        weights=weights), SCORE_HEAD))

    def forward(self, prefix_cache: torch.Tensor, input_ids: torch.Tensor,
                attention_mask: torch.Tensor) -> torch.Tensor:
        cache = _primed_cache(self.body.config, self.body.dtype)
        batch = input_ids.shape[0]
        for index, layer in enumerate(cache.layers):
            layer.keys = prefix_cache[2 * index][None].expand(batch, -1, -1, -1)
            layer.values = prefix_cache[2 * index + 1][None].expand(batch, -1, -1, -1)
        prefix_length = prefix_cache.shape[2]
        positions = torch.arange(input_ids.shape[1]) + prefix_length
        mask = causal_mask(attention_mask)
        prefix_columns = torch.zeros((batch, 1, input_ids.shape[1], prefix_length),
                                     dtype=mask.dtype)
        hidden = self.body(input_ids=input_ids, attention_mask=torch.cat([prefix_columns, mask], 3),
                           position_ids=positions[None, :].expand(batch, -1),
                           cache_position=positions, past_key_values=cache,
                           use_cache=True).last_hidden_state
        last = attention_mask.sum(dim=1) - 1
        return getattr(self, SCORE_HEAD)(hidden[torch.arange(batch), last].float())


def _convert(checkpoint: Path, out: Path) -> None:
    started = time.perf_counter()
    loaded, _ = load_checkpoint(str(checkpoint), kind="local", task=RERANK,
                                recipe="qwen3-reranker", variants=("ov_int8",))
    model = loaded.model
    recipe = BUILTIN_RECIPES["qwen3-reranker"]
    answer_ids = answer_token_ids(recipe, loaded.tokenizer.backend_tokenizer)
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shapes = {"cache": [2 * config.num_hidden_layers, config.num_key_value_heads, -1, head_dim]}
    graphs = {
        "cache": (PrefixCache(model), (torch.ones((1, 5), dtype=torch.long),),
                  [(PREFIX_INPUT, [1, -1], openvino.Type.i64)]),
        "continuation": (
            Continuation(model, answer_ids, recipe.score_kind.weights),
            (torch.zeros((2 * config.num_hidden_layers, config.num_key_value_heads, 5, head_dim)),
             torch.ones((2, 16), dtype=torch.long), torch.ones((2, 16), dtype=torch.long)),
            [(CACHE_INPUT, shapes["cache"], openvino.Type.f32),
             ("input_ids", [-1, -1], openvino.Type.i64),
             ("attention_mask", [-1, -1], openvino.Type.i64)]),
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, (module, example, inputs) in graphs.items():
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            converted = openvino.convert_model(module.eval(), example_input=example, input=inputs)
        for port, (input_name, _, _) in zip(converted.inputs, inputs, strict=True):
            port.get_tensor().set_names({input_name})
        kept = score_head_ops(converted) if name == "continuation" else []
        openvino.save_model(compress_int8_weights(converted, kept), str(out / f"{name}.xml"),
                            compress_to_fp16=False)
    print(f"converted both IRs in {time.perf_counter() - started:.0f} s")


def _compiled(path: Path) -> Any:
    return openvino.Core().compile_model(str(path), "CPU", compile_config(2, PRECISION))


_requests: dict[int, Any] = {}


def _run(compiled: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    # one infer request per compiled model, reused, as the engine's runner keeps one per thread
    request = _requests.setdefault(id(compiled), compiled.create_infer_request())
    return np.array(request.infer(feeds, share_inputs=True)[compiled.outputs[0]], copy=True)


def main() -> None:
    checkpoint, model_dir, out = (Path(arg) for arg in sys.argv[1:4])
    regime, candidates = parse_regimes(sys.argv[4])[0], int(sys.argv[5])
    if not (out / "continuation.xml").exists():
        _convert(checkpoint, out)
    whole = Reranker.from_dir(model_dir, prefix_reuse=False, **OPTIONS)
    reuse = Reranker.from_dir(model_dir, **OPTIONS)
    cache, continuation = _compiled(out / "cache.xml"), _compiled(out / "continuation.xml")
    charge = run_overhead_tokens("cpu", reuse.config.max_batch_tokens,
                                 OpenvinoRunner.cpu_run_overhead_tokens)

    def own_plan(lengths: list[int], prefix: int) -> list[Batch]:
        return plan_batches(lengths, max_batch_tokens=reuse.config.max_batch_tokens - prefix,
                            max_batch_size=reuse.config.max_batch_size, sort_by_length=True,
                            pad_to_multiple=reuse.padding_multiple, batch_overhead_tokens=charge)

    source = PassageSource(load_dataset(DEFAULT_DATASET), whole.tokenizer)
    requests = build_workload(source, regime, queries=QUERIES, candidates=candidates,
                              seed=DEFAULT_SEED).requests
    plans: list[dict[str, tuple[list[dict[str, np.ndarray]], np.ndarray]]] = []
    tokens: dict[str, int] = {}
    for request in requests:
        pairs = [(request.query, document) for document in request.documents]
        by_way = {"whole rows": planned_batches(whole, pairs),
                  "prefix per batch": planned_batches(reuse, pairs)}
        rows = by_way["prefix per batch"].rows
        by_way["cache per query, own plan"] = RowPlan(rows, plan_prefix_batches(
            rows, [pairs[row.item_index][0] for row in rows], own_plan), reuse.spec.pad_token_id)
        by_way["cache per query"] = by_way["prefix per batch"]
        plans.append({})
        for way, plan in by_way.items():
            order = np.concatenate([batch.rows for batch in plan.batches])
            plans[-1][way] = ([batch_feeds(plan, batch) for batch in plan.batches], order)
            prefix_once = plan.batches[0].prefix_length * (len(plan.batches) - 1) \
                if way.startswith("cache") else 0
            tokens[way] = tokens.get(way, 0) + sum(b.tokens for b in plan.batches) - prefix_once

    def run_way(way: str, feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        if way == "whole rows":
            return [whole._run(feed) for feed in feeds]
        if way == "prefix per batch":
            return [reuse._run(feed) for feed in feeds]
        kv = _run(cache, {PREFIX_INPUT: feeds[0][PREFIX_INPUT]})
        return [_run(continuation, {CACHE_INPUT: kv, "input_ids": feed["input_ids"],
                                    "attention_mask": feed["attention_mask"]})
                for feed in feeds]

    ways = list(plans[0])
    times: dict[str, list[float]] = {way: [] for way in ways}
    scores: dict[str, list[np.ndarray]] = {way: [] for way in ways}
    for round_number in range(ROUNDS):
        for number, request_plans in enumerate(plans):
            rotation = ways[number % len(ways):] + ways[:number % len(ways)]
            for way in rotation if round_number % 2 == 0 else rotation[::-1]:
                feeds, order = request_plans[way]
                started = time.perf_counter()
                outputs = run_way(way, feeds)
                times[way].append(time.perf_counter() - started)
                if round_number == 0:
                    result = np.empty(len(order))
                    result[order] = np.concatenate(outputs).ravel()
                    scores[way].append(result)
        print(f"round {round_number + 1} done")
    base = statistics.median(times["whole rows"])
    print(f"{QUERIES} requests of {candidates} {regime.name} passages, {PRECISION}, 2 threads, "
          f"{ROUNDS} rounds; padded tokens (prefix counted as it runs): {tokens}")
    for way in ways:
        ratios = [w / t for w, t in zip(times["whole rows"], times[way], strict=True)]
        print(f"{way}: median {statistics.median(times[way]):.2f} s per request, "
              f"whole rows / this {base / statistics.median(times[way]):.2f}x (per request: "
              f"median {statistics.median(ratios):.2f}x, {min(ratios):.2f}-{max(ratios):.2f}x)")
    reference = np.concatenate(scores["prefix per batch"])
    spread = reference.std()
    for way in ("cache per query", "cache per query, own plan"):
        difference = np.abs(np.concatenate(scores[way]) - reference).max()
        print(f"{way} vs prefix per batch: max |diff| {difference:.4g} "
              f"({difference / spread:.3g} x the score std)")


if __name__ == "__main__":
    main()
