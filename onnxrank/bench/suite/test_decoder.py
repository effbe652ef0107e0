"""Decoder reranker (opt-in scenario ``decoder``): a Qwen3-Reranker-0.6B-shaped model, the engine
(with prefix reuse, its default) vs the same engine without it (``prefix_reuse=False``: every row
runs whole) vs the same recipe in plain transformers (PyTorch fp32 and bf16), interleaved, per
request of 20 and 50 candidates at short and mixed lengths: pairs/s, p50 and the share of the
GEMM ceiling. The workload records the prefix and own tokens per row, which bound the reuse's
gain, and both engines' padded tokens (``padded_token_bound``: the whole rows' over the reuse's),
which bound it on the planned batches.

The model is RANDOM-INITIALISED (Qwen/Qwen3-0.6B's published config, onnxrank's stand-in
tokenizer): speed only, its scores mean nothing. Build and export it first (minutes; see
docs/decoders.md)::

    python -c "from onnxrank.export.decoder_standin import build_decoder_checkpoint; \
build_decoder_checkpoint('checkpoints/qwen3-0.6b-random', size='qwen3-0.6b')"
    onnxrank export --model checkpoints/qwen3-0.6b-random --recipe qwen3-reranker \
        --out models/qwen3-0.6b-random-reranker --validation-pairs 48
    onnxrank bench --model qwen3-0.6b-random-reranker --scenarios decoder --regimes short,mixed

The transformers contenders run the model card's code on the checkpoint the manifest names
(``source.path``): prefix, user text and suffix tokenized apart, left padding, one forward pass
per request with ``logits_to_keep=1`` (the last position only; the card's full-sequence logits
would need 50 x 512 x 151,936 floats), softmax over [no, yes]. On cuda they run on the GPU
(torch's default fp32 matmuls: no TF32); on a CPU the bf16 contender runs only where bf16 is
native. No budgets: the issue's promise (engine >= 2x transformers fp32) is read
from the ratios in the report.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from onnxrank.bench.contenders import engine_contender
from onnxrank.bench.flops import model_flops
from onnxrank.bench.harness import Contender, StoppingRule, measure_interleaved, summarize
from onnxrank.bench.suite.bench_run import BenchRun
from onnxrank.bench.workloads import (
    DEFAULT_SEED,
    PassageSource,
    Regime,
    Request,
    build_workload,
    load_dataset,
)
from onnxrank.engine.recipe import PromptRecipe
from onnxrank.engine.reranker import Reranker, planned_batches
from onnxrank.engine.spec import load_model_spec

SCENARIO = "decoder"
# The model directory name under --models-dir (the export command above writes it), measured
# unless the run's --model names another decoder reranker.
DECODER_MODEL = "qwen3-0.6b-random-reranker"
CANDIDATES = (20, 50)
REGIMES = ("short", "mixed")
# Requests per comparison (a quick run: its own, fewer) and each comparison's wall-time cap. On
# 2 AVX2 cores a 0.6B model scores a pair in 1.5-2 s (0.88 GFLOP per token, 180-250 tokens per
# pair with the prompt), so one request of 50 takes the engine one to two minutes and
# transformers fp32, padding each request to its longest row, longer: 6 requests, the fewest
# whose median has an interval, fill the cap.
QUERIES = 6
TIME_CAP_S = 1500.0
RATIOS = (("engine", "engine_no_prefix"), ("engine", "transformers_fp32"),
          ("engine", "transformers_bf16"))
# PyTorch runs bf16 natively with these (else it emulates it, several times slower than fp32: no
# contender anyone would choose, and it would triple the scenario's time)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


class ModelCardScorer:
    """The recipe in plain transformers, as the model card runs it (torch dtype fp32 or bf16)."""

    def __init__(self, checkpoint: Path, recipe: PromptRecipe, max_length: int, dtype: str,
                 threads: int, device: str = "cpu") -> None:
        import torch
        import transformers

        torch.set_num_threads(threads)
        self._torch = torch
        self.device = device
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint),
                                                                    padding_side="left")
        model: Any = transformers.AutoModelForCausalLM.from_pretrained(
            str(checkpoint), torch_dtype=getattr(torch, dtype))
        self.model = model.to(device).eval()
        self.recipe = recipe
        self.max_length = max_length
        self.prefix = self.tokenizer.encode(recipe.prefix, add_special_tokens=False)
        self.suffix = self.tokenizer.encode(recipe.suffix, add_special_tokens=False)
        self.yes = self.tokenizer.convert_tokens_to_ids(recipe.yes_token)
        self.no = self.tokenizer.convert_tokens_to_ids(recipe.no_token)
        self.settings = {"runtime": f"transformers {transformers.__version__}, torch "
                                    f"{torch.__version__}", "dtype": dtype, "threads": threads,
                         "precision": "bf16" if dtype == "bfloat16" else "fp32",
                         "device": device, "padding": "left", "logits_to_keep": 1}

    def run(self, chunk: Sequence[Request]) -> list[np.ndarray]:
        """p(yes) of every pair of each request (a latency item holds one request)."""
        return [self.score(request) for request in chunk]

    def score(self, request: Request) -> np.ndarray:
        # the qwen3-reranker recipe: one template piece, tokenized whole as the card does
        texts = ["".join(self.recipe.render(instruction=self.recipe.default_instruction,
                                            query=request.query, document=document)[0])
                 for document in request.documents]
        inputs = self.tokenizer(texts, padding=False, truncation="longest_first",
                                add_special_tokens=False, return_attention_mask=False,
                                max_length=self.max_length - len(self.prefix) - len(self.suffix))
        inputs["input_ids"] = [self.prefix + ids + self.suffix for ids in inputs["input_ids"]]
        batch = self.tokenizer.pad(inputs, padding=True, return_tensors="pt").to(self.device)
        with self._torch.inference_mode():
            logits = self.model(**batch, logits_to_keep=1).logits[:, -1, :]
            pair = self._torch.stack([logits[:, self.no], logits[:, self.yes]], dim=1).float()
            # .cpu() waits for the GPU: the time measured is the scores in hand
            return self._torch.softmax(pair, dim=1)[:, 1].cpu().numpy()


def _torch_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _plan_tokens(engine: Reranker, whole_rows: Reranker | None,
                 requests: Sequence[Request]) -> dict[str, object]:
    """What the planned runs hold: the mean tokens per row the engine runs once per query as the
    query's shared prefix (0 without prefix reuse) and those each row runs itself (past the
    prefix), and each engine's padded tokens over the requests (a prefix counted once per query,
    Batch.tokens).
    The whole rows' padded tokens over the engine's (`padded_token_bound`) bound what reuse can
    gain on these requests where every padded token costs the same."""
    prefix, own = [], []
    padded = {"engine": 0, "engine_no_prefix": 0}
    for request in requests:
        pairs = [(request.query, document) for document in request.documents]
        for name, reranker in (("engine", engine), ("engine_no_prefix", whole_rows)):
            if reranker is None:
                continue
            plan = planned_batches(reranker, pairs)
            for batch in plan.batches:
                padded[name] += batch.tokens
                if name == "engine":
                    own += [len(plan.rows[row].ids) - batch.prefix_length for row in batch.rows]
                    prefix += [batch.prefix_length] * len(batch.rows)
    tokens: dict[str, object] = {"prefix_tokens_per_row": float(np.mean(prefix)),
                                 "own_tokens_per_row": float(np.mean(own))}
    if whole_rows is not None:
        tokens.update(padded_tokens=padded,
                      padded_token_bound=padded["engine_no_prefix"] / padded["engine"])
    return tokens


def _named_dirs(bench: BenchRun) -> tuple[Path, Path]:
    """Where the run's --model may be: a directory, or a name under --models-dir."""
    return Path(bench.model_name), bench.models_dir / bench.model_name


