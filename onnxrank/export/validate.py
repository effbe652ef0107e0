"""Fidelity of every exported variant against the PyTorch reference on the shipped validation pairs.

The ONNX side is tokenized exactly like the engine (the row encoder of the model's kind,
onnxrank.engine.kinds, on the exported tokenizer.json), run by the engine's execution loop
(onnxrank.engine.execution) through its runtime layer (`open_model_file`), so what is validated
is what runs. The PyTorch reference is fed
the *same* token ids, so a difference is the model's and never the tokenizer's.

The validation pairs are first-stage candidate lists (whole query groups of BM25 top-30) in two
parts and two regimes, each named by the file (onnxrank.export.validation_data): every choice an
export makes (the int8 ladders) looks at the ``tuning`` part only; the ``held_out`` part is text no
choice has seen, and every gate is checked on both, per regime (``short`` chunks, ``mixed``
lengths). Calibration uses a third, disjoint file (calibration_pairs.jsonl). The metrics and
thresholds are onnxrank.export.fidelity's; the model's task (onnxrank.export.tasks) says which
apply.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tokenizers import Tokenizer

from onnxrank.engine.batching import Batch, plan_batches
from onnxrank.engine.execution import RowPlan, run_in_order
from onnxrank.engine.kinds import row_encoder
from onnxrank.engine.recipe import PromptRecipe
from onnxrank.engine.rows import EncodedRow
from onnxrank.engine.runtime import pad_rows
from onnxrank.errors import FidelityError
from onnxrank.export.fidelity import TOP_K, FidelityThresholds
from onnxrank.options import field_flag

if TYPE_CHECKING:
    from onnxrank.export.tasks import ExportTask

logger = logging.getLogger(__name__)

BATCH_SIZE = 16
BATCH_EFFECT_SIZE = 64
# batch_dependence scores at most this many rows (evenly spaced): scoring each row alone took 54
# of a stand-in export's 70 s of int8 validation with all 528 rows
BATCH_EFFECT_ROWS = 128
# A batch holds at most batch_size x BATCH_ROW_TOKENS padded tokens (the engine's default budget:
# 16 rows of 512), so rows up to 512 tokens fill it and longer ones come fewer at a time.
# Attention's [rows, heads, length, length] tensors grow with the square of the padded length: on
# a 4-head tiny ModernBERT (8,192 positions, rows to ~2,200 tokens) onnxruntime took 3.9 GB for
# 16 rows and OpenVINO int8 4.3 GB for batch_dependence's 48 (results/export-runs.md, ModernBERT).
BATCH_ROW_TOKENS = 512
TUNING, HELD_OUT, CALIBRATION = "tuning", "held_out", "calibration"
PARTS = (TUNING, HELD_OUT)
# what a reranker is given (onnxrank.export.validation_data): chunks of one document, and lengths
# from a title to past the 512-token limit; every floor applies to each regime of each part
SHORT, MIXED = "short", "mixed"
REGIMES = (SHORT, MIXED)
# a subset (--validation-pairs N) holds out about a third of its groups, at least one
SUBSET_HELD_OUT_SHARE = 1 / 3
# a subset cuts each of its groups to the first pairs of the group's BM25 list, at least this many:
# a group's top ten (fidelity.TOP_K) is still picked from twice as many candidates
SUBSET_MIN_GROUP_PAIRS = 2 * TOP_K
VALIDATION_FILE = "validation_pairs.jsonl"
CALIBRATION_FILE = "calibration_pairs.jsonl"


@dataclass(frozen=True, slots=True)
class ValidationPair:
    """One (query, passage) pair of the validation (or calibration) set and its query group.

    Attributes:
        group: "collection:query id".
        query: Query text.
        passage: Passage text.
        part: ``tuning`` or ``held_out`` for validation pairs, ``calibration`` for calibration pairs.
        regime: ``short`` or ``mixed`` (REGIMES): the passages' lengths.
    """

    group: str
    query: str
    passage: str
    part: str = TUNING
    regime: str = SHORT


def _read_pairs(file_name: str) -> list[dict[str, Any]]:
    text = resources.files("onnxrank.data").joinpath(file_name).read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def load_validation_pairs(limit: int | None = None, *, part: str | None = None) -> list[ValidationPair]:
    """The shipped validation pairs, each marked with its part (tuning or held_out).

    Args:
        limit: None = all the shipped pairs. Else about `limit` pairs: query groups spread evenly
            over each part, about a third of them held out and at least one group of each part
            (so a quick trial still checks held-out text), each cut to the first pairs of its
            BM25 list (the file's order), at least SUBSET_MIN_GROUP_PAIRS. Each part alternates
            regimes, short first, so two groups are short passages only and four or more hold
            both. For example 48 pairs: the first 24 of a tuning and of a held-out group.
        part: Only the pairs of this part (``tuning`` or ``held_out``); None = both.

    Raises:
        ValueError: `limit` is below 1 or `part` is unknown.
    """
    if part is not None and part not in PARTS:
        raise ValueError(f"part must be one of {', '.join(PARTS)} or None, got {part!r}")
    rows = _read_pairs(VALIDATION_FILE)
    pairs = [ValidationPair(row["group"], row["query"], row["passage"], row["part"], row["regime"])
             for row in rows]
    if limit is not None:
        if limit < 1:
            raise ValueError(f"validation pairs must be >= 1, got {limit}")
        groups = list(dict.fromkeys(pair.group for pair in pairs))
        wanted = min(len(groups), max(2, int(np.ceil(limit / (len(pairs) / len(groups))))))
        held_out_groups = {pair.group for pair in pairs if pair.part == HELD_OUT}
        held = [group for group in groups if group in held_out_groups]
        tuning = [group for group in groups if group not in held_out_groups]
        wanted_held = min(len(held), max(1, round(wanted * SUBSET_HELD_OUT_SHARE)))
        chosen = _spread(held, wanted_held) | _spread(tuning, max(1, wanted - wanted_held))
        per_group = max(SUBSET_MIN_GROUP_PAIRS, int(np.ceil(limit / wanted)))
        taken: dict[str, int] = {}
        subset = []
        for pair in pairs:
            if pair.group in chosen and taken.get(pair.group, 0) < per_group:
                taken[pair.group] = taken.get(pair.group, 0) + 1
                subset.append(pair)
        pairs = subset
    return [pair for pair in pairs if part is None or pair.part == part]


def _spread(groups: list[str], count: int) -> set[str]:
    """`count` evenly spaced groups, so a subset still mixes regimes, Cranfield and CACM."""
    count = min(count, len(groups))
    return {groups[int(i)] for i in np.linspace(0, len(groups) - 1, count).round()}


def load_calibration_pairs(limit: int | None = None) -> list[ValidationPair]:
    """The shipped calibration pairs: no query and no passage in common with the validation pairs.

    Args:
        limit: About this many pairs, as whole query groups spread over the file (at least one
            group); None = all of them.

    Raises:
        ValueError: `limit` is below 1.
    """
    pairs = [ValidationPair(row["group"], row["query"], row["passage"], CALIBRATION, row["regime"])
             for row in _read_pairs(CALIBRATION_FILE)]
    if limit is not None:
        if limit < 1:
            raise ValueError(f"calibration pairs must be >= 1, got {limit}")
        groups = list(dict.fromkeys(pair.group for pair in pairs))
        chosen = _spread(groups, max(1, round(limit / (len(pairs) / len(groups)))))
        pairs = [pair for pair in pairs if pair.group in chosen]
    return pairs


def length_batches(rows: Sequence[EncodedRow], pad_id: int,
                   batch_size: int = BATCH_SIZE) -> RowPlan:
    """Rows sorted by length (stable) and cut into consecutive batches of `batch_size` (fewer
    where rows are longer than BATCH_ROW_TOKENS), each padded to its longest row: the batches
    every variant's numbers were measured on."""
    order = np.argsort([len(row.ids) for row in rows], kind="stable")
    in_order = _consecutive([rows[index] for index in order], pad_id, batch_size)
    return RowPlan(rows, [Batch(rows=order[batch.rows], padded_length=batch.padded_length)
                          for batch in in_order.batches], pad_id)


def _consecutive(rows: Sequence[EncodedRow], pad_id: int, batch_size: int) -> RowPlan:
    """Rows in input order, cut into consecutive batches of `batch_size` rows and at most
    `batch_size` x BATCH_ROW_TOKENS padded tokens (a longer row alone gets a batch of one)."""
    lengths = [len(row.ids) for row in rows]
    batches = plan_batches(lengths, max_batch_tokens=BATCH_ROW_TOKENS * batch_size,
                           max_batch_size=batch_size, sort_by_length=False)
    return RowPlan(rows, batches, pad_id)


def run_batches(batches: RowPlan, run: Callable[[dict[str, np.ndarray]], np.ndarray],
                total: int) -> np.ndarray:
    """Every row's outputs in row order, float32 [total, ...], through the engine's execution
    loop; non-finite outputs come back as they are, for the metrics to judge.

    Raises:
        ValueError: `total` is not the plan's row count, or there are no rows.
    """
    if total != len(batches.rows):
        raise ValueError(f"total must be the plan's {len(batches.rows)} rows, got {total}")
    return run_in_order(batches, run, finite=None)


@dataclass(frozen=True, slots=True)
class ValidationInputs:
    """Encoded validation rows for one model, shared by the reference and every variant.

    Attributes:
        task: The model's task: how pairs became rows and which metrics judge them.
        rows: Encoded rows.
        groups: Query group per pair.
        parts: Part (tuning or held_out) per pair.
        regimes: Regime (short or mixed) per pair.
        pair_rows: (query row, passage row) per pair when a row is one text (embedding), else empty.
        pad_id: Padding token id.
    """

    task: ExportTask
    rows: list[EncodedRow]
    groups: list[str]
    parts: list[str]
    regimes: list[str]
    pair_rows: list[tuple[int, int]]
    pad_id: int

    def batches(self, batch_size: int = BATCH_SIZE) -> RowPlan:
        """Length-sorted batches of all rows (length_batches)."""
        return length_batches(self.rows, self.pad_id, batch_size)

    def padded_batches(self, batch_size: int = BATCH_SIZE) -> list[dict[str, np.ndarray]]:
        """The length-sorted batches as padded inputs (calibration data)."""
        plan = self.batches(batch_size)
        return [pad_rows([self.rows[index] for index in batch.rows], self.pad_id,
                         batch.padded_length) for batch in plan.batches]

    def single_rows(self) -> list[dict[str, np.ndarray]]:
        """Every row as its own unpadded batch of one (calibration items)."""
        return [pad_rows([row], self.pad_id) for row in self.rows]


def encode_validation(
    pairs: Sequence[ValidationPair], tokenizer_path: Path, *, task: ExportTask, max_length: int,
    pad_id: int,
    prompt: dict[str, Any] | None = None,
) -> ValidationInputs:
    """Tokenize pairs the way the engine will (tokenizer.json, same truncation; a decoder
    reranker's `prompt` recipe with its default instruction)."""
    tokenizer = Tokenizer.from_file(str(tokenizer_path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    recipe = None if prompt is None else PromptRecipe.from_dict(
        prompt, origin="the export's prompt recipe")
    encoder = row_encoder(task.name, recipe, tokenizer, max_length)
    rows, pair_rows = task.validation_rows(encoder, [(pair.query, pair.passage) for pair in pairs])
    return ValidationInputs(task, rows, [pair.group for pair in pairs],
                            [pair.part for pair in pairs], [pair.regime for pair in pairs],
                            pair_rows, pad_id)


def _part_metrics(inputs: ValidationInputs, reference: np.ndarray, outputs: np.ndarray,
                  part: str) -> dict[str, Any]:
    """The part's metrics over all its pairs, and each regime's under ``regimes``."""

    def metrics(pairs: list[int]) -> dict[str, Any]:
        groups = [inputs.groups[index] for index in pairs]
        return inputs.task.metrics(reference, outputs, pairs, groups, inputs.pair_rows)

    pairs = [index for index, name in enumerate(inputs.parts) if name == part]
    regimes = {regime: [index for index in pairs if inputs.regimes[index] == regime]
               for regime in REGIMES}
    return {**metrics(pairs), "regimes": {regime: metrics(members)
                                          for regime, members in regimes.items() if members}}


def compare(inputs: ValidationInputs, reference: np.ndarray, outputs: np.ndarray) -> dict[str, Any]:
    """Fidelity of one variant's outputs against the reference outputs, per part and regime.

    Returns:
        The tuning part's metrics at the top level (what the ladders choose by; ``part`` says
        which part they are) and the held-out part's metrics under ``held_out``; each part's
        metrics per regime under ``regimes`` (the regimes its pairs hold).
    """
    present = [part for part in PARTS if part in inputs.parts]
    if not present:
        raise ValueError(f"no validation pairs of the parts {', '.join(PARTS)} to compare")
    metrics = {**_part_metrics(inputs, reference, outputs, present[0]), "part": present[0]}
    if present[1:]:
        metrics[HELD_OUT] = _part_metrics(inputs, reference, outputs, HELD_OUT)
    return metrics


def batch_dependence(run: Callable[[dict[str, np.ndarray]], np.ndarray],
                     inputs: ValidationInputs) -> dict[str, Any]:
    """Max |Δ| between scoring rows alone and in input-order batches of 64 (fewer where rows
    are longer than BATCH_ROW_TOKENS), over at most BATCH_EFFECT_ROWS rows spread evenly over
    the validation rows (their count is recorded beside it).

    Dynamic int8 computes activation scales per batch, so a row's score depends on its batch
    mates; static int8 (ov_int8) uses fixed scales, so only float rounding should remain.
    """
    rows = inputs.rows[::-(-len(inputs.rows) // BATCH_EFFECT_ROWS)]
    alone = run_in_order(_consecutive(rows, inputs.pad_id, 1), run, finite=None)
    together = run_in_order(_consecutive(rows, inputs.pad_id, BATCH_EFFECT_SIZE), run,
                            finite=None)
    return {"batch_1_vs_64_max_abs_diff": float(np.abs(alone - together).max()),
            "batch_1_vs_64_rows": len(rows)}


def threshold_failures(task: ExportTask, variant: str, metrics: dict[str, Any],
                       thresholds: FidelityThresholds) -> list[str]:
    """One message per metric of `variant` beyond its threshold, on either part, in any regime
    (a part without regimes is judged as a whole)."""
    if not metrics.get("validated", True):
        return []
    failures = []
    for part, values in ((metrics.get("part", TUNING), metrics), (HELD_OUT, metrics.get(HELD_OUT))):
        if not values or "pairs" not in values:
            continue
        judged = values.get("regimes") or {"": values}
        for regime, regime_values in judged.items():
            where = part.replace("_", "-") + (f", {regime}" if regime else "")
            for metric, direction, threshold, attribute in task.threshold_checks(thresholds, variant):
                value = regime_values[metric]
                bad = (value > threshold) if direction == "<=" else not (value >= threshold)
                if bad:
                    flag = field_flag(attribute)
                    failures.append(
                        f"variant {variant} ({where} pairs): {metric} = {value:.6g}, "
                        f"threshold {direction} {threshold:g} ({flag})"
                    )
    return failures


def check_thresholds(task: ExportTask, fidelity: dict[str, dict[str, Any]],
                     thresholds: FidelityThresholds) -> None:
    """Raise FidelityError naming every variant metric beyond its threshold, on either part.

    Raises:
        FidelityError: At least one validated variant misses a threshold.
    """
    failures = [message for variant, metrics in fidelity.items()
                for message in threshold_failures(task, variant, metrics, thresholds)]
    if failures:
        raise FidelityError(
            "exported variants failed validation against the PyTorch reference: "
            + "; ".join(failures)
            + ". Nothing was written; re-export without the failing variant (--variants) or relax "
            "the threshold flag if the loss is acceptable"
        )
