"""Contextual compression: windows, model scoring against the engine, keyword mode."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from onnxrank import Reranker
from onnxrank.retrieval.compression import compress

DOCUMENT = (
    "The compiler translates intermediate languages for many targets. Paging in a time sharing "
    "system moves pages between core and drum storage. Heat conduction in composite slabs is "
    "solved for transient boundary conditions with a numerical method. The wing in a propeller "
    "slipstream shows a lift increase at low speed, measured in a wind tunnel at several angles."
)


@pytest.fixture(scope="module")
def bow_reranker(bow_reranker_dir: Path) -> Reranker:
    return Reranker.from_dir(bow_reranker_dir, device="cpu", threads=1)


def test_windows_tile_the_document_at_word_starts(bow_reranker: Reranker) -> None:
    (everything,) = compress("heat", [DOCUMENT], reranker=bow_reranker, segment_tokens=12, max_segments=100)
    segments = everything.segments
    assert len(segments) > 3
    tokens = bow_reranker.tokenizer.encode(DOCUMENT, add_special_tokens=False).ids
    assert everything.document_tokens == len(tokens)
    assert sum(segment.tokens for segment in segments) == everything.document_tokens == everything.kept_tokens
    assert all(segment.tokens <= 12 for segment in segments)
    for previous, segment in zip(segments, segments[1:]):
        assert previous.end <= segment.start  # disjoint, in document order
        assert DOCUMENT[previous.end:segment.start].strip() == ""  # nothing but spaces between
        assert not DOCUMENT[segment.start - 1].isalnum()  # never inside a word
    assert [segment.text for segment in segments] == [DOCUMENT[s.start:s.end] for s in segments]


def test_model_mode_keeps_the_best_windows_by_the_engine(bow_reranker: Reranker) -> None:
    query = "heat conduction slabs"
    (everything,) = compress(query, [DOCUMENT], reranker=bow_reranker, segment_tokens=12, max_segments=100)
    engine = bow_reranker.activate(bow_reranker.score([(query, s.text) for s in everything.segments]))
    assert [segment.score for segment in everything.segments] == pytest.approx(list(engine), abs=1e-6)
    best = sorted(range(len(engine)), key=lambda index: (-engine[index], index))[:2]
    (kept,) = compress(query, [DOCUMENT], reranker=bow_reranker, segment_tokens=12, max_segments=2)
    assert kept.method == "model"
    assert [(s.start, s.end) for s in kept.segments] == [
        (everything.segments[i].start, everything.segments[i].end) for i in sorted(best)
    ]
    assert any("Heat conduction" in segment.text for segment in kept.segments)
    assert kept.kept_tokens < kept.document_tokens


def test_keyword_mode(bow_reranker: Reranker) -> None:
    documents = [DOCUMENT, "nothing relevant here at all"]
    kept, empty = compress("the heat in slabs", documents, segment_tokens=10, max_segments=1)
    assert kept.method == "keywords" and empty.segments == ()
    (segment,) = kept.segments
    assert "Heat conduction in composite slabs" in segment.text
    assert segment.score == 2.0  # "heat" and "slabs"; "the" and "in" are stopwords
    assert segment.tokens == 10 and kept.document_tokens == len(DOCUMENT.split()) and kept.unit == "words"
    (strict,) = compress("heat wing", [DOCUMENT], segment_tokens=10, min_matches=2)
    assert strict.segments == ()  # no window holds both words
    (with_model,) = compress("heat", [DOCUMENT], reranker=bow_reranker, method="keywords", segment_tokens=12)
    assert with_model.method == "keywords"
    assert all(re.search(r"(?i)\bheat\b", segment.text) for segment in with_model.segments)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match=re.escape("method='model' needs a reranker")):
        compress("q", ["d"], method="model")
    with pytest.raises(ValueError, match="segment_tokens must be >= 8, got 4"):
        compress("q", ["d"], segment_tokens=4)
    with pytest.raises(ValueError, match="max_segments must be >= 1, got 0"):
        compress("q", ["d"], max_segments=0)
    with pytest.raises(ValueError, match="query must be a non-empty string"):
        compress(" ", ["d"])
