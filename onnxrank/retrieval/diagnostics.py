"""Rerank diagnostics: what reranking did to each query's top 10, and whether it favours length.

`diagnose` runs each query twice through a HybridRetriever (fused, and reranked over the top
`rerank_top_n` fused candidates) and `write_report` writes report.md, report.json and two plots:
the distribution of rerank scores and mean score against document length (with the correlation,
so a length bias shows).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxrank._optional import require
from onnxrank.rerankers.local import LocalReranker
from onnxrank.rerankers.registry import as_backend
from onnxrank.retrieval.fusion import FusionConfig
from onnxrank.retrieval.hybrid import HybridRetriever, backend_model, default_rerank_top_n
from onnxrank.retrieval.results import LoadTimings

if TYPE_CHECKING:
    from onnxrank.engine.reranker import Reranker
    from onnxrank.rerankers.base import RerankBackend

logger = logging.getLogger(__name__)

TOP = 10
STAGES = ("lexical", "dense", "fusion", "rerank")
LENGTH_BINS = 10
SCORE_BINS = 30
NOT_RELEVANCE_WARNING = (
    "WARNING: reranker {name!r} is not relevance-trained (manifest relevance_trained=false): "
    "its scores are NOT relevance scores, and what reranking did here says nothing about quality"
)


@dataclass(frozen=True, slots=True)
class QueryDiagnosis:
    """One query: its fused and reranked top 10 (chunk ids) and what changed."""

    query_id: str
    query: str
    fused: list[str]
    reranked: list[str]
    fused_sources: list[str]
    reranked_sources: list[str]
    overlap: float  # |fused top 10 ∩ reranked top 10| / 10
    top1_changed: bool
    candidates: int  # candidates the backend scored
    stage_ms: dict[str, float]


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Everything `onnxrank diagnose` reports."""

    index: str
    reranker: str
    reranker_backend: str
    relevance_trained: bool | None
    rerank_top_n: int
    queries: list[QueryDiagnosis]
    scores: list[float]  # every scored candidate's rerank score
    lengths: list[int]  # its length in words (title + text)
    notes: list[str] = field(default_factory=list)
    # One-off model loads before the first query (LoadTimings fields); never in stage_ms.
    load_ms: dict[str, float] = field(default_factory=dict)
    fusion: dict[str, Any] = field(default_factory=lambda: FusionConfig().to_dict())

    @property
    def warning(self) -> str | None:
        """The not-a-relevance-model warning, when it applies."""
        if self.relevance_trained is False:
            return NOT_RELEVANCE_WARNING.format(name=self.reranker)
        return None

    def summary(self) -> dict[str, Any]:
        """Aggregates over all queries."""
        scored = [query for query in self.queries if query.candidates]
        stage = {
            name: _stats([query.stage_ms[name] for query in self.queries]) for name in (*STAGES, "total")
        }
        return {
            "queries": len(self.queries),
            "queries_reranked": len(scored),
            "mean_overlap_at_10": _mean([query.overlap for query in scored]),
            "top1_changed": sum(query.top1_changed for query in scored),
            "top1_changed_share": _mean([float(query.top1_changed) for query in scored]),
            "scored_candidates": len(self.scores),
            "score_mean": _mean(self.scores),
            "score_std": float(np.std(self.scores)) if self.scores else math.nan,
            "length_score_pearson": _pearson(self.lengths, self.scores),
            "length_score_spearman": _spearman(self.lengths, self.scores),
            "stage_ms": stage,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (report.json); NaN becomes null."""
        data = asdict(self)
        data["summary"] = self.summary()
        data["warning"] = self.warning
        return _json_safe(data)


def load_queries(path: str | Path, *, max_queries: int | None = None) -> list[tuple[str, str]]:
    """(id, text) pairs from a queries.jsonl ({"id", "text"} per line) or a text file (one query
    per line, numbered from 1).

    Raises:
        ValueError: Unreadable file, a malformed JSONL line, or no query.
    """
    source = Path(path)
    try:
        lines = source.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise ValueError(f"cannot read queries file {source}: {err}") from err
    queries: list[tuple[str, str]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if source.suffix == ".jsonl":
            try:
                record = json.loads(line)
                queries.append((str(record["id"]), str(record["text"])))
            except (ValueError, KeyError, TypeError) as err:
                raise ValueError(
                    f"{source}:{number}: each line must be a JSON object with id and text ({err})"
                ) from err
        else:
            queries.append((str(len(queries) + 1), line.strip()))
    if not queries:
        raise ValueError(f"queries file {source} holds no query")
    return queries if max_queries is None else queries[:max_queries]


def diagnose(
    retriever: HybridRetriever,
    queries: Sequence[tuple[str, str]],
    reranker: RerankBackend | Reranker | str,
    *,
    rerank_top_n: int | None = None,
    fusion: FusionConfig | None = None,
) -> Diagnosis:
    """Run each (query id, text) fused and reranked; collect the top 10s, scores and lengths.

    Models are loaded before the first query (timed apart: `Diagnosis.load_ms`), so the stage
    times hold no loading.

    Args:
        retriever: An open retriever.
        queries: (id, text) pairs.
        reranker: A backend, a Reranker or a backend name.
        rerank_top_n: Fused candidates reranked per query; default search's own for k=10.
        fusion: How the hybrid searches fuse; None uses the defaults.

    Returns:
        The diagnosis (write it with `write_report`).

    Raises:
        ValueError: No queries.
    """
    if not queries:
        raise ValueError("diagnose needs at least one query, got none")
    backend = as_backend(reranker)
    fusion = fusion or FusionConfig()
    top_n = rerank_top_n if rerank_top_n is not None else default_rerank_top_n(TOP)
    load = retriever.preload(mode="hybrid", reranker=backend)
    diagnoses, scores, lengths = [], [], []
    for query_id, text in queries:
        fused = retriever.search_detailed(text, TOP, mode="hybrid", **fusion.to_dict())
        reranked = retriever.search_detailed(
            text, top_n, mode="hybrid", rerank=True, reranker=backend, rerank_top_n=top_n,
            **fusion.to_dict(),
        )
        scored = [hit for hit in reranked.hits if hit.reranked and hit.rerank_score is not None]
        for hit in scored:
            scores.append(float(hit.rerank_score))  # type: ignore[arg-type]
            lengths.append(len(f"{hit.title} {hit.text}".split()))
        fused_ids = [hit.chunk_id for hit in fused.hits]
        reranked_ids = [hit.chunk_id for hit in reranked.hits[:TOP]]
        timings = asdict(reranked.timings)
        stage_ms = {name: timings[f"{name}_ms"] for name in STAGES}
        stage_ms["total"] = sum(stage_ms.values())
        diagnoses.append(QueryDiagnosis(
            query_id=query_id,
            query=text,
            fused=fused_ids,
            reranked=reranked_ids,
            fused_sources=[hit.source for hit in fused.hits],
            reranked_sources=[hit.source for hit in reranked.hits[:TOP]],
            overlap=len(set(fused_ids) & set(reranked_ids)) / TOP,
            top1_changed=bool(fused_ids and reranked_ids and fused_ids[0] != reranked_ids[0]),
            candidates=len(scored),
            stage_ms=stage_ms,
        ))
    relevance_trained = backend.relevance_trained if isinstance(backend, LocalReranker) else None
    notes = []
    unscored = sum(1 for query in diagnoses if not query.candidates)
    if unscored:
        notes.append(f"the {backend.name} reranker scored nothing on {unscored} of {len(diagnoses)} "
                     "queries (unavailable or failed; see the log); those queries are left out of "
                     "the overlap and top-1 figures")
    return Diagnosis(
        index=str(retriever.store.index_dir),
        reranker=backend_model(backend) or backend.name,
        reranker_backend=backend.name,
        relevance_trained=relevance_trained,
        rerank_top_n=top_n,
        queries=diagnoses,
        scores=scores,
        lengths=lengths,
        notes=notes,
        load_ms=asdict(load),
        fusion=fusion.to_dict(),
    )


def write_report(diagnosis: Diagnosis, out_dir: str | Path) -> list[Path]:
    """Write report.md, report.json, rerank_scores.png and score_vs_length.png into `out_dir`.

    Returns:
        The written paths.

    Raises:
        MissingDependencyError: matplotlib is not installed (extra "diagnose").
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "rerank_scores.png", out / "score_vs_length.png"]
    _plot_scores(diagnosis, paths[0])
    _plot_length(diagnosis, paths[1])
    (out / "report.json").write_text(json.dumps(diagnosis.to_dict(), indent=2, ensure_ascii=False) + "\n",
                                     encoding="utf-8")
    (out / "report.md").write_text(to_markdown(diagnosis), encoding="utf-8")
    return [out / "report.md", out / "report.json", *paths]


