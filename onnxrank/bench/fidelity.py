"""How faithful each contender is to PyTorch fp32, and the Pareto verdict of the peers scenario.

Fidelity is read on the bench's own requests, the ones each contender was timed on: per query,
the Spearman correlation of its scores with sentence-transformers' PyTorch fp32 scores of the same
checkpoint, and the share of fp32's top 10 it keeps; both averaged over the queries
(onnxrank.export.fidelity.score_metrics, the export gate's metrics, with one group per query).

The verdict for a peer: is the engine faster at no lower fidelity? The engine has two rows: its
defaults and its faster float precision (onnxrank.bench.suite.test_peers), so a peer that keeps
fp32's fidelity meets the engine at fp32 too; the verdict is "yes" when either row is faster than
the peer at no lower fidelity (`frontier_verdict`), and it names the row. Each row against a peer:

1. Faster: the 95% interval of the median of per-query ratios (peer's time / engine's time) lies
   above 1 (its low end > 1). Without an interval (fewer than 6 queries) it is not known: "no".
2. No lower fidelity: the engine's mean per-query Spearman and top-10 overlap are each at most
   FIDELITY_TOLERANCES below the peer's (the tolerance is what one query's ranks can move on a
   40-query run, not a licence to lose accuracy).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from onnxrank.export.fidelity import score_metrics

# per-query Spearman and top-10 overlap: how far the engine's mean may fall below a peer's
FIDELITY_TOLERANCES = {"spearman": 0.002, "top10_overlap": 0.01}
REFERENCE = "st"  # the fp32 contender every fidelity is read against


def fidelity(reference: Sequence[np.ndarray], scores: Sequence[np.ndarray]) -> dict[str, Any]:
    """Per-query agreement of `scores` with `reference`, one array per query (same order).

    Returns:
        queries, the mean per-query Spearman, the mean and the worst top-10 overlap.

    Raises:
        ValueError: No queries, or a query's arrays differ in length.
    """
    if not reference or len(reference) != len(scores):
        raise ValueError(f"need the same number (>= 1) of reference and scored queries, got "
                         f"{len(reference)} and {len(scores)}")
    if any(len(left) != len(right) for left, right in zip(reference, scores)):
        raise ValueError("a query's reference and scores differ in length")
    groups = [str(query) for query, values in enumerate(reference) for _ in range(len(values))]
    metrics = score_metrics(np.concatenate(reference), np.concatenate(scores), groups)
    return {"queries": len(reference), "spearman": metrics["spearman_per_query_mean"],
            "top10_overlap": metrics["top10_overlap"],
            "top10_overlap_min": metrics["top10_overlap_min"]}


def pareto_verdict(ratio: Mapping[str, Any] | None, engine: Mapping[str, Any],
                   peer: Mapping[str, Any]) -> dict[str, Any]:
    """Whether the engine is faster than a peer at no lower fidelity (see the module docstring).

    Args:
        ratio: ratio_stats of "engine/peer" (peer's time / engine's time per query), or None.
        engine: The engine's `fidelity`.
        peer: The peer's `fidelity`.

    Returns:
        verdict ("yes" or "no"), faster and no_lower_fidelity (bools), and why (one line).
    """
    low = None if ratio is None else ratio.get("ci_low")
    faster = low is not None and low > 1.0
    if ratio is None:
        speed = "no ratio measured"
    elif low is None:
        speed = f"median {ratio['median']:.2f}x, too few queries for an interval"
    else:
        speed = f"interval {low:.2f}-{ratio['ci_high']:.2f}x {'>' if faster else 'not >'} 1"
    shortfalls = [f"{metric} {engine[metric]:.4f} < {peer[metric]:.4f} - {tolerance}"
                  for metric, tolerance in FIDELITY_TOLERANCES.items()
                  if engine[metric] < peer[metric] - tolerance]
    return {"verdict": "yes" if faster and not shortfalls else "no", "faster": faster,
            "no_lower_fidelity": not shortfalls,
            "why": "; ".join([speed, *(shortfalls or ["fidelity not lower"])])}


def frontier_verdict(rows: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """One peer's verdict over the engine's rows: "yes" when any row is faster at no lower
    fidelity.

    Args:
        rows: Each engine row's `pareto_verdict` against the peer, the default row first.

    Returns:
        verdict, by (the first row whose verdict is "yes", else None), why (that row's, else
        every row's) and rows (the argument).

    Raises:
        ValueError: No rows.
    """
    if not rows:
        raise ValueError("a verdict needs at least one engine row")
    by = next((name for name, row in rows.items() if row["verdict"] == "yes"), None)
    why = (rows[by]["why"] if by is not None
           else "; ".join(f"{name}: {row['why']}" for name, row in rows.items()))
    return {"verdict": "no" if by is None else "yes", "by": by, "why": why, "rows": dict(rows)}
