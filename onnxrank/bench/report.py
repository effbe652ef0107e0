"""The run's outputs: summary.json, summary.md and PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

import json
import logging
import textwrap
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from onnxrank._optional import require
from onnxrank.bench.budgets import Verdict
from onnxrank.bench.contenders import describe_engine_options
from onnxrank.bench.fidelity import FIDELITY_TOLERANCES, REFERENCE
from onnxrank.bench.harness import ScenarioResult

logger = logging.getLogger(__name__)

SUMMARY_JSON = "summary.json"
SUMMARY_MARKDOWN = "summary.md"
PLOTS = {
    "latency": "latency.png",
    "max_batch_tokens": "throughput_vs_max_batch_tokens.png",
    "padding": "padding.png",
    "serving": "serving.png",
}
SERVING_LEVEL = "serving_c"  # closed-loop serving scenarios: serving_c1, serving_c4, ...


def _plotted(plot: str, result: ScenarioResult) -> bool:
    """Whether `result` feeds the plot named `plot` (a key of PLOTS)."""
    if result.status != "measured":
        return False
    if plot == "serving":
        return result.scenario.startswith(SERVING_LEVEL)
    return result.scenario == plot


def write_summary_json(path: Path, run: dict[str, Any], results: Sequence[ScenarioResult],
                       verdicts: Sequence[Verdict]) -> Path:
    """Write the run metadata, every result and every verdict as JSON."""
    payload = {
        "run": run,
        "results": [asdict(result) for result in results],
        "budgets": [
            {**asdict(verdict.budget), "device": verdict.device, "regime": verdict.regime,
             "measured": verdict.measured, "allowed": verdict.allowed, "verdict": verdict.verdict,
             "derivation": verdict.derivation}
            for verdict in verdicts
        ],
    }
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return path


def _capabilities(value: Any) -> str:
    return ", ".join(value) if isinstance(value, list) else str(value)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _ms(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def markdown_summary(run: dict[str, Any], results: Sequence[ScenarioResult],
                     verdicts: Sequence[Verdict]) -> str:
    """The human-readable report: setup, per-scenario tables, ratios, budget verdicts."""
    machine = run["machine"]
    lines = [
        f"# onnxrank bench: {run['model']['name']}{' (quick)' if run['quick'] else ''}",
        "",
        f"- Model: `{run['model']['path']}`: {run['model']['label']}",
        f"- Dataset: {run['dataset']}; {run['candidates']} candidates per query, seed {run['seed']}",
        f"- Machine: {machine['cpu_model']}, {machine['usable_cores']} usable cores; GPU: "
        f"{', '.join(machine['gpus']) or 'none'}; onnxruntime {machine['onnxruntime']} "
        f"({', '.join(machine['available_providers'])}); commit {machine['git_commit']}",
        f"- Machine class: **{run.get('machine_class', '?')}**, from the CPU flags (OpenVINO's CPU "
        f"capabilities: {_capabilities(machine.get('openvino_capabilities'))}); budgets of another "
        "class are reported, not enforced",
        f"- Threads: {run['threads']} for every runtime. Calibration: {run['calibration_ms']:.1f} "
        f"ms now vs {run['reference_ms']:.1f} ms on {run['reference_machine']}: latency budgets "
        f"x{run['scale']:.2f}",
        f"- Engine options: {describe_engine_options(run['engine_options'])} (every engine "
        "contender; a sweep varies its own setting on top)",
        "- Contenders ran interleaved query by query, in a new rotation on each; ratios are "
        "min/median/max over queries of (other's time / engine's time).",
        "- Budgets: " + ("enforced" if run.get("budgets_enforced", True) else
                         "reported, NOT enforced (quick run: it checks the suite, not the numbers)"),
        "",
    ]
    lines += ceiling_sections(run, results)
    lines += ["## Times", ""]
    rows = []
    for result in results:
        if result.scenario == "ceiling" and result.status == "measured":
            continue  # its own table above: products per second mean nothing as pairs/s
        if result.status != "measured":
            rows.append([result.scenario, result.regime, result.device, result.status,
                         "", "", "", "", ""])
            continue
        for name, contender in result.contenders.items():
            stats = contender["stats"]
            rows.append([
                result.scenario, result.regime, result.device, f"{name}: {contender['label']}",
                _ms(stats["p50_ms"]), _ms(stats["p95_ms"]), _ms(stats["p99_ms"]),
                f"{_ms(stats['min_ms'])} / {_ms(stats['max_ms'])}", f"{stats['pairs_per_s']:.1f}",
            ])
        rows += [[result.scenario, result.regime, result.device, f"{name}: {reason}",
                  "", "", "", "", ""] for name, reason in result.skipped.items()]
    lines += _table(["scenario", "regime", "device", "contender", "p50 ms", "p95 ms", "p99 ms",
                     "min / max ms", "pairs/s"], rows)
    lines += ["", "## Speed-up ratios (per query, interleaved)", "",
              "Each ratio stops being measured once the 95% interval of its median (order "
              "statistics, distribution-free) lies within ±5% of the median (a scenario whose "
              "budget judges a few percent asks for less: `settled` names the precision), after "
              "at least 6 queries (the fewest that give such an interval), or at its scenario's "
              "time cap; `queries` is how many it took.", ""]
    lines += _table(["scenario", "regime", "device", "faster/slower", "min", "median", "max",
                     "queries", "95% interval", "settled"], ratio_rows(results))
    lines += ["", "## Measurement: how many queries, why each comparison stopped", ""]
    lines += _table(["scenario", "regime", "device", "items", "seconds", "stopped"],
                    [[r.scenario, r.regime, r.device, str(r.measurement["items"]),
                      f"{r.measurement['elapsed_s']:.0f}", stop_text(r)]
                     for r in results if r.measurement])
    capped = [r for r in results if r.measurement.get("time_capped")]
    lines += ["", f"Time caps that bit: {len(capped)} of {sum(bool(r.measurement) for r in results)} "
              "measurements" + (": " + "; ".join(f"{r.scenario}/{r.regime}/{r.device}"
                                                 for r in capped) if capped else "") + "."]
    lines += peer_section(results)
    lines += agreement_section(results)
    lines += ["", "## Budgets", ""]
    lines += _table(
        ["budget", "device", "machine class", "measured", "allowed", "verdict",
         "allowed from the GEMM ceilings"],
        [[v.budget.describe(v.regime), v.device, ", ".join(v.budget.machine_classes) or "any",
          v.measured_text(), v.limit_text(), v.verdict,
          v.derivation or "-"]
         for v in verdicts],
    )
    plots = [f"![{name}]({file_name})" for name, file_name in PLOTS.items()
             if any(_plotted(name, r) for r in results)]
    if plots:
        lines += ["", "## Plots", "", *plots]
    return "\n".join(lines) + "\n"


def peer_section(results: Sequence[ScenarioResult]) -> list[str]:
    """The peer table: per regime and contender, time against the engine, fidelity to PyTorch
    fp32 on the queries it was timed on, and the Pareto verdict; skipped peers with the reason."""
    peers = [r for r in results if r.scenario == "peers" and r.status == "measured"]
    if not peers:
        return []
    tolerances = ", ".join(f"{metric} {value}" for metric, value in FIDELITY_TOLERANCES.items())
    lines = ["", "## Peers: time and fidelity", "",
             "Time: median over queries of (peer's time / engine's time), 95% interval; a peer in "
             "a child process is timed on its own compute, its pipe round trip given apart. "
             f"Fidelity against `{REFERENCE}` (PyTorch fp32 of the same checkpoint) on the queries "
             "each contender was timed on: mean per-query Spearman and top-10 overlap. Verdict: "
             "the engine, at its defaults or at its faster float precision (the row that says "
             "yes is named), faster (interval above 1) at no lower fidelity (each metric at most "
             f"{tolerances} below the peer's).", ""]
    rows = []
    for result in peers:
        for name, contender in result.contenders.items():
            ratio = result.ratios.get(f"engine/{name}")
            fidelity = result.fidelity.get(name, {})
            verdict = result.pareto.get(name)
            pipe = contender.get("pipe_round_trip_ms")
            rows.append([
                result.regime, f"{name}: {contender['label']}",
                "1" if ratio is None and name == "engine" else
                "-" if ratio is None else f"{ratio['median']:.2f}x [{interval_text(ratio)}]",
                _ms(contender["stats"]["p50_ms"]),
                f"{fidelity['spearman']:.4f}" if fidelity else "-",
                f"{fidelity['top10_overlap']:.3f}" if fidelity else "-",
                str(fidelity.get("queries", "-")),
                "-" if pipe is None else _ms(pipe["median"]),
                "reference" if name == REFERENCE else
                "-" if verdict is None else _verdict_text(verdict)])
        rows += [[result.regime, f"{name}: {reason}", "", "", "", "", "", "", "not measured"]
                 for name, reason in result.skipped.items()]
    lines += _table(["regime", "contender", "time vs engine", "p50 ms", "Spearman", "top-10",
                     "queries", "pipe ms", "engine faster at no lower fidelity"], rows)
    return lines


def _verdict_text(verdict: dict[str, Any]) -> str:
    """"**yes** by engine_float (why)", "**no** (why)"."""
    by = f" by {verdict['by']}" if verdict.get("by") else ""
    return f"**{verdict['verdict']}**{by} ({verdict['why']})"


def agreement_section(results: Sequence[ScenarioResult]) -> list[str]:
    """The top-10 agreements a scenario recorded in its contenders' rows (the retrieval
    cascade's: the cascade and late interaction against the cross-encoder alone)."""
    rows = [[result.scenario, result.device, f"{name}: {contender['label']}", other,
             _ms(contender["stats"]["p50_ms"]), f"{agreement['mean']:.2f}",
             f"{agreement['min']:.2f}", str(agreement["queries"])]
            for result in results if result.status == "measured"
            for name, contender in result.contenders.items()
            for other, agreement in contender.get("top10_agreement", {}).items()]
    if not rows:
        return []
    return ["", "## Top-10 agreement", "",
            "Per query, the share of a contender's top 10 that the other's top 10 also holds, "
            "over the queries both ran.", "",
            *_table(["scenario", "device", "contender", "against", "p50 ms", "mean", "min",
                     "queries"], rows)]