def to_markdown(diagnosis: Diagnosis) -> str:
    """The summary markdown (report.md)."""
    summary = diagnosis.summary()
    lines = [f"# Rerank diagnostics: `{diagnosis.reranker}` ({diagnosis.reranker_backend})", ""]
    if diagnosis.warning:
        lines += [f"> **{diagnosis.warning}**", ""]
    lines += [f"- {note}" for note in diagnosis.notes]
    lines += [
        f"Index `{diagnosis.index}`, {summary['queries']} queries "
        f"({summary['queries_reranked']} reranked), top {diagnosis.rerank_top_n} fused candidates "
        f"({FusionConfig(**diagnosis.fusion).label}) reranked per query.",
        "",
        "| measure | value |",
        "| --- | --- |",
        f"| mean overlap of fused and reranked top 10 | {_format(summary['mean_overlap_at_10'])} |",
        f"| reranking changed the top 1 | {summary['top1_changed']} of {summary['queries_reranked']} "
        f"queries ({_format(summary['top1_changed_share'], percent=True)}) |",
        f"| rerank scores (all scored candidates) | {summary['scored_candidates']}, mean "
        f"{_format(summary['score_mean'])}, std {_format(summary['score_std'])} |",
        f"| correlation of score with length in words | Pearson {_format(summary['length_score_pearson'])}, "
        f"Spearman {_format(summary['length_score_spearman'])} |",
        "",
        "Time per stage, ms (mean / p50 / p95):",
        "",
        "| stage | mean | p50 | p95 |",
        "| --- | --- | --- | --- |",
    ]
    for name, stats in summary["stage_ms"].items():
        lines.append(f"| {name} | {stats['mean']:.1f} | {stats['p50']:.1f} | {stats['p95']:.1f} |")
    lines += ["", f"Before the first query: {LoadTimings(**diagnosis.load_ms).summary()}."]
    lines += [
        "",
        "![rerank scores](rerank_scores.png) ![score vs length](score_vs_length.png)",
        "",
        "Per query (sources of the top 10, best first):",
        "",
        "| query | overlap@10 | top 1 changed | fused top 10 | reranked top 10 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for query in diagnosis.queries:
        lines.append(
            f"| {query.query_id}: {_cell(query.query)[:60]} | {query.overlap:.1f} | "
            f"{'yes' if query.top1_changed else 'no'} | {', '.join(query.fused_sources)} | "
            f"{', '.join(query.reranked_sources)} |"
        )
    return "\n".join(lines) + "\n"


def _title_suffix(diagnosis: Diagnosis) -> str:
    if diagnosis.relevance_trained is False:
        return "\nNOT relevance scores: stand-in model (relevance_trained=false)"
    return ""


def _pyplot() -> Any:
    matplotlib = require("matplotlib", extra="diagnose")
    matplotlib.use("Agg")  # files only; never a window
    return require("matplotlib.pyplot", extra="diagnose")


def _plot_scores(diagnosis: Diagnosis, path: Path) -> None:
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.2))
    if diagnosis.scores:
        axes.hist(diagnosis.scores, bins=SCORE_BINS, color="#4c72b0", edgecolor="white")
    else:
        axes.text(0.5, 0.5, "no candidate was scored", ha="center", va="center", transform=axes.transAxes)
    axes.set_xlabel(f"rerank score ({diagnosis.reranker_backend}: {diagnosis.reranker})")
    axes.set_ylabel("candidates")
    axes.set_title(
        f"Rerank scores of {len(diagnosis.scores)} candidates, {len(diagnosis.queries)} queries"
        + _title_suffix(diagnosis),
        fontsize=10,
        color="#b00000" if diagnosis.relevance_trained is False else "black",
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _plot_length(diagnosis: Diagnosis, path: Path) -> None:
    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 4.2))
    lengths = np.asarray(diagnosis.lengths, dtype=float)
    scores = np.asarray(diagnosis.scores, dtype=float)
    if len(scores):
        axes.scatter(lengths, scores, s=6, alpha=0.25, color="#999999", label="candidate")
        # Equal-count bins: collections are skewed, equal-width bins would leave most empty.
        edges = np.unique(np.quantile(lengths, np.linspace(0, 1, LENGTH_BINS + 1)))
        if len(edges) > 1:
            which = np.clip(np.searchsorted(edges, lengths, side="right") - 1, 0, len(edges) - 2)
            centres = [lengths[which == b].mean() for b in range(len(edges) - 1) if np.any(which == b)]
            means = [scores[which == b].mean() for b in range(len(edges) - 1) if np.any(which == b)]
            axes.plot(centres, means, marker="o", color="#c44e52", label="mean score per length decile")
        axes.legend(loc="best", fontsize=8)
    else:
        axes.text(0.5, 0.5, "no candidate was scored", ha="center", va="center", transform=axes.transAxes)
    summary = diagnosis.summary()
    axes.set_xlabel("candidate length (words, title + text)")
    axes.set_ylabel("rerank score")
    axes.set_title(
        f"Mean rerank score vs length: Pearson r = {_format(summary['length_score_pearson'])}, "
        f"Spearman = {_format(summary['length_score_spearman'])}" + _title_suffix(diagnosis),
        fontsize=10,
        color="#b00000" if diagnosis.relevance_trained is False else "black",
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def _stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"mean": math.nan, "p50": math.nan, "p95": math.nan}
    return {"mean": float(np.mean(values)), "p50": float(np.percentile(values, 50)),
            "p95": float(np.percentile(values, 95))}


def _pearson(x: Sequence[float], y: Sequence[float]) -> float:
    if len(x) < 2 or np.std(x) == 0 or np.std(y) == 0:
        return math.nan
    return float(np.corrcoef(np.asarray(x, dtype=float), np.asarray(y, dtype=float))[0, 1])


def _ranks(values: Sequence[float]) -> np.ndarray:
    """Average ranks (ties share their mean rank), as Spearman's coefficient needs."""
    array = np.asarray(values, dtype=float)
    order = np.argsort(array, kind="stable")
    ranks = np.empty(len(array))
    ranks[order] = np.arange(len(array), dtype=float)
    for value in np.unique(array):
        tied = array == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def _spearman(x: Sequence[float], y: Sequence[float]) -> float:
    if len(x) < 2:
        return math.nan
    return _pearson(list(_ranks(x)), list(_ranks(y)))


def _format(value: float, *, percent: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{100 * value:.0f} %" if percent else f"{value:.3f}"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
    return value
