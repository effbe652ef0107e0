"""Performance budgets (onnxrank/bench/suite/budgets.toml): loading, checking, the verdict table.

Three kinds of budget, all per device class (``[[cpu]]``, ``[[cuda]]`` entries):

1. Ratio floors (``ratio = "engine/st"``, ``min_ratio = 2.5``): the median over items of the
   per-item speed-up, measured interleaved in the same process. Machine-independent.
2. Absolute latency ceilings (``p50_ms``, ``p95_ms``): set on a named reference machine and
   multiplied by ``scale = calibration_ms_now / calibration.reference_ms``, the time of a fixed
   single-core workload now versus on the reference machine (see environment.calibrate).
3. Share-of-ceiling floors (``min_ceiling_share = 0.4`` with a ``contender``): the contender's
   effective model ops/s over the GEMM ceiling of its precision, both measured in the same run.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxrank._optional import require
from onnxrank.bench.harness import ScenarioResult
from onnxrank.bench.machine import MACHINE_CLASSES

logger = logging.getLogger(__name__)

ANY_MODEL = "*"
ENTRY_KEYS = {"scenario", "regime", "contender", "p50_ms", "p95_ms", "ratio", "min_ratio",
              "min_ceiling_share", "model", "machine_class", "note"}
# Metrics that are floors (measured must be >= limit); the others are ceilings in ms.
FLOOR_METRICS = ("ratio", "ceiling_share")
DEVICE_CLASSES = ("cpu", "cuda")


@dataclass(frozen=True, slots=True)
class Budget:
    """One limit on one metric of one scenario.

    Attributes:
        device: "cpu" or "cuda".
        scenario: Scenario name ("latency", "padding", ...).
        regime: Regime name, or None for every regime of the scenario.
        metric: "p50_ms", "p95_ms" (ceilings on `subject`'s latency), "ratio" or
            "ceiling_share" (floors).
        subject: The contender for latency and share metrics; "a/b" for a ratio.
        limit: Milliseconds on the reference machine, the minimum ratio or the minimum share.
        model: Model name the budget holds for, or "*".
        note: Why the budget is what it is.
        machine_classes: The machine classes it holds on; empty: every machine.
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
        allowed: The limit applied (latency limits scaled by the calibration).
        verdict: "ok", "FAIL", "not enforced: ..." or "not measured: ...".
    """

    budget: Budget
    device: str
    regime: str
    measured: float | None
    allowed: float
    verdict: str

    @property
    def is_floor(self) -> bool:
        """True for minimums (ratios, shares), False for latency ceilings."""
        return self.budget.metric in FLOOR_METRICS

    @property
    def failed(self) -> bool:
        """True when the budget was enforced and broken."""
        return self.verdict == "FAIL"


def _read_toml(path: Path) -> dict[str, Any]:
    tomllib = require("tomllib" if sys.version_info >= (3, 11) else "tomli", extra="bench")
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"budgets file {path} does not exist; pass --budgets FILE") from err
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"budgets file {path} is not valid TOML: {err}") from err


def _entry_budgets(path: Path, device: str, position: int, entry: dict[str, Any],
                   default_model: str) -> list[Budget]:
    where = f"{path} [[{device}]] entry {position + 1}"
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise ValueError(f"{where} has unknown keys {sorted(unknown)}; allowed: "
                         f"{', '.join(sorted(ENTRY_KEYS))}")
    if "scenario" not in entry:
        raise ValueError(f"{where} needs a scenario, e.g. scenario = \"latency\"")
    common: dict[str, Any] = {
        "device": device, "scenario": str(entry["scenario"]), "regime": entry.get("regime"),
        "model": str(entry.get("model", default_model)), "note": str(entry.get("note", "")),
        "machine_classes": _machine_classes(where, entry.get("machine_class", [])),
    }
    budgets = [
        Budget(metric=metric, subject=str(entry.get("contender", "engine")),
               limit=float(entry[metric]), **common)
        for metric in ("p50_ms", "p95_ms") if metric in entry
    ]
    if ("ratio" in entry) != ("min_ratio" in entry):
        raise ValueError(f"{where}: ratio and min_ratio go together, e.g. ratio = \"engine/st\", "
                         "min_ratio = 2.5")
    if "ratio" in entry:
        ratio = str(entry["ratio"])
        if ratio.count("/") != 1:
            raise ValueError(f"{where}: ratio must look like \"engine/st\", got {ratio!r}")
        budgets.append(Budget(metric="ratio", subject=ratio, limit=float(entry["min_ratio"]),
                              **common))
    if "min_ceiling_share" in entry:
        budgets.append(Budget(metric="ceiling_share", subject=str(entry.get("contender", "engine")),
                              limit=float(entry["min_ceiling_share"]), **common))
    if not budgets:
        raise ValueError(f"{where} sets no limit; give p50_ms, p95_ms, ratio with min_ratio, "
                         "or min_ceiling_share")
    return budgets


def _machine_classes(where: str, value: Any) -> tuple[str, ...]:
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise ValueError(f"{where}: machine_class must be a class name or a list of them, "
                         f"got {value!r}")
    unknown = [name for name in names if name not in MACHINE_CLASSES]
    if unknown:
        raise ValueError(f"{where}: unknown machine_class {unknown}; choose from "
                         f"{', '.join(MACHINE_CLASSES)}")
    return tuple(names)


def load_budgets(path: str | Path) -> BudgetFile:
    """Parse and validate a budgets file.

    Raises:
        FileNotFoundError: The file does not exist.
        ValueError: Invalid TOML, a missing calibration section, or a malformed entry.
        MissingDependencyError: Python < 3.11 without tomli.
    """
    path = Path(path)
    data = _read_toml(path)
    calibration = data.get("calibration", {})
    if "reference_ms" not in calibration:
        raise ValueError(
            f"{path} needs [calibration] reference_ms (the calibration time on the reference "
            "machine); see onnxrank/bench/suite/budgets.toml"
        )
    unknown = set(data) - {"calibration", "model", *DEVICE_CLASSES}
    if unknown:
        raise ValueError(f"{path} has unknown top-level keys {sorted(unknown)}; allowed: "
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
        reference_ms=float(calibration["reference_ms"]),
        budgets=tuple(budgets),
    )


def _measured(budget: Budget, result: ScenarioResult) -> tuple[float | None, str]:
    if budget.metric == "ratio":
        faster, slower = budget.subject.split("/")
        if budget.subject in result.ratios:
            return result.ratios[budget.subject]["median"], ""
        reason = result.skipped.get(slower) or result.skipped.get(faster) or "ratio not measured"
        return None, reason
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
) -> list[Verdict]:
    """Verdicts of every budget that applies to `result`.

    1. The metric was not measured (baseline skipped, no ceiling): "not measured" with the reason.
    2. The budget's model is neither "*" nor `model`: reported, "not enforced".
    3. The budget names machine classes and `machine_class` is not one: reported, "not enforced".
    4. `not_enforced` is given (a quick run): reported, "not enforced: <not_enforced>".
    5. Ratios and shares must be >= the floor; latencies <= limit × `scale`.
    """
    verdicts = []
    for budget in budget_file.budgets:
        if (budget.device != result.device or budget.scenario != result.scenario
                or budget.regime not in (None, result.regime)):
            continue
        floor = budget.metric in FLOOR_METRICS
        allowed = budget.limit if floor else budget.limit * scale
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
        elif floor:
            verdict = "ok" if measured >= allowed else "FAIL"
        else:
            verdict = "ok" if measured <= allowed else "FAIL"
        verdicts.append(Verdict(budget=budget, device=result.device, regime=result.regime,
                                measured=measured, allowed=allowed, verdict=verdict))
    return verdicts


def verdict_table(verdicts: Sequence[Verdict]) -> str:
    """Plain-text table: scenario, device, machine class, measured, budget, verdict."""
    rows = [("scenario", "device", "class", "measured", "budget", "verdict")]
    for verdict in verdicts:
        budget = verdict.budget
        unit = {"ratio": "x", "ceiling_share": ""}.get(budget.metric, " ms")
        sign = ">=" if verdict.is_floor else "<="
        measured = "-" if verdict.measured is None else f"{verdict.measured:.2f}{unit}"
        allowed = f"{sign} {verdict.allowed:.2f}{unit}"
        rows.append((budget.describe(verdict.regime), verdict.device,
                     ",".join(budget.machine_classes) or "any", measured, allowed,
                     verdict.verdict))
    widths = [max(len(row[column]) for row in rows) for column in range(5)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:5], widths)) + "  " + row[5]
        for row in rows
    )