def interval_text(stats: dict[str, Any], scale: float = 1.0, unit: str = "") -> str:
    """"1.92-2.10" for a median's confidence interval (times `scale`, then `unit`), or why there
    is none."""
    if stats.get("ci_low") is None:
        return f"none: {stats['n']} too few"
    return f"{stats['ci_low'] * scale:.2f}-{stats['ci_high'] * scale:.2f}{unit}"


def ratio_rows(results: Sequence[ScenarioResult]) -> list[list[str]]:
    """One row per ratio: where, min/median/max, queries, interval and whether it is within its
    precision ("yes (±5%)")."""
    return [
        [result.scenario, result.regime, result.device, key, f"{ratio['min']:.2f}",
         f"**{ratio['median']:.2f}**", f"{ratio['max']:.2f}", str(ratio["n"]),
         interval_text(ratio) if "ci_low" in ratio else "-", _settled_text(ratio)]
        for result in results for key, ratio in result.ratios.items()
    ]


def _settled_text(ratio: dict[str, Any]) -> str:
    if "within" not in ratio:
        return "-"
    verdict = "yes" if ratio["within"] else "no"
    return verdict if "precision" not in ratio else f"{verdict} (±{ratio['precision']:.0%})"


def stop_text(result: ScenarioResult) -> str:
    """Why a measurement stopped, with the median time's interval when nothing was compared."""
    measurement = result.measurement
    median = measurement.get("median_time")
    if median is None:
        return str(measurement["stop"])
    return (f"{measurement['stop']}; median {median['median'] * 1000:.1f} ms per item, "
            f"interval {interval_text(median, 1000.0, ' ms')}")