def _decoder_dir(bench: BenchRun) -> Path:
    """The run's --model when it names a decoder reranker (`_named_dirs`), else DECODER_MODEL
    under --models-dir."""
    for directory in (*_named_dirs(bench), bench.models_dir / DECODER_MODEL):
        if (directory / "manifest.json").is_file() and load_model_spec(directory).recipe is not None:
            return directory
    pytest.skip(f"--model {bench.model_name} is not a decoder reranker and there is no "
                f"{DECODER_MODEL} in {bench.models_dir}: build and export it first (the commands "
                "are in onnxrank/bench/suite/test_decoder.py's docstring)")


@pytest.mark.parametrize("candidates", CANDIDATES)
def test_decoder(benchmark: Any, bench: BenchRun, device: str, regime: Regime,
                 candidates: int) -> None:
    label = f"{regime.name}/{candidates}"
    if regime.name not in REGIMES:
        pytest.skip(f"the decoder scenario runs the {', '.join(REGIMES)} regimes")
    bench.require_device(SCENARIO, label, device)
    model_dir = _decoder_dir(bench)
    engine = Reranker.from_dir(model_dir, bench.engine_config(device))
    if model_dir in _named_dirs(bench):
        bench.record_model(engine.spec)
    if engine.spec.recipe is None:
        bench.skip_scenario(SCENARIO, label, device,
                            f"{model_dir} is not a decoder reranker (no prompt recipe)")
    source = PassageSource(load_dataset(bench.dataset_path), engine.tokenizer)
    workload = build_workload(source, regime, queries=min(QUERIES, bench.sizes.latency_queries),
                              candidates=min(candidates, bench.sizes.candidates)
                              if bench.quick else candidates, seed=DEFAULT_SEED)
    items = [(request,) for request in workload.requests]
    contenders: list[Contender[Sequence[Request]]] = [engine_contender(
        "engine", f"onnxrank engine on {engine.spec.name} ({bench.engine_label()})", engine)]
    skipped: dict[str, str] = {}
    whole_rows = None
    if engine.uses_prefix_graph:
        whole_rows = Reranker.from_dir(model_dir, bench.engine_config(device, prefix_reuse=False))
        contenders.append(engine_contender(
            "engine_no_prefix", f"the same engine without prefix reuse ({bench.engine_label()})",
            whole_rows))
    else:
        skipped["engine_no_prefix"] = (
            f"the engine runs no prefix graph here ({engine.device_info.backend}/"
            f"{engine.device_info.precision}: prefix_reuse off, or the running variant has no "
            "prefix graph that passed its gate)")
    checkpoint = Path(str(engine.spec.source.get("path", "")))
    recipe = engine.spec.recipe
    for name, dtype in (("transformers_fp32", "float32"), ("transformers_bf16", "bfloat16")):
        if device == "cuda" and not _torch_cuda():
            skipped[name] = "this torch has no CUDA device"
        elif device == "cpu" and dtype == "bfloat16" and not set(BF16_FLAGS) & bench.cpu.flags:
            skipped[name] = (f"this CPU has none of {', '.join(BF16_FLAGS)}: PyTorch would "
                             "emulate bf16, several times slower than fp32")
        elif not (checkpoint / "config.json").is_file():
            skipped[name] = f"the checkpoint the manifest names ({checkpoint}) is not here"
        else:
            scorer = ModelCardScorer(checkpoint, recipe, engine.config.max_length or 0, dtype,
                                     bench.threads, device)
            contenders.append(Contender(
                name=name, label=f"transformers {dtype} (the model card's recipe)",
                settings=scorer.settings,
                run=scorer.run))
    ratios = [ratio for ratio in RATIOS if ratio[1] not in skipped]
    encoder = type(engine).row_encoder(engine.tokenizer, engine.max_length, engine.spec.recipe)
    flops = model_flops(model_dir / engine.spec.variants["fp32"].file)
    flops_per_item = [flops.pairs([len(row.ids) for row in encoder.encode(
        [(request.query, document) for document in request.documents])])
        for request, in items]
    stopping = StoppingRule(min_items=min(bench.sizes.min_items, len(items)),
                            max_items=len(items), time_cap_s=TIME_CAP_S)
    first = workload.requests[0]
    warm_up = [dataclasses.replace(first, documents=first.documents[:4],
                                   token_counts=first.token_counts[:4])]
    timings = measure_interleaved(benchmark, contenders, items,
                                  [len(request.documents) for request, in items],
                                  ratios=ratios, stopping=stopping, warm_up=warm_up)
    measured = workload.requests[:len(timings.seconds[contenders[0].name])]
    description = dataclasses.replace(workload, requests=measured).describe()
    description.update({"model": f"{engine.spec.name}: random weights, speed only",
                        "candidates": candidates, **_plan_tokens(engine, whole_rows, measured)})
    result = summarize(SCENARIO, label, device, contenders, timings, ratios=ratios,
                       skipped=skipped, workload=description,
                       flops_per_item=flops_per_item[:len(measured)])
    bench.record(benchmark, result, engine=engine)
