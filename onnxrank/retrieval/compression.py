"""Contextual compression: keep the parts of each hit that answer the query.

Each document is cut into consecutive, non-overlapping windows of about `segment_tokens` tokens
(cut at word boundaries, with their character spans), every window is scored against the query,
and the best `max_segments` are kept, in document order.

1. ``method="model"``: windows are scored by the cross-encoder (`Reranker.score` on
   (query, window) pairs: the same per-window scoring as the engine's
   ``long_documents="max_chunk"``, on disjoint windows so the kept segments never repeat text).
2. ``method="keywords"``: no model; a window's score is how many query words (lower-cased,
   stopwords dropped, a plural "s" ignored) it contains, and windows with fewer than
   `min_matches` distinct query words are dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from onnxrank.retrieval.lexical import STOPWORDS, WORD_PATTERN

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from onnxrank.engine.reranker import Reranker

CompressionMethod = Literal["auto", "model", "keywords"]
COMPRESSION_METHODS: tuple[str, ...] = ("auto", "model", "keywords")
DEFAULT_MAX_SEGMENTS = 3
# 64 tokens is about 45 English words: two or three sentences, enough to carry an answer with its
# context; three of them (192 tokens) are under half of a default 400-word chunk (~520 tokens).
DEFAULT_SEGMENT_TOKENS = 64
DEFAULT_MIN_MATCHES = 1
MIN_SEGMENT_TOKENS = 8
SPACE_WORD = re.compile(r"\S+")


@dataclass(frozen=True, slots=True)
class Segment:
    """A kept window of a document.

    Attributes:
        start, end: Character span [start, end) in the document.
        text: ``document[start:end]``.
        score: The model's score (the manifest's activation) or the keyword count.
        tokens: Tokens in the window (tokenizer tokens with a model, else words).
    """

    start: int
    end: int
    text: str
    score: float
    tokens: int


@dataclass(frozen=True, slots=True)
class CompressedDocument:
    """The kept segments of one document, in document order.

    Attributes:
        index: Position of the document in the input list.
        segments: Kept segments (may be empty in keyword mode: nothing matched).
        method: "model" or "keywords".
        document_tokens: Tokens in the whole document (same unit as Segment.tokens).
        kept_tokens: Tokens in the kept segments.
        unit: "tokens" (the reranker's tokenizer) or "words" (no reranker given).
    """

    index: int
    segments: tuple[Segment, ...]
    method: str
    document_tokens: int
    kept_tokens: int
    unit: str = "tokens"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the ``compression`` object of a query payload)."""
        return {
            "method": self.method,
            "document_tokens": self.document_tokens,
            "kept_tokens": self.kept_tokens,
            "unit": self.unit,
            "segments": [asdict(segment) for segment in self.segments],
        }


def compress(
    query: str,
    documents: Sequence[str],
    *,
    max_segments: int = DEFAULT_MAX_SEGMENTS,
    segment_tokens: int = DEFAULT_SEGMENT_TOKENS,
    reranker: Reranker | None = None,
    method: CompressionMethod = "auto",
    min_matches: int = DEFAULT_MIN_MATCHES,
    stopwords: Iterable[str] = STOPWORDS,
) -> list[CompressedDocument]:
    """The best segments of each document for `query`.

    Args:
        query: Non-empty query.
        documents: Texts to compress.
        max_segments: Segments kept per document, e.g. 3.
        segment_tokens: Tokens per window (tokenizer tokens with a reranker, words without).
        reranker: The cross-encoder that scores windows and whose tokenizer cuts them; None
            cuts by words and allows only the keyword mode.
        method: "model", "keywords", or "auto" (model when a reranker is given).
        min_matches: Keyword mode: distinct query words a window must contain.
        stopwords: Keyword mode: query words ignored.

    Returns:
        One CompressedDocument per input document, in input order.

    Raises:
        ValueError: Empty query, a setting out of range, or method="model" without a reranker.
        InferenceError: The model failed.
    """
    if not isinstance(query, str) or not query.strip():
        raise ValueError(f"query must be a non-empty string, got {query!r}")
    if max_segments < 1:
        raise ValueError(f"max_segments must be >= 1, got {max_segments}")
    if segment_tokens < MIN_SEGMENT_TOKENS:
        raise ValueError(f"segment_tokens must be >= {MIN_SEGMENT_TOKENS}, got {segment_tokens}")
    if min_matches < 1:
        raise ValueError(f"min_matches must be >= 1, got {min_matches}")
    if method not in COMPRESSION_METHODS:
        raise ValueError(f"method must be one of {', '.join(COMPRESSION_METHODS)}, got {method!r}")
    if method == "model" and reranker is None:
        raise ValueError("method='model' needs a reranker (its cross-encoder scores the windows)")
    chosen = "model" if method == "model" or (method == "auto" and reranker is not None) else "keywords"
    tokenizer = None if reranker is None else reranker.tokenizer
    windows = [_windows(document, segment_tokens, tokenizer) for document in documents]
    scores: list[list[float | None]] = []
    if chosen == "model":
        assert reranker is not None  # checked above
        pairs = [(query, document[start:end]) for document, spans in zip(documents, windows)
                 for start, end, _ in spans]
        flat = [float(score) for score in reranker.activate(reranker.score(pairs))] if pairs else []
        position = 0
        for spans in windows:
            scores.append(list(flat[position: position + len(spans)]))
            position += len(spans)
    else:
        keywords = _keywords(query, frozenset(stopwords))
        for document, spans in zip(documents, windows):
            counts = [_keyword_count(document[start:end], keywords) for start, end, _ in spans]
            scores.append([
                float(total) if distinct >= min_matches else None for total, distinct in counts
            ])
    results = []
    for index, (document, spans, document_scores) in enumerate(zip(documents, windows, scores)):
        ranked = sorted(
            (position for position, score in enumerate(document_scores) if score is not None),
            key=lambda position: (-document_scores[position], position),  # type: ignore[operator]
        )[:max_segments]
        segments = tuple(
            Segment(start, end, document[start:end], float(document_scores[position]), tokens)  # type: ignore[arg-type]
            for position in sorted(ranked)
            for start, end, tokens in [spans[position]]
        )
        results.append(CompressedDocument(
            index=index,
            segments=segments,
            method=chosen,
            document_tokens=sum(tokens for _, _, tokens in spans),
            kept_tokens=sum(segment.tokens for segment in segments),
            unit="words" if tokenizer is None else "tokens",
        ))
    return results


def _windows(document: str, segment_tokens: int, tokenizer: Tokenizer | None) -> list[tuple[int, int, int]]:
    """(start, end, tokens) of consecutive windows, cut where a word starts."""
    if tokenizer is None:
        words = [(match.start(), match.end()) for match in SPACE_WORD.finditer(document)]
        return [
            (words[first][0], words[min(first + segment_tokens, len(words)) - 1][1],
             min(segment_tokens, len(words) - first))
            for first in range(0, len(words), segment_tokens)
        ]
    encoding = tokenizer.encode(document, add_special_tokens=False)
    offsets, word_ids = encoding.offsets, encoding.word_ids
    spans = []
    first = 0
    while first < len(offsets):
        stop = min(first + segment_tokens, len(offsets))
        # Step back to the first piece of a word, so no word is split between two segments.
        while (first + 1 < stop < len(offsets) and word_ids[stop] is not None
               and word_ids[stop] == word_ids[stop - 1]):
            stop -= 1
        spans.append((offsets[first][0], offsets[stop - 1][1], stop - first))
        first = stop
    return spans


def _normalise(word: str) -> str:
    word = word.lower()
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def _keywords(query: str, stopwords: frozenset[str]) -> frozenset[str]:
    words = [word.lower() for word in WORD_PATTERN.findall(query)]
    kept = [word for word in words if word not in stopwords] or words
    return frozenset(_normalise(word) for word in kept)


def _keyword_count(text: str, keywords: frozenset[str]) -> tuple[int, int]:
    """(occurrences of query words, distinct query words) in `text`."""
    found = [word for word in (_normalise(word) for word in WORD_PATTERN.findall(text)) if word in keywords]
    return len(found), len(set(found))
