"""The CUDA path on a real GPU: fidelity against PyTorch, IO binding, and speed against PyTorch.

A research script, not part of the package. It needs onnxruntime-gpu (instead of onnxruntime),
torch with CUDA and the export extra; the engine's tests cover the same logic without a GPU.
Three commands, run from the repository root:

``families``: for each family named, build its full-size checkpoint (its published shape,
**random weights: speed only**), export fp32, opt and fp16, and then

1. fidelity: raw logits of the engine on CUDA (fp16; opt, which is fp32) against PyTorch fp32 on
   the GPU (TF32 off), on the shipped validation pairs: max |diff| and Spearman over all pairs;
2. IO binding: how many of the engine's runs went through onnxruntime's IO binding;
3. speed: 50-candidate queries cut from the validation pairs, the engine (fp16, auto batching)
   interleaved with PyTorch fp16 and fp32 (batches of 32 in input order, each padded to its
   longest row, as sentence-transformers' CrossEncoder does); median milliseconds per query.

Random weights make the pooled features of different inputs nearly alike, and the head is
rescaled to spread the logits anyway (onnxrank.bench.family_checkpoints), which magnifies fp16
rounding: ``--fp16-max-abs-diff`` loosens the export's fp16 gate for such speed-only checkpoints.

``attention``: onnxruntime's attention kernels on new and repeated shapes (the engine's
CUDA_PROVIDER_OPTIONS leave cuDNN's out): an exported fp16 file run at 67 shapes (16 rows x 59
lengths, 8 row counts x 128), each once new and once again, in a fresh process per kernel mask
(onnxruntime reads the mask once per process).

``reference`` and ``exported``: the same fidelity check for a model that is too large to build
on the GPU machine: ``reference`` writes PyTorch fp32 logits of the validation pairs on this
machine's CPU; ``exported`` scores the pairs with an exported model directory on CUDA and compares::

    python research/cuda_check.py families --work /tmp/cuda-check --out bert.json --families bert
    python research/cuda_check.py attention --model-file models/minilm-standin/model_fp16.onnx \\
        --out attention.json
    python research/cuda_check.py reference --checkpoint models/minilm-standin/checkpoint \\
        --out ref.json
    python research/cuda_check.py exported --model models/minilm-standin --reference ref.json \\
        --out standin.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

CANDIDATES = 50
TORCH_BATCH = 32


def validation_pairs() -> list[tuple[str, str]]:
    text = resources.files("onnxrank.data").joinpath("validation_pairs.jsonl").read_text("utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [(row["query"], row["passage"]) for row in rows]


def queries(pairs: list[tuple[str, str]], count: int) -> list[list[tuple[str, str]]]:
    """`count` queries of CANDIDATES passages each: every pair's query with the passages that follow
    it in the file (wrapping), so lengths are the file's real mix."""
    passages = [passage for _, passage in pairs]
    return [[(pairs[q * 7 % len(pairs)][0], passages[(q * 7 + i) % len(passages)])
             for i in range(CANDIDATES)] for q in range(count)]


class TorchScorer:
    """PyTorch on the GPU the way sentence-transformers' CrossEncoder runs it."""

    def __init__(self, checkpoint: Path, dtype: Any, max_length: int, device: str) -> None:
        import torch
        import transformers

        self.torch, self.device = torch, device
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
        self.model = transformers.AutoModelForSequenceClassification.from_pretrained(
            checkpoint, dtype=dtype).to(device).eval()
        self.max_length = max_length

    def score(self, pairs: list[tuple[str, str]]) -> np.ndarray:
        out = []
        with self.torch.inference_mode():
            for start in range(0, len(pairs), TORCH_BATCH):
                chunk = pairs[start:start + TORCH_BATCH]
                batch = self.tokenizer([q for q, _ in chunk], [p for _, p in chunk],
                                       padding=True, truncation="longest_first",
                                       max_length=self.max_length, return_tensors="pt").to(self.device)
                out.append(self.model(**batch).logits[:, 0].float().cpu().numpy())
        return np.concatenate(out)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ranks_a, ranks_b = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ranks_a, ranks_b)[0, 1])


