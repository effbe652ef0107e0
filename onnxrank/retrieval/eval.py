"""Retrieval evaluation: graded-relevance metrics (pure) and a runner over HybridRetriever modes.

Dataset format (as in /work/shared/data/*): ``corpus.jsonl`` ({"id", "title", "text"}),
``queries.jsonl`` ({"id", "text"}) and ``qrels.tsv`` (header, then query_id, doc_id, relevance).
nDCG uses exponential gain ``(2**grade - 1) / log2(rank + 1)`` (as in the reference figures in the
datasets' READMEs; identical to linear gain for binary judgments), a document is relevant when
its grade is > 0, MAP is computed over the top RECALL_DEPTH documents retrieved, and queries
without relevant documents are skipped.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxrank.rerankers.base import RerankBackend
from onnxrank.rerankers.local import LocalReranker
from onnxrank.rerankers.registry import as_backend
from onnxrank.retrieval.fusion import DEFAULT_FUSION, FUSIONS, FusionConfig
from onnxrank.retrieval.hybrid import DEFAULT_K, HybridRetriever, backend_model
from onnxrank.retrieval.results import LoadTimings

if TYPE_CHECKING:
    from onnxrank.engine.reranker import Reranker

logger = logging.getLogger(__name__)

EVAL_MODES = ("vector", "lexical", "hybrid", "hybrid+rerank")
FUSED_MODES = ("hybrid", "hybrid+rerank")
# Every fusion at its default settings, the default first: eval shows them side by side.
DEFAULT_EVAL_FUSIONS = tuple(
    FusionConfig(fusion=name) for name in sorted(FUSIONS, key=lambda name: name != DEFAULT_FUSION)
)
RECALL_DEPTH = 100
STAGES = ("lexical", "dense", "fusion", "rerank", "total")
NOT_RELEVANCE_NOTE = "not a relevance model"
# Fused candidates reranked per query. Eval retrieves RECALL_DEPTH (100) hits per query, where
# search's own default (max(5 * k, 50)) would rerank 500; 50 is what a deployment reranks.
DEFAULT_EVAL_RERANK_TOP_N = 50
# One chunk per abstract: Cranfield's and CACM's longest documents fit in 1000 words, and a
# qrels judgment is about a whole document.
EVAL_CHUNK_WORDS = 1000

Qrels = Mapping[str, Mapping[str, int]]


def ndcg_at_k(ranking: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    """nDCG@k with gain 2**grade - 1; 0.0 when nothing is relevant."""
    gains = [2 ** max(judged.get(doc_id, 0), 0) - 1 for doc_id in ranking[:k]]
    dcg = sum(gain / math.log2(rank + 1) for rank, gain in enumerate(gains, start=1))
    ideal = sorted((2**grade - 1 for grade in judged.values() if grade > 0), reverse=True)[:k]
    idcg = sum(gain / math.log2(rank + 1) for rank, gain in enumerate(ideal, start=1))
    return dcg / idcg if idcg > 0 else 0.0


def reciprocal_rank_at_k(ranking: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    """1 / rank of the first relevant document within the top k, else 0.0."""
    for rank, doc_id in enumerate(ranking[:k], start=1):
        if judged.get(doc_id, 0) > 0:
            return 1.0 / rank
    return 0.0


def recall_at_k(ranking: Sequence[str], judged: Mapping[str, int], k: int) -> float:
    """Share of the relevant documents found in the top k."""
    relevant = {doc_id for doc_id, grade in judged.items() if grade > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranking[:k])) / len(relevant)


def average_precision(ranking: Sequence[str], judged: Mapping[str, int]) -> float:
    """Mean of precision at each relevant document's rank, over all relevant documents (unretrieved
    ones count as 0), computed over the whole ranking given."""
    relevant = {doc_id for doc_id, grade in judged.items() if grade > 0}
    if not relevant:
        return 0.0
    found = 0
    total = 0.0
    for rank, doc_id in enumerate(ranking, start=1):
        if doc_id in relevant:
            found += 1
            total += found / rank
    return total / len(relevant)


def evaluate_rankings(
    rankings: Mapping[str, Sequence[str]], qrels: Qrels, *, k: int = 10
) -> dict[str, float]:
    """Mean nDCG@k, MRR@k, Recall@k, Recall@100 and MAP over the judged queries of `rankings`.

    Args:
        rankings: query id -> document ids, best first (at least 100 deep for Recall@100).
        qrels: query id -> document id -> grade.
        k: Cutoff of nDCG, MRR and Recall, e.g. 10.

    Returns:
        Metric name -> mean value (keys ``ndcg@10``, ``mrr@10``, ``recall@10``, ``recall@100``,
        ``map@100`` for k=10), plus ``queries``: how many were judged and scored.
    """
    per_query: dict[str, list[float]] = {
        f"ndcg@{k}": [],
        f"mrr@{k}": [],
        f"recall@{k}": [],
        f"recall@{RECALL_DEPTH}": [],
        f"map@{RECALL_DEPTH}": [],
    }
    for query_id, ranking in rankings.items():
        judged = qrels.get(query_id, {})
        if not any(grade > 0 for grade in judged.values()):
            continue
        per_query[f"ndcg@{k}"].append(ndcg_at_k(ranking, judged, k))
        per_query[f"mrr@{k}"].append(reciprocal_rank_at_k(ranking, judged, k))
        per_query[f"recall@{k}"].append(recall_at_k(ranking, judged, k))
        per_query[f"recall@{RECALL_DEPTH}"].append(recall_at_k(ranking, judged, RECALL_DEPTH))
        per_query[f"map@{RECALL_DEPTH}"].append(average_precision(ranking, judged))
    result = {name: float(np.mean(values)) if values else 0.0 for name, values in per_query.items()}
    result["queries"] = float(len(per_query[f"map@{RECALL_DEPTH}"]))
    return result


@dataclass(frozen=True, slots=True)
class Dataset:
    """A retrieval test collection."""

    name: str
    corpus_path: Path
    queries: dict[str, str]  # query id -> text, in file order
    qrels: dict[str, dict[str, int]]


def load_dataset(directory: str | Path) -> Dataset:
    """Read corpus.jsonl (path only), queries.jsonl and qrels.tsv from a dataset directory.

    Args:
        directory: The dataset directory, or the name of a shipped sample ("cranfield-sample").

    Raises:
        ValueError: A file is missing or malformed.
    """
    from onnxrank.data import resolve_dataset

    root = resolve_dataset(directory)
    paths = {name: root / name for name in ("corpus.jsonl", "queries.jsonl", "qrels.tsv")}
    for name, path in paths.items():
        if not path.is_file():
            raise ValueError(
                f"dataset {root} has no {name}; a dataset directory holds corpus.jsonl, "
                "queries.jsonl and qrels.tsv"
            )
    queries: dict[str, str] = {}
    for line_number, line in enumerate(paths["queries.jsonl"].read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                record = json.loads(line)
                queries[str(record["id"])] = str(record["text"])
            except (ValueError, KeyError) as err:
                raise ValueError(f"{paths['queries.jsonl']}:{line_number}: {err}") from err
    qrels: dict[str, dict[str, int]] = {}
    with open(paths["qrels.tsv"], encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle, delimiter="\t")
        header = next(reader, None)
        if header is None or header[:3] != ["query_id", "doc_id", "relevance"]:
            raise ValueError(
                f"{paths['qrels.tsv']} must start with the header "
                "query_id<TAB>doc_id<TAB>relevance, "
                f"got {header}"
            )
        for row in reader:
            if row:
                qrels.setdefault(row[0], {})[row[1]] = int(row[2])
    return Dataset(root.name, paths["corpus.jsonl"], queries, qrels)


@dataclass(frozen=True, slots=True)
class ModeResult:
    """Metrics and per-stage latency of one mode (and, for hybrid modes, one fusion)."""

    mode: str
    metrics: dict[str, float]
    latency_ms: dict[str, dict[str, float]]  # stage -> {"p50", "p95"}
    note: str = ""
    fusion: dict[str, Any] | None = None  # FusionConfig fields; None for vector and lexical

    @property
    def fusion_label(self) -> str:
        """``rrf k=60``, ``convex w=0.5``, or "" for a mode without fusion."""
        return "" if self.fusion is None else FusionConfig(**self.fusion).label


@dataclass(frozen=True, slots=True)
class EvalReport:
    """Everything `onnxrank eval` reports."""

    dataset: str
    index: str
    k: int
    queries: int
    embedder: str
    reranker: str | None  # the reranker's model (its backend name when it has none)
    rerank_top_n: int
    results: list[ModeResult] = field(default_factory=list)
    reranker_backend: str | None = None
    # One-off model loads before the first query (LoadTimings fields); never in latency_ms.
    load_ms: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)

    def to_markdown(self) -> str:
        """A markdown table, one row per mode."""
        k = self.k
        lines = [
            f"Dataset `{self.dataset}`, {self.queries} queries, embedder `{self.embedder}`"
            + (
                f", reranker `{self.reranker}` (top {self.rerank_top_n} fused candidates)"
                if self.reranker
                else ""
            )
            + ".",
            "",
            f"| mode | fusion | nDCG@{k} | MRR@{k} | R@{k} | R@{RECALL_DEPTH} | MAP@{RECALL_DEPTH} | "
            "p50 ms | p95 ms | note |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for result in self.results:
            metrics = result.metrics
            total = result.latency_ms["total"]
            lines.append(
                f"| {result.mode} | {result.fusion_label} | {metrics[f'ndcg@{k}']:.3f} | "
                f"{metrics[f'mrr@{k}']:.3f} | "
                f"{metrics[f'recall@{k}']:.3f} | {metrics[f'recall@{RECALL_DEPTH}']:.3f} | "
                f"{metrics[f'map@{RECALL_DEPTH}']:.3f} | {total['p50']:.1f} | "
                f"{total['p95']:.1f} | {result.note} |"
            )
        lines += [
            "",
            "Latency per stage, p50 / p95 ms (model loading excluded):",
            "",
            "| mode | fusion | " + " | ".join(STAGES) + " |",
            "| --- | --- |" + " --- |" * len(STAGES),
        ]
        for result in self.results:
            cells = [
                f"{result.latency_ms[stage]['p50']:.1f} / {result.latency_ms[stage]['p95']:.1f}"
                for stage in STAGES
            ]
            lines.append(f"| {result.mode} | {result.fusion_label} | " + " | ".join(cells) + " |")
        if self.load_ms:
            lines += ["", f"Before the first query: {LoadTimings(**self.load_ms).summary()}."]
        return "\n".join(lines) + "\n"

    def to_table(self) -> str:
        """A plain-text table for the terminal."""
        k = self.k
        header = (
            f"{'mode':<14} {'fusion':<13} {'nDCG@' + str(k):>8} {'MRR@' + str(k):>8} {'R@' + str(k):>7} "
            f"{'R@' + str(RECALL_DEPTH):>7} {'MAP@' + str(RECALL_DEPTH):>7} "
            f"{'p50 ms':>8} {'p95 ms':>8}  note"
        )
        rows = [header, "-" * len(header)]
        for result in self.results:
            metrics = result.metrics
            total = result.latency_ms["total"]
            rows.append(
                f"{result.mode:<14} {result.fusion_label:<13} {metrics[f'ndcg@{k}']:>8.3f} "
                f"{metrics[f'mrr@{k}']:>8.3f} "
                f"{metrics[f'recall@{k}']:>7.3f} {metrics[f'recall@{RECALL_DEPTH}']:>7.3f} "
                f"{metrics[f'map@{RECALL_DEPTH}']:>7.3f} {total['p50']:>8.1f} "
                f"{total['p95']:>8.1f}  {result.note}"
            )
        return "\n".join(rows)


def evaluate(
    retriever: HybridRetriever,
    dataset: Dataset,
    *,
    modes: Sequence[str] = EVAL_MODES,
    k: int = DEFAULT_K,
    reranker: RerankBackend | Reranker | str | None = None,
    rerank_top_n: int = DEFAULT_EVAL_RERANK_TOP_N,
    max_queries: int | None = None,
    fusions: Sequence[FusionConfig] = DEFAULT_EVAL_FUSIONS,
) -> EvalReport:
    """Run every judged query of `dataset` through each mode and score the document rankings.

    Hits are chunks; a document ranks where its best chunk ranks. Each mode retrieves
    RECALL_DEPTH chunks per query; "hybrid+rerank" reranks the top `rerank_top_n` fused ones.
    The hybrid modes run once per fusion in `fusions`, one result row each. Models are loaded
    (and timed, `EvalReport.load_ms`) before the first query, and each row first runs one
    untimed warm-up query, so the latencies hold neither loading nor first-run costs.

    Args:
        retriever: An open retriever over the dataset's corpus (source ids = corpus ids).
        dataset: Queries and judgments.
        modes: Any of vector, lexical, hybrid, hybrid+rerank.
        k: Cutoff of nDCG, MRR and Recall, e.g. 10.
        reranker: Needed for "hybrid+rerank": a backend (onnxrank.rerankers), a Reranker or a
            backend name. A backend that cannot rerank leaves the fused order (its metrics then
            equal hybrid's) and the mode's note says so.
        rerank_top_n: Fused candidates reranked per query, e.g. 50.
        max_queries: Evaluate only the first N judged queries (file order).
        fusions: Fusions the hybrid modes are evaluated with, e.g. rrf k=60 and convex w=0.5.

    Returns:
        The report.

    Raises:
        ValueError: Unknown mode, hybrid+rerank without a reranker, or no fusion for a hybrid mode.
    """
    unknown = [mode for mode in modes if mode not in EVAL_MODES]
    if unknown:
        raise ValueError(f"unknown eval modes {unknown}; allowed: {', '.join(EVAL_MODES)}")
    if "hybrid+rerank" in modes and reranker is None:
        raise ValueError("mode 'hybrid+rerank' needs a reranker (--reranker NAME)")
    if not fusions and any(mode in FUSED_MODES for mode in modes):
        raise ValueError("the hybrid modes need at least one fusion, got none")
    backend = None if reranker is None else as_backend(reranker)
    judged = [query_id for query_id in dataset.queries if dataset.qrels.get(query_id)]
    if max_queries is not None:
        judged = judged[:max_queries]
    load = retriever.preload(
        mode="lexical" if set(modes) <= {"lexical"} else "hybrid",
        reranker=backend if "hybrid+rerank" in modes else None,
    )
    runs = [
        (mode, fusion)
        for mode in modes
        for fusion in (fusions if mode in FUSED_MODES else [None])
    ]
    results = []
    for mode, fusion in runs:
        rankings: dict[str, list[str]] = {}
        timings: dict[str, list[float]] = {stage: [] for stage in STAGES}
        rerank = mode == "hybrid+rerank"
        options: dict[str, Any] = {
            "mode": "hybrid" if rerank else mode,
            "rerank": rerank,
            "reranker": backend,
            "rerank_top_n": rerank_top_n,
        }
        if fusion is not None:
            options.update(fusion.to_dict())
        if judged:
            # One untimed query first: the first onnxruntime run is a one-off cost, not
            # per-query latency.
            retriever.search_detailed(dataset.queries[judged[0]], RECALL_DEPTH, **options)
        unranked = 0
        for query_id in judged:
            result = retriever.search_detailed(dataset.queries[query_id], RECALL_DEPTH, **options)
            unranked += rerank and not any(hit.reranked for hit in result.hits)
            rankings[query_id] = list(dict.fromkeys(hit.source for hit in result.hits))
            stage_times = asdict(result.timings)
            for stage in STAGES[:-1]:
                timings[stage].append(stage_times[f"{stage}_ms"])
            timings["total"].append(sum(stage_times.values()))
        latency = {
            stage: {
                "p50": float(np.percentile(values, 50)) if values else 0.0,
                "p95": float(np.percentile(values, 95)) if values else 0.0,
            }
            for stage, values in timings.items()
        }
        notes = []
        if rerank and isinstance(backend, LocalReranker) and backend.relevance_trained is False:
            notes.append(NOT_RELEVANCE_NOTE)
        if unranked:
            notes.append(f"not reranked on {unranked} of {len(judged)} queries (see the log)")
        note = "; ".join(notes)
        results.append(ModeResult(
            mode,
            evaluate_rankings(rankings, dataset.qrels, k=k),
            latency,
            note,
            None if fusion is None else fusion.to_dict(),
        ))
        logger.info("eval %s %s %s: %s", dataset.name, mode, results[-1].fusion_label, results[-1].metrics)
    return EvalReport(
        dataset=dataset.name,
        index=str(retriever.store.index_dir),
        k=k,
        queries=len(judged),
        embedder=retriever.manifest.embedder.name,
        reranker=None if backend is None else (backend_model(backend) or backend.name),
        rerank_top_n=rerank_top_n,
        results=results,
        reranker_backend=None if backend is None else backend.name,
        load_ms=asdict(load),
    )
