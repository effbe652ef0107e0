"""Argument checks of the public scoring API: one clear, typed error per kind of bad input."""

from __future__ import annotations

from collections.abc import Sequence

from onnxrank.types import Pair

ACTIVATIONS = ("sigmoid", "none")
ON_ERROR = ("raise", "fallback")


def check_query(query: object) -> str:
    """The query, or TypeError / ValueError for a non-str or blank one."""
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    if not query.strip():
        raise ValueError(f"query must be a non-empty string, got {query!r}")
    return query


def check_documents(documents: object) -> list[str]:
    """A copy of the documents list, or TypeError naming the first bad element."""
    if isinstance(documents, str) or not isinstance(documents, Sequence):
        raise TypeError(
            f"documents must be a list of str, got {type(documents).__name__}"
        )
    for index, document in enumerate(documents):
        if not isinstance(document, str):
            raise TypeError(
                f"documents[{index}] must be a str, got {type(document).__name__}"
            )
    return list(documents)


def check_pairs(pairs: object) -> list[Pair]:
    """The pairs as (str, str) tuples, or TypeError / ValueError naming the first bad one."""
    if isinstance(pairs, str) or not isinstance(pairs, Sequence):
        raise TypeError(f"pairs must be a list of (query, document) tuples, got {type(pairs).__name__}")
    checked: list[Pair] = []
    for index, pair in enumerate(pairs):
        if (
            not isinstance(pair, (tuple, list)) or len(pair) != 2
            or not all(isinstance(text, str) for text in pair)
        ):
            raise TypeError(
                f"pairs[{index}] must be a (query, document) tuple of two str, got {pair!r:.80}"
            )
        check_query(pair[0])
        checked.append((pair[0], pair[1]))
    return checked


def check_rank_options(
    top_k: int | None, activation: str | None, deadline_ms: float | None, on_error: str
) -> None:
    """ValueError for an out-of-range rerank option."""
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(
            f"activation must be None (the model's own), 'sigmoid' or 'none', got {activation!r}"
        )
    if deadline_ms is not None and not deadline_ms > 0:
        raise ValueError(f"deadline_ms must be > 0 or None, got {deadline_ms!r}")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be 'raise' or 'fallback', got {on_error!r}")