def _ops(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e9:.1f}"


def ceiling_sections(run: dict[str, Any], results: Sequence[ScenarioResult]) -> list[str]:
    """Markdown: the GEMM ceiling per path and shape, then every contender's share of it."""
    lines = ["## Hardware ceiling (GEMM, GOP/s)", ""]
    ceiling = next((r for r in results if r.scenario == "ceiling" and r.status == "measured"),
                   None)
    if ceiling is None:
        lines += [f"Not measured: {run.get('ceiling_note') or 'the ceiling scenario did not run'}.",
                  ""]
    else:
        shapes = list(dict.fromkeys(c["settings"]["shape"] for c in ceiling.contenders.values()))
        paths = list(dict.fromkeys(c["settings"]["path"] for c in ceiling.contenders.values()))
        rate = {(c["settings"]["path"], c["settings"]["shape"]): c["stats"]["ops_per_s"]
                for c in ceiling.contenders.values()}
        dims = {c["settings"]["shape"]: c["settings"]["dims"] for c in ceiling.contenders.values()}
        precision = {c["settings"]["path"]: c["settings"]["precision"]
                     for c in ceiling.contenders.values()}
        rows = [[path, precision[path], *(_ops(rate.get((path, shape))) for shape in shapes)]
                for path in paths]
        lines += _table(["path", "precision", *(f"{shape} ({dims[shape]})" for shape in shapes)],
                        rows)
        lines += [""]
        lines += [f"- {name}: {reason}" for name, reason in ceiling.skipped.items()]
        lines += [""]
    lines += peak_section(run)
    share_rows = []
    for result in results:
        if result.scenario == "ceiling" or result.status != "measured":
            continue
        for name, contender in result.contenders.items():
            stats = contender["stats"]
            if "effective_ops_per_s" not in stats:
                continue
            share, of_peak = stats.get("ceiling_share"), stats.get("peak_share")
            share_rows.append([
                result.scenario, result.regime, result.device, name,
                str(stats.get("ceiling_precision") or "-"), _ops(stats["effective_ops_per_s"]),
                _ops(stats.get("ceiling_ops_per_s")),
                f"**{share:.0%}**" if share is not None else stats.get("ceiling_note", "-"),
                _ops(stats.get("peak_ops_per_s")), "-" if of_peak is None else f"{of_peak:.0%}",
            ])
    if share_rows:
        lines += ["## Share of the ceiling (effective model GOP/s over the best measured GEMM of "
                  "the contender's precision, and over the CPU's estimated peak)", ""]
        lines += _table(["scenario", "regime", "device", "contender", "precision",
                         "effective GOP/s", "GEMM ceiling GOP/s", "share", "peak GOP/s",
                         "share of peak"], share_rows)
        lines += [""]
    return lines


