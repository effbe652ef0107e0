"""Fidelity of every exported variant against the PyTorch reference on the shipped validation pairs.

The ONNX side is tokenized exactly like the engine (onnxrank.engine.tokenize.PairEncoder on the
exported tokenizer.json) and the PyTorch reference is fed the *same* token ids, so a difference is
the model's and never the tokenizer's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from onnxrank.engine.session import CPU_PROVIDER, session_options, usable_cpus
from onnxrank.engine.tokenize import EncodedRow, PairEncoder
from onnxrank.errors import FidelityError

logger = logging.getLogger(__name__)

BATCH_SIZE = 16
TOP_K = 10
BATCH_EFFECT_SIZE = 64


@dataclass(frozen=True, slots=True)
class ValidationPair:
    """One (query, passage) pair of the validation set and its query group."""

    group: str
    query: str
    passage: str


@dataclass(frozen=True, slots=True)
class FidelityThresholds:
    """Minimum fidelity per variant; a variant below any of them fails the export.

    Rerank models are judged on scores (logits); embedding models on the cosine between the
    variant's and the reference's embedding of each text.

    Attributes:
        fp32_max_abs_diff: Largest |logit difference| allowed for model.onnx.
        opt_max_abs_diff: Same for model_opt.onnx.
        int8_min_spearman: Rank correlation of int8 logits with the reference, over all pairs.
        int8_min_top10_overlap: Mean share of the reference top-10 per query kept by int8.
        fp16_max_abs_diff: Largest |logit difference| for model_fp16.onnx (when CPU can run it).
        embedding_min_cosine: Lowest per-text cosine for fp32, opt and fp16 embedding variants.
        int8_min_cosine: Lowest per-text cosine for the int8 embedding variant.
    """

    fp32_max_abs_diff: float = 1e-3
    opt_max_abs_diff: float = 1e-3
    int8_min_spearman: float = 0.98
    int8_min_top10_overlap: float = 0.9
    fp16_max_abs_diff: float = 5e-2
    embedding_min_cosine: float = 0.999
    int8_min_cosine: float = 0.98

    def checks(self, task: str, variant: str) -> list[tuple[str, str, float, str]]:
        """(metric, "<=" or ">=", threshold, attribute name) for one variant."""
        if task == "embedding":
            if variant == "int8":
                return [("cosine_min", ">=", self.int8_min_cosine, "int8_min_cosine")]
            return [("cosine_min", ">=", self.embedding_min_cosine, "embedding_min_cosine")]
        if variant == "int8":
            return [("spearman", ">=", self.int8_min_spearman, "int8_min_spearman"),
                    ("top10_overlap", ">=", self.int8_min_top10_overlap, "int8_min_top10_overlap")]
        name = f"{variant}_max_abs_diff"
        return [("max_abs_diff", "<=", float(getattr(self, name)), name)]


def load_validation_pairs(limit: int | None = None) -> list[ValidationPair]:
    """The shipped validation pairs, or whole query groups spread over the set totalling >= `limit`.

    Raises:
        ValueError: `limit` is below 1.
    """
    text = resources.files("onnxrank.data").joinpath("validation_pairs.jsonl").read_text("utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    pairs = [ValidationPair(row["group"], row["query"], row["passage"]) for row in rows]
    if limit is None:
        return pairs
    if limit < 1:
        raise ValueError(f"validation pairs must be >= 1, got {limit}")
    groups = list(dict.fromkeys(pair.group for pair in pairs))
    group_size = len(pairs) / len(groups)
    wanted = min(len(groups), max(1, int(np.ceil(limit / group_size))))
    # evenly spaced groups, so a subset still mixes Cranfield and CACM
    chosen = {groups[int(i)] for i in np.linspace(0, len(groups) - 1, wanted).round()}
    return [pair for pair in pairs if pair.group in chosen]


def _rank(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.arange(len(values), dtype=np.float64)
    # average the ranks of ties, as scipy.stats.rankdata does
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=ranks)
    return (sums / counts)[inverse]


def _pearson(left: np.ndarray, right: np.ndarray) -> float:
    if np.std(left) == 0 or np.std(right) == 0:
        return float("nan")
    return float(np.corrcoef(left, right)[0, 1])


def score_metrics(reference: np.ndarray, scores: np.ndarray, groups: Sequence[str]) -> dict[str, Any]:
    """max |Δ|, mean |Δ|, Pearson, Spearman and mean top-10 overlap per group of two score arrays."""
    reference = np.asarray(reference, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    group_array = np.asarray(groups)
    overlaps = []
    for group in dict.fromkeys(groups):
        members = np.flatnonzero(group_array == group)
        k = min(TOP_K, len(members))
        top_reference = set(members[np.argsort(-reference[members], kind="stable")[:k]])
        top_variant = set(members[np.argsort(-scores[members], kind="stable")[:k]])
        overlaps.append(len(top_reference & top_variant) / k)
    difference = np.abs(reference - scores)
    return {
        "pairs": int(len(reference)),
        "groups": len(overlaps),
        "max_abs_diff": float(difference.max()),
        "mean_abs_diff": float(difference.mean()),
        "pearson": _pearson(reference, scores),
        "spearman": _pearson(_rank(reference), _rank(scores)),
        "top10_overlap": float(np.mean(overlaps)),
        "reference_std": float(reference.std()),
    }


def pad_rows(rows: Sequence[EncodedRow], pad_id: int, input_names: Sequence[str]) -> dict[str, np.ndarray]:
    """Right-pad rows into one int64 batch holding `input_names`."""
    length = max(len(row.ids) for row in rows)
    ids = np.full((len(rows), length), pad_id, dtype=np.int64)
    types = np.zeros((len(rows), length), dtype=np.int64)
    mask = np.zeros((len(rows), length), dtype=np.int64)
    for index, row in enumerate(rows):
        ids[index, : len(row.ids)] = row.ids
        types[index, : len(row.ids)] = row.type_ids
        mask[index, : len(row.ids)] = 1
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    return {name: batch[name] for name in input_names}


def length_batches(
    rows: Sequence[EncodedRow], pad_id: int, input_names: Sequence[str], batch_size: int = BATCH_SIZE
) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """Rows sorted by length and cut into padded batches: (row indices, feeds) per batch."""
    order = np.argsort([len(row.ids) for row in rows], kind="stable")
    return [
        (order[start:start + batch_size],
         pad_rows([rows[i] for i in order[start:start + batch_size]], pad_id, input_names))
        for start in range(0, len(order), batch_size)
    ]


def run_batches(
    batches: Sequence[tuple[np.ndarray, dict[str, np.ndarray]]],
    run: Callable[[dict[str, np.ndarray]], np.ndarray],
    total: int,
) -> np.ndarray:
    """Run every batch and scatter the outputs back to row order."""
    outputs: np.ndarray | None = None
    for indices, feeds in batches:
        result = np.asarray(run(feeds), dtype=np.float32)
        if outputs is None:
            outputs = np.zeros((total, *result.shape[1:]), dtype=np.float32)
        outputs[indices] = result
    if outputs is None:
        raise ValueError("no validation rows to run")
    return outputs


def open_session(path: Path) -> ort.InferenceSession:
    """A CPU session with the engine's session options."""
    return ort.InferenceSession(str(path), sess_options=session_options(usable_cpus()),
                                providers=[CPU_PROVIDER])


