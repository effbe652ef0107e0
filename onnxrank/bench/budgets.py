"""Performance budgets (onnxrank/bench/suite/budgets.toml): loading, checking, the verdict table.

Five kinds of budget, all per device class (``[[cpu]]``, ``[[cuda]]`` entries):

1. Ratio floors (``ratio = "engine/st"``, ``min_ratio = 2.5``): the median over items of the
   per-item speed-up, measured interleaved in the same process. Machine-independent.
2. Absolute latency ceilings (``p50_ms``, ``p95_ms``): set on a named reference machine and
   multiplied by ``scale = calibration_ms_now / calibration.reference_ms``, the time of a fixed
   single-core workload now versus on the reference machine (see environment.calibrate).
3. Share-of-ceiling floors (``min_ceiling_share = 0.4`` with a ``contender``): the contender's
   effective model ops/s over the GEMM ceiling of its precision, both measured in the same run.
4. Pareto verdicts (``pareto = "ct2"``, peers scenario): the engine, at its defaults or at its
   faster float precision, is faster than that peer (interval of the ratio above 1) at no lower
   fidelity to PyTorch fp32 (onnxrank.bench.fidelity);
   "not measured" when the peer's row was not (its environment missing), so it holds only where
   the row is measured.
5. Fidelity floors (``min_spearman = 0.99``, ``min_top10_overlap = 0.95``, peers scenario): a
   contender's mean per-query agreement with PyTorch fp32 on the queries it was timed on.

A ratio floor against a peer that computes in another precision (PyTorch fp32) can follow the
chip's own arithmetic instead of holding one number for a whole machine class:
``min_ratio = { base = 1.12, gemm_share = 0.5, ceilings = "best/fp32" }`` is the floor
``base / (1 - gemm_share + gemm_share / speedup)`` (Amdahl's law), where ``speedup`` is the best
GEMM ceiling this run measured over its fp32 one (CeilingScaling): ``base`` holds where both
compute alike, and ``gemm_share`` of the peer-relative time runs ``speedup`` times faster. So a
chip of the class whose int8 is only 1.15x its fp32 is held to less than one where it is 2x, and
a broken floor means the engine lost ground, not that the chip differs. A run without the
ceiling scenario reports such a floor as not enforced, with the reason.

A budget is enforced only for runs of the model it was set for (``model``; ``"*"`` means any):
latencies and model-vs-model ratios depend on model size, so a run on a tiny test model reports
them without enforcing them. An entry with a ``machine_class`` (``"avx2"``, or a list) holds on
machines of that class only (onnxrank.bench.machine): how fast the engine is against PyTorch or
fastembed depends on the instructions each runtime uses (AMX, VNNI, BF16), so those floors are set
per class and the others' are reported. Entries without one hold on every machine. A quick run
enforces none: its workloads are smaller than the ones the budgets were set for.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxrank._optional import require
from onnxrank.bench.ceiling import PRECISIONS
from onnxrank.bench.harness import ScenarioResult
from onnxrank.bench.machine import MACHINE_CLASSES

logger = logging.getLogger(__name__)

ANY_MODEL = "*"
# Fidelity floors of the peers scenario: the entry's key -> the metric of onnxrank.bench.fidelity
# (mean per query, against PyTorch fp32) that `contender` must reach.
FIDELITY_FLOORS = {"min_spearman": "spearman", "min_top10_overlap": "top10_overlap"}
ENTRY_KEYS = {"scenario", "regime", "contender", "p50_ms", "p95_ms", "ratio", "min_ratio",
              "min_ceiling_share", "pareto", "model", "machine_class", "note", *FIDELITY_FLOORS}
# Metrics that are floors (measured must be >= limit); the others are ceilings in ms.
FLOOR_METRICS = ("ratio", "ceiling_share", "pareto", *FIDELITY_FLOORS.values())
UNITS = {"ratio": "x", "ceiling_share": ""}  # fidelity: 4 decimals, pareto: yes/no, others: " ms"
# a pareto budget's measured value: 1 when the verdict is "yes", else 0; its limit is 1
PARETO_YES = 1.0
DEVICE_CLASSES = ("cpu", "cuda")
# The keys of a min_ratio that follows the GEMM ceilings, and the ceilings it may name.
SCALING_KEYS = ("base", "gemm_share", "ceilings")
BEST_CEILING = "best"
SCALING_EXAMPLE = 'min_ratio = { base = 1.12, gemm_share = 0.5, ceilings = "best/fp32" }'


class BudgetFileError(ValueError):
    """A budgets file that cannot be used: not TOML, no calibration, or a malformed entry (the
    message names the file, the entry and the key)."""


@dataclass(frozen=True, slots=True)
class CeilingScaling:
    """A ratio floor that follows the GEMM ceilings measured in the same run.

    The floor is ``base / (1 - gemm_share + gemm_share / speedup)`` with ``speedup`` = the
    `faster` ceiling over the `slower` one: ``base`` where both ceilings are equal, rising with
    ``speedup`` for the share of the time that is GEMM arithmetic (``gemm_share = 1``: the floor
    is ``base x speedup``).

    Attributes:
        base: The floor where the two ceilings are equal.
        gemm_share: Share, in (0, 1], of the peer-relative time that `speedup` shortens.
        faster: "best" (the fastest ceiling of any precision the run measured) or a precision.
        slower: The peer's precision, e.g. "fp32".
    """

    base: float
    gemm_share: float
    faster: str
    slower: str

    def formula(self, speedup: str | None = None) -> str:
        """``1.12 / (0.50 + 0.50 / 1.15)`` for a `speedup`, else with the ceilings it names."""
        speedup = speedup or f"({self.faster}/{self.slower} GEMM ceilings)"
        return f"{self.base:.2f} / ({1 - self.gemm_share:.2f} + {self.gemm_share:.2f} / {speedup})"

    def derive(self, ceilings: Mapping[str, Mapping[str, Any]],
               missing_note: str) -> tuple[float | None, str]:
        """The floor and how it was derived, or None and why it cannot be.

        Args:
            ceilings: The run's GEMM ceilings per precision (onnxrank.bench.ceiling.ceilings).
            missing_note: Why `ceilings` is empty, for the reason.
        """
        if not ceilings:
            return None, f"no GEMM ceiling was measured ({missing_note})"
        faster = (max(ceilings, key=lambda precision: ceilings[precision]["ops_per_s"])
                  if self.faster == BEST_CEILING else self.faster)
        missing = [precision for precision in (faster, self.slower) if precision not in ceilings]
        if missing:
            return None, f"no {' or '.join(missing)} GEMM ceiling was measured on this machine"
        rates = [ceilings[precision]["ops_per_s"] / 1e9 for precision in (faster, self.slower)]
        speedup = rates[0] / rates[1]
        limit = self.base / (1 - self.gemm_share + self.gemm_share / speedup)
        label = f"best ({faster})" if self.faster == BEST_CEILING else faster
        return limit, (f"{self.formula(f'{speedup:.2f}')}; {speedup:.2f} = {label} "
                       f"{rates[0]:.0f} / {self.slower} {rates[1]:.0f} GOP/s")


@dataclass(frozen=True, slots=True)
class Budget:
    """One limit on one metric of one scenario.

    Attributes:
        device: "cpu" or "cuda".
        scenario: Scenario name ("latency", "padding", ...).
        regime: Regime name, or None for every regime of the scenario.
        metric: "p50_ms", "p95_ms" (ceilings on `subject`'s latency), "ratio",
            "ceiling_share", "pareto", "spearman" or "top10_overlap" (floors).
        subject: The contender for latency and share metrics, the peer for pareto; "a/b" for a
            ratio.
        limit: Milliseconds on the reference machine, the minimum ratio or the minimum share.
        model: Model name the budget holds for, or "*".
        note: Why the budget is what it is.
        machine_classes: The machine classes it holds on; empty: every machine.
        scaling: For a ratio floor that follows the run's GEMM ceilings, how (`limit` is then
            its base); None: `limit` holds as it is.
    """

    device: str
    scenario: str
    regime: str | None
    metric: str
    subject: str
    limit: float
    model: str
    note: str = ""
    machine_classes: tuple[str, ...] = ()
    scaling: CeilingScaling | None = None

    def describe(self, regime: str) -> str:
        """Row label such as ``latency/short engine p50_ms`` for a result of `regime`."""
        return f"{self.scenario}/{self.regime or regime} {self.subject} {self.metric}"


@dataclass(frozen=True, slots=True)
class BudgetFile:
    """A parsed budgets file: reference calibration plus budgets."""

    path: Path
    reference_machine: str
    reference_ms: float
    budgets: tuple[Budget, ...]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of one budget on one result.

    Attributes:
        budget: The budget.
        device: Device of the result.
        regime: Regime of the result.
        measured: The measured value (None when it was not measured).
        allowed: The limit applied (latency limits scaled by the calibration, scaled floors
            derived from the run's GEMM ceilings); None when the ceilings it needs are missing.
        verdict: "ok", "FAIL", "not enforced: ..." or "not measured: ...".
        derivation: How a scaled floor was derived from the ceilings (``1.12 / (0.50 + 0.50 /
            1.15); 1.15 = best (int8) 200 / fp32 174 GOP/s``), its formula when it could not be;
            empty for the others.
    """

    budget: Budget
    device: str
    regime: str
    measured: float | None
    allowed: float | None
    verdict: str
    derivation: str = ""

    @property
    def is_floor(self) -> bool:
        """True for minimums (ratios, shares), False for latency ceilings."""
        return self.budget.metric in FLOOR_METRICS

    @property
    def failed(self) -> bool:
        """True when the budget was enforced and broken."""
        return self.verdict == "FAIL"

    def limit_text(self) -> str:
        """The limit as the tables show it: ``>= 2.50x``, ``<= 200.00 ms``, or ``>= not derived``
        for a scaled floor without the ceilings it follows (`derivation` gives its formula)."""
        sign = ">=" if self.is_floor else "<="
        return f"{sign} {'not derived' if self.allowed is None else self._with_unit(self.allowed)}"

    def measured_text(self) -> str:
        """The measured value as the tables show it, "-" when it was not measured."""
        return "-" if self.measured is None else self._with_unit(self.measured)

    def _with_unit(self, value: float) -> str:
        if self.budget.metric == "pareto":
            return "yes" if value >= PARETO_YES else "no"
        if self.budget.metric in FIDELITY_FLOORS.values():
            return f"{value:.4f}"
        return f"{value:.2f}{UNITS.get(self.budget.metric, ' ms')}"