def peak_section(run: dict[str, Any]) -> list[str]:
    """Markdown: per precision, the best measured GEMM of any runtime beside the CPU's peak
    estimated from its instructions, and the one as a share of the other."""
    best = run.get("ceilings", {})
    cpu = run.get("cpu", {})
    peaks = cpu.get("peaks", {})
    lines = [f"Machine class **{run.get('machine_class', '?')}** (flags "
             f"{', '.join(cpu.get('class_flags', [])) or 'none'} from "
             f"{cpu.get('flags_source', '?')}). Peak = cores x clock x ops per cycle per core, "
             "an estimate from the instruction set (onnxrank/bench/machine.py gives the per-cycle "
             "numbers and their sources), not a measurement.", ""]
    rows = []
    for precision in ("int8", "bf16", "fp32"):
        measured, peak = best.get(precision), peaks.get(precision)
        if measured is None and peak is None:
            continue
        rate = None if peak is None else peak["ops_per_s"]
        rows.append([
            precision,
            "-" if measured is None else f"**{_ops(measured['ops_per_s'])}** ({measured['path']}, "
                                         f"{measured['shape']})",
            "-" if peak is None else f"{_ops(rate)} = {peak['formula']} ({peak['instruction']}; "
                                     f"clock: {peak['clock_source']})",
            "-" if measured is None or not rate else f"{measured['ops_per_s'] / rate:.0%}",
        ])
    lines += _table(["precision", "best measured GEMM GOP/s", "peak estimate GOP/s",
                     "measured / peak"], rows)
    return [*lines, ""]


