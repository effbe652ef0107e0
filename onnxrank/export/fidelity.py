"""Fidelity of a variant's outputs against the reference's, as numbers: the metrics and the
thresholds they must meet. onnxrank.export.validate produces the outputs; each task
(onnxrank.export.tasks) says which metrics and which checks apply to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxrank.engine.variants import VARIANTS

TOP_K = 10
# variants judged on rankings rather than on score differences: the int8 files, and the bf16 runs
# that keep their own fidelity record (neither is bit-faithful)
INT8_VARIANTS = (*(facts.name for facts in VARIANTS.values() if facts.precision == "int8"),
                 *(run.fidelity_key for facts in VARIANTS.values() for run in facts.runs_as
                   if run.fidelity_key is not None))



@dataclass(frozen=True, slots=True)
class FidelityThresholds:
    """Minimum fidelity per variant; a variant below any of them, on either part in either regime
    (onnxrank.export.validate.REGIMES), fails the export.

    Rerank models are judged on scores (logits); embedding models on the cosine between the
    variant's and the reference's embedding of each text.

    Attributes:
        fp32_max_abs_diff: Largest |logit difference| allowed for model.onnx, per unit of the
            reference's largest |logit| (at least 1): float32 rounding grows with the logits'
            magnitude and the depth, so a 22-layer model with logits of +-10 is held to the same
            relative standard as a 6-layer one with logits of +-1.
        opt_max_abs_diff: Same for model_opt.onnx.
        int8_min_spearman: Rank correlation with the reference over the pairs of a part, for the
            int8 variants (int8, ov_int8) and OpenVINO bf16.
        int8_min_spearman_per_query: Mean over a part's query groups of the Spearman correlation
            within each group, for the same variants: a reranker's ranking is read per query, and
            a correlation pooled over all pairs hides queries whose candidates are reordered (the
            stand-in's ov_int8 passed a pooled 0.991 on the held-out pairs with a per-query mean
            of 0.973).
        int8_min_top10_overlap: Mean over a part's query groups of the share of the reference
            top-10 kept, for the same variants: 0.95, at most one of the top ten swapped out in
            every other query. 0.9 passed an OpenVINO int8+bf16 default that kept 0.906 of the
            top ten on short first-stage lists (issue 53) while its groups of judged and random
            documents read 0.985.
        fp16_max_abs_diff: Largest |logit difference| for model_fp16.onnx (when CPU can run it).
        embedding_min_cosine: Lowest per-text cosine for fp32, opt and fp16 embedding variants.
        int8_min_cosine: Lowest per-text cosine for the int8 embedding variants.
    """

    fp32_max_abs_diff: float = 1e-4
    opt_max_abs_diff: float = 1e-3
    int8_min_spearman: float = 0.98
    int8_min_spearman_per_query: float = 0.98
    int8_min_top10_overlap: float = 0.95
    fp16_max_abs_diff: float = 5e-2
    embedding_min_cosine: float = 0.999
    int8_min_cosine: float = 0.98

    def score_checks(self, variant: str) -> list[tuple[str, str, float, str]]:
        """(metric, "<=" or ">=", threshold, attribute name) for one variant of a model judged on
        its scores (a reranker)."""
        if variant in INT8_VARIANTS:
            return [("spearman", ">=", self.int8_min_spearman, "int8_min_spearman"),
                    ("spearman_per_query_mean", ">=", self.int8_min_spearman_per_query,
                     "int8_min_spearman_per_query"),
                    ("top10_overlap", ">=", self.int8_min_top10_overlap, "int8_min_top10_overlap")]
        if variant == "fp32":
            return [("max_abs_diff_scaled", "<=", self.fp32_max_abs_diff, "fp32_max_abs_diff")]
        name = f"{variant}_max_abs_diff"
        return [("max_abs_diff", "<=", float(getattr(self, name)), name)]

    def cosine_checks(self, variant: str) -> list[tuple[str, str, float, str]]:
        """The same for a model judged on the cosine of its outputs (an embedder)."""
        if variant in INT8_VARIANTS:
            return [("cosine_min", ">=", self.int8_min_cosine, "int8_min_cosine")]
        return [("cosine_min", ">=", self.embedding_min_cosine, "embedding_min_cosine")]
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
    """Agreement of two score arrays over the same pairs.

    Returns:
        max |Δ|, mean |Δ|, Pearson and Spearman over all pairs; top-10 overlap per query group
        (mean, and the worst group); Spearman within each group (mean); the reference's spread.
    """
    reference = np.asarray(reference, dtype=np.float64)
    scores = np.asarray(scores, dtype=np.float64)
    group_array = np.asarray(groups)
    overlaps, group_spearman = [], []
    for group in dict.fromkeys(groups):
        members = np.flatnonzero(group_array == group)
        k = min(TOP_K, len(members))
        top_reference = set(members[np.argsort(-reference[members], kind="stable")[:k]])
        top_variant = set(members[np.argsort(-scores[members], kind="stable")[:k]])
        overlaps.append(len(top_reference & top_variant) / k)
        group_spearman.append(_pearson(_rank(reference[members]), _rank(scores[members])))
    difference = np.abs(reference - scores)
    return {
        "pairs": int(len(reference)),
        "groups": len(overlaps),
        "max_abs_diff": float(difference.max()),
        # the fp32 gate's metric: |Δ| per unit of the logits' scale (FidelityThresholds)
        "max_abs_diff_scaled": float(difference.max() / max(1.0, np.abs(reference).max())),
        "mean_abs_diff": float(difference.mean()),
        "pearson": _pearson(reference, scores),
        "spearman": _pearson(_rank(reference), _rank(scores)),
        "top10_overlap": float(np.mean(overlaps)),
        "top10_overlap_min": float(np.min(overlaps)),
        "spearman_per_query_mean": float(np.nanmean(group_spearman)),
        "reference_std": float(reference.std()),
    }


def embedding_metrics(reference: np.ndarray, outputs: np.ndarray,
                      pair_rows: Sequence[tuple[int, int]], groups: Sequence[str]) -> dict[str, Any]:
    """Agreement of two embedding arrays: per-text cosines over the texts of `pair_rows`, and
    score_metrics of the (query, passage) dot products.

    Args:
        reference: The reference's embeddings, one row per text.
        outputs: The variant's embeddings of the same texts.
        pair_rows: (query text, passage text) row of each pair compared.
        groups: Query group of each pair.
    """
    queries = np.array([query for query, _ in pair_rows])
    passages = np.array([passage for _, passage in pair_rows])
    texts = np.unique(np.concatenate([queries, passages]))
    cosines = np.sum(reference[texts] * outputs[texts], axis=1) / (
        np.linalg.norm(reference[texts], axis=1) * np.linalg.norm(outputs[texts], axis=1)
    )
    reference_similarity = np.sum(reference[queries] * reference[passages], axis=1)
    variant_similarity = np.sum(outputs[queries] * outputs[passages], axis=1)
    metrics = score_metrics(reference_similarity, variant_similarity, groups)
    metrics.update({
        "texts": int(len(texts)),
        "cosine_min": float(cosines.min()),
        "cosine_mean": float(cosines.mean()),
        "embedding_max_abs_diff": float(np.abs(reference[texts] - outputs[texts]).max()),
    })
    return metrics
