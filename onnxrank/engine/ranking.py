"""Ranked results: the activation, the one ranking order (best first, ties in input order, top-k)
and the retrieval-order fallback."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from onnxrank.types import Scores


@dataclass(frozen=True, slots=True)
class RankedDocument:
    """One reranked document.

    Attributes:
        index: Position of the document in the input list.
        score: Relevance score (after the activation), or the retrieval-order placeholder NaN
            when `reranked` is False.
        text: The document text.
        reranked: False when the document kept its retrieval position unscored (deadline
            reached or fallback after an error).
        span: With ``long_documents="max_chunk"``, the character span [start, end) of the window
            that earned the score; None otherwise.
    """

    index: int
    score: float
    text: str
    reranked: bool = True
    span: tuple[int, int] | None = None


def activate(logits: NDArray[np.floating], activation: str) -> NDArray[np.float64]:
    """Apply an activation to relevance logits.

    1. ``sigmoid``: maps to (0, 1), computed with tanh so large logits cannot overflow.
    2. ``none`` (and ``softmax``, which on one logit per pair would make every score 1):
       the logits unchanged.
    """
    values = np.asarray(logits, dtype=np.float64)
    if activation == "sigmoid":
        return 0.5 * (1.0 + np.tanh(0.5 * values))
    return values


def fallback_ranking(documents: Sequence[str], *, top_k: int | None = None) -> list[RankedDocument]:
    """Documents in their retrieval order, unscored (``reranked=False``, score NaN).

    This is the graceful-degradation path for retrieval pipelines: use it when the model failed
    to load (catch ModelLoadError), and ``rerank(..., on_error="fallback")`` uses it when a batch
    fails.
    """
    ranked = _unscored(documents, range(len(documents)))
    return ranked if top_k is None else ranked[:top_k]


def _unscored(documents: Sequence[str], indices: Iterable[int]) -> list[RankedDocument]:
    """The placeholders of unscored documents (score NaN, ``reranked=False``), in `indices` order."""
    return [RankedDocument(index=index, score=math.nan, text=documents[index], reranked=False)
            for index in indices]


def rank_order(scores: NDArray[np.floating] | Sequence[float], *,
               top_k: int | None = None) -> NDArray[np.intp]:
    """Positions of `scores` best first, equal scores in input order, at most `top_k` of them.

    Every ranking in the package (the engine, the reranker backends, the server's answers) sorts
    with this. Scores must be finite (the engine refuses NaN before ranking).
    """
    values = np.asarray(scores, dtype=np.float64)
    keep = len(values) if top_k is None else min(top_k, len(values))
    if keep < len(values):
        # argpartition is O(n): only the k survivors get sorted.
        candidates = np.argpartition(-values, keep - 1)[:keep]
        # ties at the cut must still prefer the earlier input: widen to all equal values
        candidates = np.flatnonzero(values >= values[candidates].min())
    else:
        candidates = np.arange(len(values))
    # lexsort: primary key -score, secondary key input position (stable tie-break)
    return candidates[np.lexsort((candidates, -values[candidates]))][:keep]


def rank(
    documents: list[str], scores: NDArray[np.float64] | Scores, spans: list[tuple[int, int] | None],
    scored: NDArray[np.bool_], *, top_k: int | None,
) -> list[RankedDocument]:
    """Sort scored documents best first (ties by input order); unscored ones follow in order."""
    scored_indices = np.flatnonzero(scored)
    values = np.asarray(scores, dtype=np.float64)[scored_indices]
    order = rank_order(values, top_k=top_k)
    # Python ints and floats first: per-element numpy scalars cost more than the ranking itself
    indices, best_values = scored_indices[order].tolist(), values[order].tolist()
    ranked = [RankedDocument(index=index, score=value, text=documents[index], span=spans[index])
              for index, value in zip(indices, best_values)]
    if top_k is None or len(ranked) < top_k:
        ranked += _unscored(documents, np.flatnonzero(~scored).tolist())
    return ranked if top_k is None else ranked[:top_k]
