"""Quantization-aware distillation of a cross-encoder into int8 encoder linears (issue 53, item 3).

A research script, not part of the package. Run from the repository root on a stand-in checkpoint::

    python research/int8_distill.py --checkpoint models/minilm-standin/checkpoint \
        --method lsq-listwise --steps 200

Every encoder linear (Q, K, V, attention output, both feed-forward layers) gets fake-quantized int8:
weights symmetric per output channel, inputs asymmetric per tensor (u8), both ranges *learned* with
the weights (LSQ/PACT-style: the clamp bounds are parameters, the rounding a straight-through
estimator). The student is distilled from the fp32 model's own logits on unlabeled query groups
built only from the calibration pairs and the stand-in's head pairs (never the validation pairs):
a per-query listwise KL (softmax over each group's candidate scores) plus a pointwise MSE. The
trained model is exported with ``torch.fake_quantize_*`` ops, which ``openvino.convert_model`` turns
into FakeQuantize nodes that OpenVINO's CPU plugin runs as int8, and scored through the engine's
runtime layer against PyTorch fp32 with the export's own gate (compare / check_thresholds) on the
tuning and held-out parts. Seeded and deterministic, one torch thread.

What it found on the stand-in (all-MiniLM-L6-v2 encoder + fitted head), 2-core Xeon (AMX class)
shared with other jobs, OpenVINO int8 scored against PyTorch fp32; per-query Spearman / top-10
overlap, short and mixed regimes, gate 0.98 / 0.95 on every cell:

| run | tuning short | tuning mixed | held-out short | held-out mixed |
|---|---|---|---|---|
| all linears, ranges at calibration min/max | 0.932 / 0.875 | 0.965 / 0.925 | 0.938 / 0.82 | 0.954 / 0.90 |
| same, ranges at the 0.9999 quantile | 0.694 / 0.69 | 0.741 / 0.70 | 0.678 / 0.66 | 0.750 / 0.64 |
| FFN only, min/max | 0.943 / 0.89 | 0.963 / 0.89 | 0.948 / 0.87 | 0.958 / 0.87 |
| FFN only, 40 steps weights (lr 1e-5) + ranges | 0.920 / 0.85 | 0.941 / 0.88 | 0.892 / 0.83 | 0.903 / 0.82 |
| FFN only, 30 steps ranges only | 0.935 / 0.84 | 0.969 / 0.91 | 0.948 / 0.87 | 0.965 / 0.88 |
| all linears, position 0 float (--float-cls) | 0.984 / 0.95 | 0.992 / 0.95 | 0.985 / 0.96 | 0.990 / 0.96 |
| FFN only, position 0 float | 0.986 / 0.94 | 0.991 / 0.975 | 0.989 / 0.94 | 0.991 / 0.96 |
| all, position 0 float, --rotate-all 16 | 0.993 / 0.975 | 0.996 / 0.975 | 0.995 / 0.97 | 0.996 / 0.97 |

The two rows before the last (2026-11-28, AMX class, alone, two threads) found the cause: the [CLS] row's
massive activations set every per-tensor input range, and the head reads that row. With position 0
computed in float and the ranges calibrated on the other rows, no training is needed; the export's
form of it is ``onnxrank/export/cls_row_split.py`` (ov_int8 rung 2). The last row (2026-11-29, AMX
class) rotates every quantized linear's input by block Hadamard matrices (``--rotate-all B``,
``--rotate-down B`` for the down-projections alone, ``--precision int8+bf16`` for the bf16 run):
per-query Spearman 0.992-0.998 at blocks of 16 to 128 in both runs; the export's form is
``onnxrank/export/hadamard_rotation.py`` (ov_int8 rung 3; results/export-runs.md).

A step (12 candidates of one query, rows cut at 256 tokens, teacher and student) took 6-10 s on one
shared thread, so an export's time budget affords tens of steps; the loss (MSE + listwise KL) did not
fall within them.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from onnxrank.engine.runtime import open_model_file
from onnxrank.errors import FidelityError
from onnxrank.export.fidelity import FidelityThresholds
from onnxrank.export.tasks import export_task
from onnxrank.export.validate import (
    ValidationInputs,
    ValidationPair,
    check_thresholds,
    compare,
    encode_validation,
    load_calibration_pairs,
    load_validation_pairs,
    run_batches,
)

logger = logging.getLogger(__name__)

GROUP_ROWS = 12  # candidates of one query per training step (a random subset of its group)
TRAIN_MAX_LENGTH = 256  # training rows are cut here to bound a step's time; evaluation is not
ACT_LEVELS = 255
W_LEVEL = 127
HEAD_PAIRS = Path(__file__).resolve().parents[1] / "onnxrank/data/standin_head_pairs.jsonl"


def _round_ste(value: torch.Tensor) -> torch.Tensor:
    return (value.round() - value).detach() + value


class QuantLinear(nn.Module):
    """A linear layer whose input (u8 per tensor) and weight (s8 per row) are fake-quantized with
    learned ranges; ``export`` switches to torch's fake_quantize ops (the OpenVINO-convertible form)."""

    def __init__(self, linear: nn.Linear, float_cls: bool = False, rotate: int = 0) -> None:
        super().__init__()
        # rotate > 0: the input is multiplied by a block-diagonal Hadamard matrix (blocks of
        # `rotate` channels, orthonormal) and the weight by its transpose, exact in float, so one
        # outlier channel is spread over its block before the per-tensor range is set
        self.rotation: torch.Tensor | None = None
        if rotate:
            from scipy.linalg import hadamard

            block = torch.tensor(hadamard(rotate), dtype=linear.weight.dtype) / rotate ** 0.5
            self.rotation = block
            with torch.no_grad():
                rotated = nn.Linear(linear.in_features, linear.out_features)
                rotated.weight.copy_(self._rotate(linear.weight))
                rotated.bias.copy_(linear.bias)
            linear = rotated
        self.linear = linear
        # position 0 ([CLS]) runs in float: its massive activations set no range, and it is the
        # row the head reads
        self.float_cls = float_cls
        weight = linear.weight.detach()
        # log-space, so an optimizer step moves a scale by a share of itself, not by lr
        self.w_log_scale = nn.Parameter((weight.abs().amax(dim=1).clamp_min(1e-8) / W_LEVEL).log())
        self.a_low = nn.Parameter(torch.zeros(()))
        self.a_high = nn.Parameter(torch.ones(()))
        self.export = False
        self.enabled = True
        # activation samples while calibrating (enabled=False); None once the range is set
        self.observed: list[torch.Tensor] | None = []

    def calibrate(self, quantile: float) -> None:
        """Set the input range from the observed samples (a quantile each side; 1 = min/max)."""
        assert self.observed, "calibrate after scoring calibration rows with enabled=False"
        values = torch.cat(self.observed)
        if values.numel() > 4_000_000:
            values = values[torch.linspace(0, values.numel() - 1, 4_000_000).long()]
        low = float(torch.quantile(values.float(), 1 - quantile)) if quantile < 1 else float(values.min())
        high = float(torch.quantile(values.float(), quantile)) if quantile < 1 else float(values.max())
        self.a_low.data.fill_(min(low, 0.0))
        self.a_high.data.fill_(max(high, 1e-3))
        self.observed = None

    def _act_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        scale = (self.a_high - self.a_low).clamp_min(1e-6) / ACT_LEVELS
        zero = _round_ste((-self.a_low / scale).clamp(0, ACT_LEVELS))
        return scale, zero

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        assert self.rotation is not None
        size = self.rotation.shape[0]
        return (x.reshape(*x.shape[:-1], -1, size) @ self.rotation).reshape(x.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rotation is not None:
            x = self._rotate(x)
        if self.float_cls and x.dim() == 3 and self.enabled:
            return torch.cat([self.linear(x[:, :1]), self._quantized(x[:, 1:])], dim=1)
        if self.float_cls and x.dim() == 3 and self.observed is not None:
            self.observed.append(x[:, 1:].detach().flatten()[::29].clone())
            return self.linear(x)
        return self._quantized(x)

    def _quantized(self, x: torch.Tensor) -> torch.Tensor:
        if self.observed is not None and not self.enabled:
            self.observed.append(x.detach().flatten()[::29].clone())
            return self.linear(x)
        if not self.enabled:
            return self.linear(x)
        scale, zero = self._act_qparams()
        w_scale = self.w_log_scale.exp()
        if self.export:
            xq = torch.fake_quantize_per_tensor_affine(x, float(scale), int(zero), 0, ACT_LEVELS)
            wq = torch.fake_quantize_per_channel_affine(
                self.linear.weight, w_scale.detach(), torch.zeros_like(w_scale, dtype=torch.int32),
                0, -W_LEVEL, W_LEVEL)
        else:
            xq = (torch.clamp(_round_ste(x / scale) + zero, 0, ACT_LEVELS) - zero) * scale
            wq = torch.clamp(_round_ste(self.linear.weight / w_scale[:, None]), -W_LEVEL, W_LEVEL) \
                * w_scale[:, None]
        return nn.functional.linear(xq, wq, self.linear.bias)


def _wrap_linears(model: Any, which: str, float_cls: bool = False,
                  rotate_down: int = 0, rotate_all: int = 0,
                  rotate_context: bool = True) -> list[QuantLinear]:
    """Replace the encoder's linears (``which``: all, ffn) with QuantLinear; the head stays fp32."""
    wrapped = []
    for layer in model.base_model.encoder.layer:
        targets = [(layer.intermediate, "dense"), (layer.output, "dense")]
        if which == "all":
            targets += [(layer.attention.self, "query"), (layer.attention.self, "key"),
                        (layer.attention.self, "value"), (layer.attention.output, "dense")]
        for owner, name in targets:
            module = QuantLinear(getattr(owner, name), float_cls,
                                 rotate_down if owner is layer.output
                                 else 0 if owner is layer.attention.output and not rotate_context
                                 else rotate_all)
            setattr(owner, name, module)
            wrapped.append(module)
    return wrapped


def _set(wrapped: list[QuantLinear], **flags: bool) -> None:
    for module in wrapped:
        for key, value in flags.items():
            setattr(module, key, value)


class _Logits(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).logits


def _torch_run(model: nn.Module) -> Any:
    def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.no_grad():
            tensors = {key: torch.from_numpy(value) for key, value in feeds.items()
                       if key in ("input_ids", "attention_mask", "token_type_ids")}
            return model(**tensors).logits.float().numpy()
    return run


def _training_pairs(seed: int) -> list[ValidationPair]:
    """Unlabeled query groups from the calibration pairs and the head pairs only: the calibration
    groups as they are, then every query (calibration and head) against a random draw of passages
    from both pools, so ranking within a group is still the target."""
    rng = random.Random(seed)
    calibration = load_calibration_pairs()
    head = [json.loads(line) for line in HEAD_PAIRS.read_text().splitlines() if line.strip()]
    passages = [pair.passage for pair in calibration] + [row["passage"] for row in head]
    queries = list(dict.fromkeys([pair.query for pair in calibration] + [row["query"] for row in head]))
    pairs = list(calibration)
    for index, query in enumerate(queries):
        for passage in rng.sample(passages, 30):
            pairs.append(ValidationPair(f"mix:{index}", query, passage, "calibration", "mixed"))
    return pairs


def _groups(inputs: ValidationInputs) -> list[list[int]]:
    members: dict[str, list[int]] = defaultdict(list)
    for index, group in enumerate(inputs.groups):
        members[group].append(index)
    return list(members.values())


def _batch(inputs: ValidationInputs, rows: list[int]) -> dict[str, torch.Tensor]:
    encoded = [inputs.rows[index] for index in rows]
    length = min(TRAIN_MAX_LENGTH, max(len(row.ids) for row in encoded))
    ids = torch.zeros((len(rows), length), dtype=torch.long)
    mask = torch.zeros_like(ids)
    types = torch.zeros_like(ids)
    for at, row in enumerate(encoded):
        n = min(length, len(row.ids))
        ids[at, :n] = torch.tensor(row.ids[:n])
        mask[at, :n] = 1
        types[at, :n] = torch.tensor(row.type_ids[:n])
        if n < len(row.ids):
            ids[at, n - 1] = row.ids[-1]  # keep the [SEP] that truncation keeps
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}


