"""Reciprocal rank fusion (pure functions, no index)."""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_RRF_K = 60


def fuse(ranked_lists: Sequence[Sequence[int]], *, rrf_k: int = DEFAULT_RRF_K) -> list[tuple[int, float]]:
    """Fuse ranked lists of ids: ``score(id) = sum over lists of 1 / (rrf_k + rank)``.

    Ranks start at 1. Ties are broken by the best single rank, then by the id, so the result is
    deterministic. With rrf_k=60, a document ranked 3rd in both lists (2/63 = 0.0317) beats one
    ranked 1st in only one (1/61 = 0.0164): agreement between the retrievers is what fusion rewards.

    Args:
        ranked_lists: Each list best first; an id appears at most once per list.
        rrf_k: Rank offset; larger values flatten the contribution of top ranks.

    Returns:
        ``(id, rrf_score)`` for every id in any list, best first.

    Raises:
        ValueError: rrf_k < 1 or an id repeats within a list.
    """
    if rrf_k < 1:
        raise ValueError(f"rrf_k must be >= 1, got {rrf_k}")
    scores: dict[int, float] = {}
    best_rank: dict[int, int] = {}
    for ranked in ranked_lists:
        if len(set(ranked)) != len(ranked):
            raise ValueError("each ranked list must hold an id at most once")
        for rank, item in enumerate(ranked, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (rrf_k + rank)
            best_rank[item] = min(best_rank.get(item, rank), rank)
    order = sorted(scores, key=lambda item: (-scores[item], best_rank[item], item))
    return [(item, scores[item]) for item in order]
