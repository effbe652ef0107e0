"""Fusion of the lexical and dense candidate lists (pure functions, no index).

Two methods, chosen per search (`FusionConfig`, one place for their defaults):

1. ``rrf``: reciprocal rank fusion, ``score = Σ 1 / (rrf_k + rank)`` over the lists a candidate is
   in. Ranks only, so the two score scales never meet.
2. ``convex``: a convex combination of per-query z-scores,
   ``score = (1 - fusion_weight) · z(bm25) + fusion_weight · z(cosine)``. Each side's scores are
   standardised over the candidates that side returned for this query; a candidate one side did
   not return gets that side's lowest z-score (its true score is at most the lowest one returned).
   This is Weaviate's relativeScoreFusion and Elasticsearch's linear retriever (min-max: the
   lowest returned score and a missing candidate both map to 0) with z-scores instead of
   min-max, so the scale comes from every returned score, not from the two extremes.

Ties (equal fused scores) break by the best single rank, then by the label, so the order is
deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

FUSIONS: tuple[str, ...] = ("rrf", "convex")
# Chosen on Cranfield and CACM (docs/retrieval.md, "Fusion"): RRF, k=60.
DEFAULT_FUSION = "rrf"
DEFAULT_RRF_K = 60
DEFAULT_FUSION_WEIGHT = 0.5

ScoredList = Sequence[tuple[int, float]]


def _option(help_text: str, *, kind: type, choices: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Field metadata read by the CLI's flag generator (onnxrank.cli.options)."""
    return {"help": help_text, "kind": kind, "choices": choices}


@dataclass(frozen=True, slots=True)
class FusionConfig:
    """How a hybrid search fuses its two candidate lists; every field has a CLI flag.

    Raises:
        ValueError: Unknown fusion, rrf_k < 1, or fusion_weight outside [0, 1].
    """

    fusion: str = field(default=DEFAULT_FUSION, metadata=_option(
        "how hybrid mode merges the lexical and vector lists: rrf (reciprocal rank, ranks only) or "
        "convex (weighted sum of per-query z-scores of bm25 and cosine)", kind=str, choices=FUSIONS))
    rrf_k: int = field(default=DEFAULT_RRF_K, metadata=_option(
        "rrf rank offset: with 60, a candidate 3rd in both lists (2/63) beats one 1st in a single "
        "list (1/61)", kind=int))
    fusion_weight: float = field(default=DEFAULT_FUSION_WEIGHT, metadata=_option(
        "convex weight of the vector side, 0 to 1: 0.5 weighs z(bm25) and z(cosine) equally, 0.7 "
        "gives the vector side 70 percent", kind=float))

    def __post_init__(self) -> None:
        if self.fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {', '.join(FUSIONS)}, got {self.fusion!r}")
        if isinstance(self.rrf_k, bool) or not isinstance(self.rrf_k, int) or self.rrf_k < 1:
            raise ValueError(f"rrf_k must be an int >= 1, got {self.rrf_k!r}")
        weight = self.fusion_weight
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0.0 <= weight <= 1.0:
            raise ValueError(f"fusion_weight must be a number from 0 to 1, got {weight!r}")

    @property
    def label(self) -> str:
        """Short name for tables: ``rrf k=60`` or ``convex w=0.5``."""
        if self.fusion == "rrf":
            return f"rrf k={self.rrf_k}"
        return f"convex w={self.fusion_weight:g}"

    def to_dict(self) -> dict[str, Any]:
        """The fields, for JSON payloads."""
        return {spec.name: getattr(self, spec.name) for spec in fields(self)}


@dataclass(frozen=True, slots=True)
class FusedCandidate:
    """One fused candidate and each side's term before weighting.

    ``lexical_normalized`` / ``dense_normalized``: 1 / (rrf_k + rank) for rrf (0.0 when that side
    did not return the candidate); the z-score for convex (that side's lowest z-score when it did
    not return the candidate, 0.0 when it returned nothing); None when that side did not run.
    """

    label: int
    score: float
    lexical_normalized: float | None
    dense_normalized: float | None


def zscores(scores: Sequence[float]) -> list[float]:
    """``(score - mean) / std`` (population std) in input order; all 0.0 when std is 0.

    Equal scores say nothing about order, so they contribute nothing to a fused score.
    """
    if not scores:
        return []
    mean = math.fsum(scores) / len(scores)
    std = math.sqrt(math.fsum((score - mean) ** 2 for score in scores) / len(scores))
    # Scores equal up to rounding (std tiny next to their size) are treated as equal.
    if std <= 1e-12 * max(1.0, abs(mean)):
        return [0.0] * len(scores)
    return [(score - mean) / std for score in scores]


def fuse(
    lexical: ScoredList | None,
    dense: ScoredList | None,
    config: FusionConfig | None = None,
) -> list[FusedCandidate]:
    """Fuse the two sides' (label, score) lists, each best first, into one list.

    1. Both sides ran: ``rrf`` sums 1 / (rrf_k + rank); ``convex`` weighs the z-scores,
       ``(1 - fusion_weight) · lexical + fusion_weight · dense``.
    2. One side ran (the other is None): the score is that side's term alone, unweighted, so the
       order is that side's order.
    A side that ran and returned nothing adds nothing.

    Args:
        lexical: (label, score) best first (score: -bm25, higher is better), or None.
        dense: (label, score) best first (score: cosine), or None.
        config: Fusion method and parameters; None uses the defaults.

    Returns:
        Every label of either list once, best first; ties broken by best single rank, then label.

    Raises:
        ValueError: A label repeats within one list.
    """
    config = config or FusionConfig()
    sides = {"lexical": lexical, "dense": dense}
    terms: dict[str, dict[int, float]] = {}
    missing: dict[str, float] = {}
    best_rank: dict[int, int] = {}
    for name, side in sides.items():
        if side is None:
            continue
        labels = [label for label, _ in side]
        if len(set(labels)) != len(labels):
            raise ValueError(f"the {name} list must hold each label at most once")
        for rank, label in enumerate(labels, start=1):
            best_rank[label] = min(best_rank.get(label, rank), rank)
        if config.fusion == "rrf":
            terms[name] = {label: 1.0 / (config.rrf_k + rank) for rank, label in enumerate(labels, 1)}
            missing[name] = 0.0
        else:
            normalized = zscores([score for _, score in side])
            terms[name] = dict(zip(labels, normalized))
            missing[name] = min(normalized, default=0.0)
    weights = {"lexical": 1.0, "dense": 1.0}
    if config.fusion == "convex" and len(terms) == 2:
        weights = {"lexical": 1.0 - config.fusion_weight, "dense": config.fusion_weight}
    fused = []
    for label in best_rank:
        term = {name: side_terms.get(label, missing[name]) for name, side_terms in terms.items()}
        score = math.fsum(weights[name] * value for name, value in term.items())
        fused.append(FusedCandidate(label, score, term.get("lexical"), term.get("dense")))
    fused.sort(key=lambda candidate: (-candidate.score, best_rank[candidate.label], candidate.label))
    return fused