def _steps(groups: list[list[int]], steps: int, rng: random.Random) -> Iterator[list[int]]:
    order: list[list[int]] = []
    for _ in range(steps):
        if not order:
            order = list(groups)
            rng.shuffle(order)
        group = order.pop()
        yield sorted(rng.sample(group, min(GROUP_ROWS, len(group))))


def distill(model: nn.Module, teacher: nn.Module, train: ValidationInputs, wrapped: list[QuantLinear],
            *, steps: int, lr: float, range_lr: float, listwise: float, temperature: float,
            seed: int) -> list[float]:
    """Train weights and ranges against the teacher's logits; returns the loss per step."""
    rng = random.Random(seed)
    # Adam steps are about lr in size whatever a parameter's magnitude: each input range learns at
    # range_lr times its own width (a share of itself per step), weight scales in log space
    range_groups: list[dict[str, Any]] = [{"params": [module.a_low, module.a_high],
                     "lr": range_lr * float(module.a_high - module.a_low)} for module in wrapped]
    log_scales = [module.w_log_scale for module in wrapped]
    ids = {id(p) for group in range_groups for p in group["params"]} | {id(p) for p in log_scales}
    weights = [p for p in model.parameters() if id(p) not in ids]
    optimizer = torch.optim.AdamW([{"params": weights, "lr": lr}, {"params": log_scales, "lr": range_lr},
                                   *range_groups], weight_decay=0.0)
    model.train()
    _set(wrapped, enabled=True)
    losses = []
    for step, rows in enumerate(_steps(_groups(train), steps, rng)):
        batch = _batch(train, rows)
        with torch.no_grad():
            target = teacher(**batch).logits.float()[:, 0]
        student = model(**batch).logits.float()[:, 0]
        loss = nn.functional.mse_loss(student, target)
        if listwise:
            loss = loss + listwise * temperature ** 2 * nn.functional.kl_div(
                torch.log_softmax(student / temperature, 0), torch.log_softmax(target / temperature, 0),
                log_target=True, reduction="sum")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if step % 10 == 0:
            logger.info("step %d loss %.5f", step, float(loss))
    model.eval()
    return losses