def _read_toml(path: Path) -> dict[str, Any]:
    tomllib = require("tomllib" if sys.version_info >= (3, 11) else "tomli", extra="bench")
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"budgets file {path} does not exist; pass --budgets FILE") from err
    except tomllib.TOMLDecodeError as err:
        raise BudgetFileError(f"budgets file {path} is not valid TOML: {err}") from err


def _entry_budgets(path: Path, device: str, position: int, entry: dict[str, Any],
                   default_model: str) -> list[Budget]:
    where = f"{path} [[{device}]] entry {position + 1}"
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise BudgetFileError(f"{where} has unknown keys {sorted(unknown)}; allowed: "
                         f"{', '.join(sorted(ENTRY_KEYS))}")
    if "scenario" not in entry:
        raise BudgetFileError(f"{where} needs a scenario, e.g. scenario = \"latency\"")
    common: dict[str, Any] = {
        "device": device, "scenario": str(entry["scenario"]), "regime": entry.get("regime"),
        "model": str(entry.get("model", default_model)), "note": str(entry.get("note", "")),
        "machine_classes": _machine_classes(where, entry.get("machine_class", [])),
    }
    budgets = [
        Budget(metric=metric, subject=str(entry.get("contender", "engine")),
               limit=_number(where, metric, entry[metric]), **common)
        for metric in ("p50_ms", "p95_ms") if metric in entry
    ]
    if ("ratio" in entry) != ("min_ratio" in entry):
        raise BudgetFileError(f"{where}: ratio and min_ratio go together, e.g. ratio = \"engine/st\", "
                         "min_ratio = 2.5")
    if "ratio" in entry:
        ratio = str(entry["ratio"])
        if ratio.count("/") != 1:
            raise BudgetFileError(f"{where}: ratio must look like \"engine/st\", got {ratio!r}")
        floor = entry["min_ratio"]
        scaling = _scaling(where, floor) if isinstance(floor, dict) else None
        budgets.append(Budget(metric="ratio", subject=ratio, scaling=scaling,
                              limit=scaling.base if scaling else _number(where, "min_ratio", floor),
                              **common))
    if "min_ceiling_share" in entry:
        budgets.append(Budget(metric="ceiling_share", subject=str(entry.get("contender", "engine")),
                              limit=_number(where, "min_ceiling_share",
                                            entry["min_ceiling_share"]), **common))
    if "pareto" in entry:
        budgets.append(Budget(metric="pareto", subject=str(entry["pareto"]), limit=PARETO_YES,
                              **common))
    for key, metric in FIDELITY_FLOORS.items():
        if key in entry:
            floor = _number(where, key, entry[key])
            if not 0 < floor <= 1:
                raise BudgetFileError(f"{where}: {key} is a mean per-query agreement in (0, 1], "
                                      f"got {floor}")
            budgets.append(Budget(metric=metric, subject=str(entry.get("contender", "engine")),
                                  limit=floor, **common))
    if not budgets:
        raise BudgetFileError(f"{where} sets no limit; give p50_ms, p95_ms, ratio with min_ratio, "
                         f"min_ceiling_share, pareto, {' or '.join(FIDELITY_FLOORS)}")
    return budgets