def cuda_engines(model_dir: Path, device: str, pairs: list[tuple[str, str]],
                 reference: np.ndarray, result: dict[str, Any]) -> dict[str, Any]:
    """The engine on `device` at fp16 (CUDA only) and opt (or fp32 where the directory has no opt
    file): each one's logits against `reference` and its IO-binding runs go into `result`."""
    from onnxrank import Reranker
    from onnxrank.engine.backends import onnxruntime as ort_backend
    from onnxrank.engine.spec import load_model_spec

    io_binding_runs = 0
    plain_run = ort_backend.OnnxruntimeRunner._run_with_io_binding

    def counted(self: Any, feeds: dict[str, np.ndarray], *rest: Any) -> np.ndarray:
        nonlocal io_binding_runs
        io_binding_runs += 1
        return plain_run(self, feeds, *rest)

    ort_backend.OnnxruntimeRunner._run_with_io_binding = counted  # type: ignore[method-assign]
    variants = load_model_spec(model_dir).variants
    wanted = [precision for precision in ("fp16", "opt", "fp32")
              if precision in variants and (model_dir / variants[precision].file).is_file()
              and (precision != "fp16" or device == "cuda")]
    engines = {precision: Reranker.from_dir(model_dir, device=device, precision=precision)
               for precision in wanted[:2]}
    for precision, engine in engines.items():
        runs_before = io_binding_runs
        logits = np.asarray(engine.score(pairs), dtype=np.float64)
        result[f"engine_{precision}"] = {
            "provider": engine.device_info.provider, "variant": engine.device_info.variant,
            "max_abs_diff": float(np.max(np.abs(logits - reference))),
            "reference_spread": float(reference.max() - reference.min()),
            "spearman": spearman(logits, reference),
            "io_binding_runs": io_binding_runs - runs_before,
        }
    return engines


ATTENTION_MASKS = ("default", "55", "2", "1", "4", "16")
ATTENTION_SHAPES = [(16, length) for length in range(40, 512, 8)] + [
    (rows, 128) for rows in (1, 3, 5, 7, 9, 24, 40, 64)]


def time_attention_kernels(model_file: Path, mask: str) -> dict[str, Any]:
    """One kernel mask (onnxruntime's sdpa_kernel; "default" = none set): milliseconds to run
    ATTENTION_SHAPES once new and once again."""
    import onnxruntime

    options = {} if mask == "default" else {"sdpa_kernel": mask}
    session_options = onnxruntime.SessionOptions()
    session_options.log_severity_level = 3
    session = onnxruntime.InferenceSession(
        str(model_file), session_options,
        providers=[("CUDAExecutionProvider", options), "CPUExecutionProvider"])
    names = {node.name for node in session.get_inputs()}
    rng = np.random.default_rng(0)

    def feeds(rows: int, length: int) -> dict[str, np.ndarray]:
        ids = rng.integers(1000, 20000, (rows, length))
        ids[:, 0], ids[:, -1] = 101, 102
        batch = {"input_ids": ids, "attention_mask": np.ones((rows, length), np.int64),
                 "token_type_ids": np.zeros((rows, length), np.int64)}
        return {name: value.astype(np.int64) for name, value in batch.items() if name in names}

    session.run(None, feeds(16, 32))
    batches = [feeds(rows, length) for rows, length in ATTENTION_SHAPES]
    passes = []
    for _ in range(2):
        start = time.perf_counter()
        for batch in batches:
            session.run(None, batch)
        passes.append(round((time.perf_counter() - start) * 1000, 1))
    return {"sdpa_kernel": mask, "shapes": len(batches), "new_ms": passes[0], "again_ms": passes[1]}


TORCH_ATTENTION = ("default", "no_cudnn")