def export_openvino(model: nn.Module, wrapped: list[QuantLinear], out: Path) -> Path:
    """OpenVINO IR of the fake-quantized model (FakeQuantize nodes, int8 on CPU)."""
    import openvino as ov

    _set(wrapped, export=True, enabled=True)
    example = {"input_ids": torch.ones((2, 16), dtype=torch.long),
               "attention_mask": torch.ones((2, 16), dtype=torch.long),
               "token_type_ids": torch.zeros((2, 16), dtype=torch.long)}
    with torch.no_grad():
        converted = ov.convert_model(_Logits(model).eval(), example_input=example,
                                     input=[(name, ov.PartialShape([-1, -1]), ov.Type.i64)
                                            for name in example])
    converted.outputs[0].get_tensor().set_names({"logits"})
    path = out / "model_qat_int8.xml"
    ov.save_model(converted, path, compress_to_fp16=False)
    _set(wrapped, export=False)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description="Quantization-aware distillation study.")
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--which", choices=("all", "ffn"), default="all")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--range-lr", type=float, default=1e-3)
    parser.add_argument("--listwise", type=float, default=1.0, help="weight of the listwise KL")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--quantile", type=float, default=1.0, help="activation range init")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--float-cls", action="store_true",
                        help="position 0 ([CLS]) through every quantized linear in float")
    parser.add_argument("--rotate-down", type=int, default=0,
                        help="block size of a Hadamard rotation of each down-projection's input")
    parser.add_argument("--rotate-all", type=int, default=0,
                        help="the same rotation on every quantized linear's input")
    parser.add_argument("--no-rotate-context", action="store_true",
                        help="leave the attention output projection's input unrotated")
    parser.add_argument("--precision", choices=("int8", "int8+bf16"), default="int8",
                        help="how OpenVINO runs the IR (int8+bf16: what stays float runs in bf16)")
    parser.add_argument("--torch-eval", action="store_true", help="also score fake-quant in torch")
    parser.add_argument("--reference-cache", type=Path, default=None,
                        help="a .npy of the fp32 validation logits, written on first use")
    parser.add_argument("--out", type=Path, default=None, help="write the result JSON here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    from transformers import AutoModelForSequenceClassification

    started = time.perf_counter()
    task = export_task("rerank")
    tokenizer = args.checkpoint / "tokenizer.json"

    def encode(pairs: list[ValidationPair]) -> ValidationInputs:
        return encode_validation(pairs, tokenizer, task=task, max_length=512, pad_id=0)

    valid = encode(load_validation_pairs())
    train = encode(_training_pairs(args.seed))
    calibration = encode(load_calibration_pairs())
    teacher = AutoModelForSequenceClassification.from_pretrained(args.checkpoint).eval()
    cached = args.reference_cache
    if cached is not None and cached.exists() and len(np.load(cached)) == len(valid.rows):
        reference = np.load(cached)
    else:
        reference = run_batches(valid.batches(), _torch_run(teacher), len(valid.rows))
        if cached is not None:
            np.save(cached, reference)
    logger.info("reference done %.0f s", time.perf_counter() - started)
    student = AutoModelForSequenceClassification.from_pretrained(args.checkpoint).eval()
    wrapped = _wrap_linears(student, args.which, args.float_cls, args.rotate_down or args.rotate_all,
                            args.rotate_all, not args.no_rotate_context)
    _set(wrapped, enabled=False)
    run_batches(calibration.batches(), _torch_run(student), len(calibration.rows))
    for module in wrapped:
        module.calibrate(args.quantile)
    result: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()},
                              "train_pairs": len(train.rows)}
    thresholds = FidelityThresholds()

    def evaluate(label: str) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            path = export_openvino(student, wrapped, Path(scratch))
            runner = open_model_file(path, backend="openvino", precision=args.precision, threads=1)
            outputs = run_batches(valid.batches(), runner.run, len(valid.rows))
        metrics = compare(valid, reference, outputs)
        try:
            check_thresholds(task, {"ov_int8": metrics}, thresholds)
            verdict = "pass"
        except FidelityError as error:
            verdict = f"{str(error).count('threshold')} checks fail"
        summary = {part: {regime: {key: round(values[key], 4) for key in
                                   ("spearman", "spearman_per_query_mean", "top10_overlap")}
                          for regime, values in block["regimes"].items()}
                   for part, block in (("tuning", metrics), ("held_out", metrics["held_out"]))}
        result[label] = {"summary": summary, "verdict": verdict,
                         "seconds": round(time.perf_counter() - started, 1)}
        if args.torch_eval:
            _set(wrapped, enabled=True)
            fake = run_batches(valid.batches(), _torch_run(student), len(valid.rows))
            result[label]["torch_fake_quant_tuning"] = {
                key: round(compare(valid, reference, fake)[key], 4)
                for key in ("spearman", "spearman_per_query_mean", "top10_overlap")}
        logger.info("%s: %s", label, json.dumps(result[label]))

    evaluate("calibrated")
    if args.steps:
        train_started = time.perf_counter()
        losses = distill(student, teacher, train, wrapped, steps=args.steps, lr=args.lr,
                         range_lr=args.range_lr, listwise=args.listwise,
                         temperature=args.temperature, seed=args.seed)
        result["train_seconds"] = round(time.perf_counter() - train_started, 1)
        result["loss_first_last"] = [round(float(np.mean(losses[:10])), 5),
                                     round(float(np.mean(losses[-10:])), 5)]
        evaluate("distilled")
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
