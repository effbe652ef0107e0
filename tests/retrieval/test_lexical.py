"""FTS5 query sanitising, BM25 search and metadata filters."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from onnxrank.retrieval.filters import compile_filters
from onnxrank.retrieval.lexical import LexicalSettings, build_match_query, search_lexical
from onnxrank.retrieval.store import ChunkStore

HOSTILE = [
    '"',
    '""',
    '"unterminated',
    "*",
    "heat*",
    "-heat",
    "heat -flow",
    ":",
    "title:heat",
    "text : flow",
    "{title text}: heat",
    "NEAR(heat flow)",
    "NEAR(heat flow, 2)",
    "heat NEAR flow",
    "AND",
    "OR",
    "NOT",
    "heat AND",
    "OR heat",
    "NOT heat",
    "heat NOT NOT",
    "(",
    ")",
    "((heat)",
    "heat)",
    "^heat",
    "heat^",
    "+",
    "'",
    "' OR 1=1 --",
    "\\",
    "\x00",
    "heat\x00flow",
    "🔥 flow",
    "flow 热",
    "rowid:1",
    "chunks_fts:x",
    "a" * 5000,
    "heat " * 500,
    "* * *",
    "NEAR",
    '"heat" "flow"',
    "heat\nflow\t",
    "-",
    "--",
    ".",
    "@#$%",
]


@pytest.mark.parametrize("query", HOSTILE)
def test_hostile_queries_never_raise_or_change_structure(index_dir: Path, query: str) -> None:
    store = ChunkStore(index_dir)
    try:
        match = build_match_query(query)
        # Every token is a quoted string and tokens are joined by OR only.
        assert re.fullmatch(r'("[^"]+"( OR "[^"]+")*)?', match), match
        hits = search_lexical(store, query, depth=10)
    finally:
        store.close()
    assert all(isinstance(label, int) for label, _ in hits)


def test_operators_are_plain_words() -> None:
    assert build_match_query('NEAR(wing "lift") OR title:drag*') == (
        '"near" OR "wing" OR "lift" OR "title" OR "drag"'
    )
    assert build_match_query("NOT heat AND flow") == '"not" OR "heat" OR "flow"'
    assert build_match_query("   ") == ""
    # Only stopwords: they are kept so the query still searches; repeats are kept (query tf).
    assert build_match_query("what is the") == '"what" OR "is" OR "the"'
    assert build_match_query("heat heat flow", drop_stopwords=False) == '"heat" OR "heat" OR "flow"'


def test_bm25_ranks_matching_documents_and_stems(index_dir: Path) -> None:
    store = ChunkStore(index_dir)
    try:
        hits = search_lexical(store, "compiler languages", depth=10)
        chunks = store.chunks([label for label, _ in hits])
        sources = [chunks[label].source for label, _ in hits]
        scores = [score for _, score in hits]
    finally:
        store.close()
    assert sources == ["compiler"]  # "compiler" matches "compilers" through the porter stemmer
    assert scores[0] > 0


def test_filters_apply_inside_the_sql_before_the_limit(index_dir: Path) -> None:
    store = ChunkStore(index_dir)
    try:

        def sources(query: str, filters: dict, depth: int = 1) -> list[str]:
            hits = search_lexical(store, query, depth=depth, filters=filters)
            chunks = store.chunks([label for label, _ in hits])
            return [chunks[label].source for label, _ in hits]

        # Unfiltered, "heat" ranks "heat" first; with depth 1 a post-filter would return nothing.
        assert sources("heat", {}) == ["heat"]
        assert sources("heat", {"topic": "aero"}) == []
        assert sources("heat transfer blunt", {"year": {"gte": 1963}}) == ["ablation"]
        assert sources("flow heat", {"topic": ["aero", "cs"]}, depth=5) == ["shear"]
        assert sources("heat flow", {"date": {"gte": "1961-01-01", "lt": "1964-01-01"}}, depth=5) == ["heat"]
    finally:
        store.close()


def test_column_weights_change_scores(index_dir: Path) -> None:
    store = ChunkStore(index_dir)
    try:
        plain = dict(search_lexical(store, "shear", depth=5))
        boosted = dict(search_lexical(store, "shear", depth=5, settings=LexicalSettings(title_weight=5.0)))
    finally:
        store.close()
    assert plain.keys() == boosted.keys()
    assert all(boosted[label] > plain[label] for label in plain)


def test_filter_compilation_and_errors() -> None:
    condition, parameters = compile_filters({"a": 1, "b": ["x", "y"], "c": {"gte": 2, "lt": 5}})
    assert condition == (
        "json_extract(c.metadata, ?) = ? AND json_extract(c.metadata, ?) IN (?, ?) AND "
        "json_extract(c.metadata, ?) >= ? AND json_extract(c.metadata, ?) < ?"
    )
    assert parameters == ['$."a"', 1, '$."b"', "x", "y", '$."c"', 2, '$."c"', 5]
    assert compile_filters(None) == ("1", [])
    with pytest.raises(
        ValueError,
        match=re.escape("filter field names must be non-empty strings without double quotes, got 'a\"b'"),
    ):
        compile_filters({'a"b': 1})
    with pytest.raises(
        ValueError,
        match=re.escape("range filter on 'year' has operators ['between']; allowed: gt, gte, lt, lte"),
    ):
        compile_filters({"year": {"between": 1}})
    with pytest.raises(
        ValueError,
        match=re.escape("membership filter on 'tag' is an empty list; it would match nothing"),
    ):
        compile_filters({"tag": []})
    with pytest.raises(
        ValueError,
        match=re.escape("filter value for 'tag' must be a string, number or bool, got null"),
    ):
        compile_filters({"tag": None})