def session_runner(session: ort.InferenceSession) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """A run(feeds) callable returning the session's first output."""
    output = session.get_outputs()[0].name
    declared = {node.name for node in session.get_inputs()}
    return lambda feeds: session.run([output], {k: v for k, v in feeds.items() if k in declared})[0]


@dataclass(frozen=True, slots=True)
class ValidationInputs:
    """Encoded validation rows for one model, shared by the reference and every variant.

    Attributes:
        task: ``rerank`` (rows are pairs) or ``embedding`` (rows are single texts).
        rows: Encoded rows.
        groups: Query group per pair.
        pair_rows: Embedding only: (query row, passage row) per pair.
        pad_id: Padding token id.
        input_names: Graph inputs.
    """

    task: str
    rows: list[EncodedRow]
    groups: list[str]
    pair_rows: list[tuple[int, int]]
    pad_id: int
    input_names: tuple[str, ...]

    def batches(self, batch_size: int = BATCH_SIZE) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
        """Length-sorted padded batches of all rows."""
        return length_batches(self.rows, self.pad_id, self.input_names, batch_size)


def encode_validation(
    pairs: Sequence[ValidationPair], tokenizer_path: Path, *, task: str, max_length: int,
    pad_id: int, input_names: tuple[str, ...],
) -> ValidationInputs:
    """Tokenize the validation pairs the way the engine will (tokenizer.json, same truncation)."""
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    groups = [pair.group for pair in pairs]
    if task == "rerank":
        rows = PairEncoder(tokenizer, max_length).encode([(p.query, p.passage) for p in pairs])
        return ValidationInputs(task, rows, groups, [], pad_id, input_names)
    texts = list(dict.fromkeys([p.query for p in pairs] + [p.passage for p in pairs]))
    position = {text: index for index, text in enumerate(texts)}
    tokenizer.enable_truncation(max_length)
    rows = [
        EncodedRow(np.asarray(e.ids, dtype=np.int64), np.asarray(e.type_ids, dtype=np.int64), i)
        for i, e in enumerate(tokenizer.encode_batch(texts))
    ]
    pair_rows = [(position[p.query], position[p.passage]) for p in pairs]
    return ValidationInputs(task, rows, groups, pair_rows, pad_id, input_names)