def _number(where: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BudgetFileError(f"{where}: {key} must be a number, got {value!r}")
    return float(value)


def _scaling(where: str, table: dict[str, Any]) -> CeilingScaling:
    """A min_ratio given as a table: the floor that follows the run's GEMM ceilings."""
    if set(table) != set(SCALING_KEYS):
        raise BudgetFileError(
            f"{where}: a min_ratio table needs exactly the keys {', '.join(SCALING_KEYS)}, got "
            f"{', '.join(sorted(table)) or 'none'}; e.g. {SCALING_EXAMPLE}")
    base = _number(where, "min_ratio.base", table["base"])
    share = _number(where, "min_ratio.gemm_share", table["gemm_share"])
    if base <= 0 or not 0 < share <= 1:
        raise BudgetFileError(f"{where}: min_ratio needs base > 0 and 0 < gemm_share <= 1, got "
                              f"base = {base}, gemm_share = {share}")
    ceilings = table["ceilings"]
    faster, _, slower = str(ceilings).partition("/")
    if (not isinstance(ceilings, str) or faster not in (BEST_CEILING, *PRECISIONS)
            or slower not in PRECISIONS):
        raise BudgetFileError(
            f"{where}: min_ratio.ceilings must be \"FASTER/SLOWER\" with FASTER one of "
            f"{BEST_CEILING}, {', '.join(PRECISIONS)} and SLOWER one of {', '.join(PRECISIONS)}, "
            f"got {ceilings!r}")
    return CeilingScaling(base=base, gemm_share=share, faster=faster, slower=slower)


def _machine_classes(where: str, value: Any) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise BudgetFileError(f"{where}: machine_class must be a class name or a list of them, "
                         f"got {value!r}")
    unknown = [name for name in names if name not in MACHINE_CLASSES]
    if unknown:
        raise BudgetFileError(f"{where}: unknown machine_class {unknown}; choose from "
                         f"{', '.join(MACHINE_CLASSES)}")
    return tuple(names)


def load_budgets(path: str | Path) -> BudgetFile:
    """Parse and validate a budgets file.

    Raises:
        FileNotFoundError: The file does not exist.
        BudgetFileError: Invalid TOML, a missing calibration section, or a malformed entry
            (a ValueError).
        MissingDependencyError: Python < 3.11 without tomli.
    """
    path = Path(path)
    data = _read_toml(path)
    calibration = data.get("calibration", {})
    if "reference_ms" not in calibration:
        raise BudgetFileError(
            f"{path} needs [calibration] reference_ms (the calibration time on the reference "
            "machine); see onnxrank/bench/suite/budgets.toml"
        )
    unknown = set(data) - {"calibration", "model", *DEVICE_CLASSES}
    if unknown:
        raise BudgetFileError(f"{path} has unknown top-level keys {sorted(unknown)}; allowed: "
                         f"calibration, model, {', '.join(DEVICE_CLASSES)}")
    default_model = str(data.get("model", ANY_MODEL))
    budgets = [
        budget
        for device in DEVICE_CLASSES
        for position, entry in enumerate(data.get(device, []))
        for budget in _entry_budgets(path, device, position, entry, default_model)
    ]
    return BudgetFile(
        path=path,
        reference_machine=str(calibration.get("reference_machine", "unnamed")),
        reference_ms=_number(f"{path} [calibration]", "reference_ms",
                             calibration["reference_ms"]),
        budgets=tuple(budgets),
    )


def _measured(budget: Budget, result: ScenarioResult) -> tuple[float | None, str]:
    if budget.metric == "ratio":
        faster, slower = budget.subject.split("/")
        if budget.subject in result.ratios:
            return result.ratios[budget.subject]["median"], ""
        reason = result.skipped.get(slower) or result.skipped.get(faster) or "ratio not measured"
        return None, reason
    if budget.metric == "pareto":
        verdict = result.pareto.get(budget.subject)
        if verdict is None or verdict["verdict"] not in ("yes", "no"):
            return None, result.skipped.get(budget.subject) or (
                verdict["why"] if verdict else f"{budget.subject} not measured")
        return (PARETO_YES if verdict["verdict"] == "yes" else 0.0), ""
    if budget.metric in FIDELITY_FLOORS.values():
        row = result.fidelity.get(budget.subject)
        if row is None:
            return None, result.skipped.get(budget.subject, f"no fidelity of {budget.subject}")
        return row[budget.metric], ""
    if budget.subject not in result.contenders:
        return None, result.skipped.get(budget.subject, f"{budget.subject} not measured")
    stats = result.contenders[budget.subject]["stats"]
    if budget.metric == "ceiling_share":
        share = stats.get("ceiling_share")
        return share, "" if share is not None else stats.get("ceiling_note", "no ceiling share")
    return stats[budget.metric], ""


def check_budgets(
    budget_file: BudgetFile, result: ScenarioResult, *, model: str, scale: float,
    machine_class: str, not_enforced: str | None = None,
    ceilings: Mapping[str, Mapping[str, Any]] | None = None,
    ceiling_note: str = "the ceiling scenario did not run",
) -> list[Verdict]:
    """Verdicts of every budget that applies to `result`.

    1. The metric was not measured (baseline skipped, no ceiling): "not measured" with the reason.
    2. The budget's model is neither "*" nor `model`: reported, "not enforced".
    3. The budget names machine classes and `machine_class` is not one: reported, "not enforced".
    4. `not_enforced` is given (a quick run): reported, "not enforced: <not_enforced>".
    5. A floor that follows the GEMM ceilings, and `ceilings` lacks one it needs: reported,
       "not enforced" with the reason (`ceiling_note` when none was measured).
    6. Ratios and shares must be >= the floor (a scaled one derived from `ceilings`);
       latencies <= limit × `scale`.
    """
    verdicts = []
    for budget in budget_file.budgets:
        if (budget.device != result.device or budget.scenario != result.scenario
                or budget.regime not in (None, result.regime)):
            continue
        floor = budget.metric in FLOOR_METRICS
        allowed: float | None = budget.limit if floor else budget.limit * scale
        derivation = reason_not_derived = ""
        if budget.scaling is not None:
            allowed, derivation = budget.scaling.derive(ceilings or {}, ceiling_note)
            if allowed is None:
                reason_not_derived, derivation = derivation, budget.scaling.formula()
        measured, reason = _measured(budget, result)
        if measured is None:
            verdict = f"not measured: {reason}"
        elif budget.model not in (ANY_MODEL, model):
            verdict = (f"not enforced: budget is for model {budget.model!r}, this run used "
                       f"{model!r} (latencies and ratios depend on model size)")
        elif budget.machine_classes and machine_class not in budget.machine_classes:
            verdict = (f"not enforced: budget is for machine class "
                       f"{' or '.join(budget.machine_classes)}, this machine is {machine_class}")
        elif not_enforced is not None:
            verdict = f"not enforced: {not_enforced}"
        elif allowed is None:
            verdict = f"not enforced: the floor follows the GEMM ceilings, and {reason_not_derived}"
        elif floor:
            verdict = "ok" if measured >= allowed else "FAIL"
        else:
            verdict = "ok" if measured <= allowed else "FAIL"
        verdicts.append(Verdict(budget=budget, device=result.device, regime=result.regime,
                                measured=measured, allowed=allowed, verdict=verdict,
                                derivation=derivation))
    return verdicts


def verdict_table(verdicts: Sequence[Verdict]) -> str:
    """Plain-text table: scenario, device, machine class, measured, budget, verdict; a floor that
    follows the GEMM ceilings is marked [n], and a note below the table says how it was derived."""
    rows = [("scenario", "device", "class", "measured", "budget", "verdict")]
    notes: list[str] = []
    for verdict in verdicts:
        budget = verdict.budget
        limit = verdict.limit_text()
        if verdict.derivation:
            notes.append(f"[{len(notes) + 1}] {budget.describe(verdict.regime)}: budget = "
                         f"{verdict.derivation}")
            limit += f" [{len(notes)}]"
        rows.append((budget.describe(verdict.regime), verdict.device,
                     ",".join(budget.machine_classes) or "any", verdict.measured_text(), limit,
                     verdict.verdict))
    widths = [max(len(row[column]) for row in rows) for column in range(5)]
    return "\n".join([
        "  ".join(cell.ljust(width) for cell, width in zip(row[:5], widths)) + "  " + row[5]
        for row in rows
    ] + notes)