def time_torch_attention(checkpoint: Path, setting: str) -> dict[str, Any]:
    """PyTorch fp16 (transformers' sdpa attention, as sentence-transformers' CrossEncoder runs it)
    with torch's default attention backends or with cuDNN's left out: milliseconds to run
    ATTENTION_SHAPES once new and once again, each batch's last row half padding."""
    import torch
    import transformers

    if setting == "no_cudnn":
        torch.backends.cuda.enable_cudnn_sdp(False)
    model = transformers.AutoModelForSequenceClassification.from_pretrained(
        checkpoint, dtype=torch.float16).to("cuda").eval()
    generator = torch.Generator().manual_seed(0)

    def batch(rows: int, length: int) -> dict[str, Any]:
        ids = torch.randint(1000, 20000, (rows, length), generator=generator)
        mask = torch.ones((rows, length), dtype=torch.int64)
        mask[-1, length // 2:] = 0
        return {"input_ids": ids.to("cuda"), "attention_mask": mask.to("cuda")}

    batches = [batch(rows, length) for rows, length in ATTENTION_SHAPES]
    passes = []
    with torch.inference_mode():
        model(**batch(16, 32))
        for _ in range(2):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for inputs in batches:
                model(**inputs)
            torch.cuda.synchronize()
            passes.append(round((time.perf_counter() - start) * 1000, 1))
    return {"attention": setting, "shapes": len(batches), "new_ms": passes[0],
            "again_ms": passes[1], "torch": torch.__version__}


def check_family(family: str, work: Path, *, size: str, device: str, rounds: int,
                 fp16_max_abs_diff: float) -> dict[str, Any]:
    import torch

    from onnxrank.bench.family_checkpoints import build_family_checkpoint
    from onnxrank.export.fidelity import FidelityThresholds
    from onnxrank.export.pipeline import ExportRequest, export_model

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    checkpoint, model_dir = work / size / "checkpoints" / family, work / size / "models" / family
    started = time.perf_counter()
    if not (checkpoint / "config.json").is_file():
        build_family_checkpoint(family, checkpoint, size=size)  # type: ignore[arg-type]
    if not (model_dir / "manifest.json").is_file():
        export_model(ExportRequest(
            model=str(checkpoint), out_dir=model_dir, variants=("fp32", "opt", "fp16"),
            thresholds=FidelityThresholds(fp16_max_abs_diff=fp16_max_abs_diff)))
    manifest = json.loads((model_dir / "manifest.json").read_text())
    result: dict[str, Any] = {
        "family": family, "weights": "random weights: speed only",
        "fp16_max_abs_diff_gate": fp16_max_abs_diff,
        "export_s": round(time.perf_counter() - started, 1),
        "variants": sorted(manifest["variants"]), "failed_variants": manifest["failed_variants"],
        "export_fp16_fidelity": manifest["variants"].get("fp16", {}).get("fidelity"),
    }
    pairs = validation_pairs()
    reference = TorchScorer(checkpoint, torch.float32, manifest["max_length"], device).score(pairs)

    engines = cuda_engines(model_dir, device, pairs, reference, result)
    workload = queries(pairs, 20)
    contenders = {
        "engine_fp16": engines["fp16" if device == "cuda" else "opt"].score,
        "torch_fp16": TorchScorer(checkpoint, torch.float16, manifest["max_length"], device).score,
        "torch_fp32": TorchScorer(checkpoint, torch.float32, manifest["max_length"], device).score,
    }
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for warm in range(2):
        for score in contenders.values():
            score(workload[warm])
    for round_ in range(rounds):
        for name, score in contenders.items():
            query = workload[round_ % len(workload)]
            synchronize()
            start = time.perf_counter()
            score(query)
            synchronize()
            times[name].append((time.perf_counter() - start) * 1000)
    medians = {name: statistics.median(values) for name, values in times.items()}
    result["ms_per_query_of_50"] = {name: round(value, 2) for name, value in medians.items()}
    result["engine_speedup"] = {name: round(value / medians["engine_fp16"], 2)
                                for name, value in medians.items() if name != "engine_fp16"}
    return result


def each_in_its_own_process(command: list[str], option: str, values: tuple[str, ...],
                            out: Path) -> None:
    """This script's `command` once per value of `option`, each in a fresh process (the attention
    backends are read once per process); their JSON lines written to `out` and printed."""
    rows = [json.loads(subprocess.run(
        [sys.executable, __file__, *command, option, value, "--out", os.devnull],
        capture_output=True, text=True, check=True).stdout.splitlines()[-1]) for value in values]
    out.write_text(json.dumps(rows, indent=2))
    for row in rows:
        print(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    family_command = commands.add_parser("families")
    family_command.add_argument("--work", type=Path, required=True)
    family_command.add_argument("--families", default="bert")
    family_command.add_argument("--rounds", type=int, default=60)
    family_command.add_argument("--fp16-max-abs-diff", type=float, default=5e-2)
    # a dry run of the script itself on a machine without a GPU: --size tiny --device cpu
    family_command.add_argument("--size", choices=("full", "tiny"), default="full")
    family_command.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    attention_command = commands.add_parser("attention")
    attention_command.add_argument("--model-file", type=Path, required=True)
    attention_command.add_argument("--mask", help="one mask, in this process (the command runs "
                                   "each of ATTENTION_MASKS in a process of its own)")
    torch_attention_command = commands.add_parser("torch-attention")
    torch_attention_command.add_argument("--checkpoint", type=Path, required=True)
    torch_attention_command.add_argument("--setting", help="one of TORCH_ATTENTION, in this "
                                         "process (the command runs each in a process of its own)")
    reference_command = commands.add_parser("reference")
    reference_command.add_argument("--checkpoint", type=Path, required=True)
    reference_command.add_argument("--max-length", type=int, default=512)
    exported_command = commands.add_parser("exported")
    exported_command.add_argument("--model", type=Path, required=True)
    exported_command.add_argument("--reference", type=Path, required=True)
    exported_command.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    for command in (family_command, attention_command, torch_attention_command, reference_command,
                    exported_command):
        command.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "attention":
        if args.mask:
            print(json.dumps(time_attention_kernels(args.model_file, args.mask)))
            return
        each_in_its_own_process(["attention", "--model-file", str(args.model_file)], "--mask",
                                ATTENTION_MASKS, args.out)
        return
    if args.command == "torch-attention":
        if args.setting:
            print(json.dumps(time_torch_attention(args.checkpoint, args.setting)))
            return
        each_in_its_own_process(["torch-attention", "--checkpoint", str(args.checkpoint)],
                                "--setting", TORCH_ATTENTION, args.out)
        return
    if args.command == "reference":
        import torch

        logits = TorchScorer(args.checkpoint, torch.float32, args.max_length, "cpu").score(
            validation_pairs())
        args.out.write_text(json.dumps([float(value) for value in logits]))
        return
    import onnxruntime
    import torch

    report: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "onnxruntime": onnxruntime.__version__,
        "providers": onnxruntime.get_available_providers(), "torch": torch.__version__,
    }
    if args.command == "exported":
        reference = np.asarray(json.loads(args.reference.read_text()), dtype=np.float64)
        cuda_engines(args.model, args.device, validation_pairs(), reference, report)
        args.out.write_text(json.dumps(report, indent=2))
        print(json.dumps(report, indent=2))
        return
    report["families"] = []
    for family in args.families.split(","):
        try:
            report["families"].append(check_family(
                family, args.work, size=args.size, device=args.device, rounds=args.rounds,
                fp16_max_abs_diff=args.fp16_max_abs_diff))
        except Exception as err:  # one family's failure must not lose the others' results
            report["families"].append({"family": family, "error": f"{type(err).__name__}: {err}"})
        args.out.write_text(json.dumps(report, indent=2))
        print(json.dumps(report["families"][-1], indent=2), flush=True)


if __name__ == "__main__":
    main()