def compare(inputs: ValidationInputs, reference: np.ndarray, outputs: np.ndarray) -> dict[str, Any]:
    """Fidelity metrics of one variant's outputs against the reference outputs."""
    if inputs.task == "rerank":
        return score_metrics(reference[:, 0], outputs[:, 0], inputs.groups)
    cosines = np.sum(reference * outputs, axis=1) / (
        np.linalg.norm(reference, axis=1) * np.linalg.norm(outputs, axis=1)
    )
    queries = np.array([q for q, _ in inputs.pair_rows])
    passages = np.array([p for _, p in inputs.pair_rows])
    reference_similarity = np.sum(reference[queries] * reference[passages], axis=1)
    variant_similarity = np.sum(outputs[queries] * outputs[passages], axis=1)
    metrics = score_metrics(reference_similarity, variant_similarity, inputs.groups)
    metrics.update({
        "texts": int(len(reference)),
        "cosine_min": float(cosines.min()),
        "cosine_mean": float(cosines.mean()),
        "embedding_max_abs_diff": float(np.abs(reference - outputs).max()),
    })
    return metrics


def batch_dependence(session: ort.InferenceSession, inputs: ValidationInputs) -> dict[str, Any]:
    """Max |Δ| between scoring every row alone and in input-order batches of 64.

    Dynamic int8 computes activation scales per batch, so a row's score depends on its batch mates.
    """
    run = session_runner(session)
    alone = run_batches(
        [(np.array([i]), pad_rows([row], inputs.pad_id, inputs.input_names))
         for i, row in enumerate(inputs.rows)],
        run, len(inputs.rows))
    together = run_batches(
        [(np.arange(start, min(start + BATCH_EFFECT_SIZE, len(inputs.rows))),
          pad_rows(inputs.rows[start:start + BATCH_EFFECT_SIZE], inputs.pad_id, inputs.input_names))
         for start in range(0, len(inputs.rows), BATCH_EFFECT_SIZE)],
        run, len(inputs.rows))
    return {"batch_1_vs_64_max_abs_diff": float(np.abs(alone - together).max())}


def check_thresholds(task: str, fidelity: dict[str, dict[str, Any]], thresholds: FidelityThresholds) -> None:
    """Raise FidelityError naming every variant metric beyond its threshold.

    Raises:
        FidelityError: At least one validated variant misses a threshold.
    """
    failures = []
    for variant, metrics in fidelity.items():
        if not metrics.get("validated", True):
            continue
        for metric, direction, threshold, attribute in thresholds.checks(task, variant):
            value = metrics[metric]
            bad = (value > threshold) if direction == "<=" else not (value >= threshold)
            if bad:
                flag = "--" + attribute.replace("_", "-")
                failures.append(
                    f"variant {variant}: {metric} = {value:.6g}, threshold {direction} {threshold:g} "
                    f"({flag})"
                )
    if failures:
        raise FidelityError(
            "exported variants failed validation against the PyTorch reference: "
            + "; ".join(failures)
            + ". Nothing was written; re-export without the failing variant (--variants) or relax "
            "the threshold flag if the loss is acceptable"
        )