def _candidates_per_query(result: ScenarioResult) -> int:
    return int(result.workload["pairs"]) // int(result.workload["queries"])


def _plot_latency(plt: Any, results: Sequence[ScenarioResult], title: str, path: Path) -> None:
    measured = [r for r in results if r.scenario == "latency" and r.status == "measured"]
    names = list(dict.fromkeys(name for r in measured for name in r.contenders))
    groups = [f"{r.regime}\n{r.device}" for r in measured]
    figure, axis = plt.subplots(figsize=(max(7.0, 1.9 * len(groups)), 5.0))
    width = 0.8 / max(1, len(names))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for offset, name in enumerate(names):
        color = colors[offset % len(colors)]
        present = [(index, r.contenders[name]["stats"]) for index, r in enumerate(measured)
                   if name in r.contenders]
        positions = [index + offset * width for index, _ in present]
        axis.bar(positions, [stats["p50_ms"] for _, stats in present], width, color=color,
                 label=f"{name} p50")
        axis.scatter(positions, [stats["p95_ms"] for _, stats in present], marker="_", s=250,
                     color="black", zorder=3, label="p95" if offset == 0 else None)
    axis.set_xticks([index + width * (len(names) - 1) / 2 for index in range(len(measured))])
    axis.set_xticklabels(groups)
    axis.set_ylabel(f"ms per query ({_candidates_per_query(measured[0])} candidates)")
    axis.set_ylim(bottom=0)
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=8, ncol=len(names) + 1, loc="upper center",
                bbox_to_anchor=(0.5, -0.13), frameon=False)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _plot_sweep(plt: Any, results: Sequence[ScenarioResult], title: str, path: Path) -> None:
    measured = [r for r in results if r.scenario == "max_batch_tokens" and r.status == "measured"]
    figure, axis = plt.subplots(figsize=(6.5, 4.5))
    highest = 0.0
    for result in measured:
        points = sorted(
            (contender["settings"]["max_batch_tokens"], contender["stats"]["pairs_per_s"])
            for contender in result.contenders.values()
        )
        axis.plot([x for x, _ in points], [y for _, y in points], marker="o",
                  label=f"{result.regime}, {result.device}")
        highest = max(highest, *(y for _, y in points))
    axis.set_xscale("log", base=2)
    ticks = sorted({contender["settings"]["max_batch_tokens"] for result in measured
                    for contender in result.contenders.values()})
    axis.set_xticks(ticks, [str(tick) for tick in ticks])
    axis.set_ylim(0, highest * 1.15)
    axis.set_xlabel("max_batch_tokens (max_batch_size not binding)")
    axis.set_ylabel("pairs/s (rerank_many)")
    axis.set_title(title, fontsize=9)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _plot_padding(plt: Any, results: Sequence[ScenarioResult], title: str, path: Path) -> None:
    measured = [r for r in results if r.scenario == "padding" and r.status == "measured"]
    figure, axes = plt.subplots(1, len(measured), figsize=(8.0 * len(measured), 4.5),
                                squeeze=False)
    for axis, result in zip(axes[0], measured):
        names = list(result.contenders)
        p50 = [result.contenders[name]["stats"]["p50_ms"] for name in names]
        axis.barh(names, p50, color=["tab:green"] + ["tab:gray"] * (len(names) - 1))
        for index, name in enumerate(names):
            ratio = result.ratios.get(f"{names[0]}/{name}")
            relative = f" ({ratio['median']:.2f}x the default's time)" if ratio else ""
            axis.text(p50[index], index, f" {p50[index]:.0f} ms{relative}", va="center",
                      fontsize=8)
        axis.set_xlabel(f"p50 ms per query ({_candidates_per_query(result)} candidates)")
        axis.set_title(f"{title}\n{result.regime}, {result.device}", fontsize=9)
        axis.invert_yaxis()
        axis.set_xlim(0, max(p50) * 1.6)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _plot_serving(plt: Any, results: Sequence[ScenarioResult], title: str, path: Path) -> None:
    """Per regime: pairs/s and p99 latency of each server against the closed-loop clients."""
    measured = [r for r in results if _plotted("serving", r)]
    regimes = list(dict.fromkeys(r.regime for r in measured))
    figure, axes = plt.subplots(len(regimes), 2, figsize=(11.0, 4.0 * len(regimes)),
                                squeeze=False)
    for row, regime in zip(axes, regimes):
        levels = sorted((int(r.scenario.removeprefix(SERVING_LEVEL)), r)
                        for r in measured if r.regime == regime)
        names = list(dict.fromkeys(name for _, r in levels for name, contender in
                                   r.contenders.items() if "p99_ms" in contender["stats"]))
        for name in names:
            points = [(clients, r.contenders[name]["stats"]) for clients, r in levels
                      if name in r.contenders]
            clients = [level for level, _ in points]
            row[0].plot(clients, [stats["pairs_per_s"] for _, stats in points], marker="o",
                        label=name)
            row[1].plot(clients, [stats["p99_ms"] / 1000.0 for _, stats in points], marker="o",
                        label=name)
        for axis, label in zip(row, ("pairs/s", "p99 latency, s")):
            axis.set_xscale("log", base=2)
            ticks = [level for level, _ in levels]
            axis.set_xticks(ticks, [str(tick) for tick in ticks])
            axis.set_xlabel("concurrent clients (closed loop)")
            axis.set_ylabel(label)
            axis.set_ylim(bottom=0)
            axis.set_title(f"{regime}", fontsize=9)
            axis.legend(fontsize=8)
    figure.suptitle(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_plots(directory: Path, results: Sequence[ScenarioResult], model_label: str) -> list[Path]:
    """PNG plots for the scenarios that were measured; returns the files written."""
    matplotlib = require("matplotlib", extra="bench")
    matplotlib.use("Agg")
    plt = require("matplotlib.pyplot", extra="bench")
    plotters = {"latency": (_plot_latency, "Latency p50 (bars) and p95 (marks) per regime"),
                "max_batch_tokens": (_plot_sweep, "Throughput vs max_batch_tokens"),
                "padding": (_plot_padding, "Padding strategies"),
                "serving": (_plot_serving, "Servers under closed-loop load")}
    written = []
    for plot, (plotter, title) in plotters.items():
        if any(_plotted(plot, r) for r in results):
            path = directory / PLOTS[plot]
            label = "\n".join(textwrap.wrap(model_label, 80))
            plotter(plt, results, f"{title}\n{label}", path)
            written.append(path)
    return written


def write_report(directory: Path, run: dict[str, Any], results: Sequence[ScenarioResult],
                 verdicts: Sequence[Verdict]) -> list[Path]:
    """Write summary.json, summary.md and the plots into `directory`; returns the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [write_summary_json(directory / SUMMARY_JSON, run, results, verdicts)]
    markdown = directory / SUMMARY_MARKDOWN
    markdown.write_text(markdown_summary(run, results, verdicts), encoding="utf-8")
    paths.append(markdown)
    label = run["model"]["label"] + ("; QUICK run: checks the suite, not the numbers"
                                     if run["quick"] else "")
    paths += write_plots(directory, results, label)
    logger.info("wrote %s", ", ".join(str(path) for path in paths))
    return paths

