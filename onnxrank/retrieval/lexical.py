"""Lexical retrieval: SQLite FTS5 with BM25 over the chunk titles and texts.

User text never reaches FTS5's query syntax: it is cut into words and each word is quoted as an
FTS5 string, the strings joined by OR. Quotes, ``*``, ``-``, ``:``, ``NEAR``,
``AND``/``OR``/``NOT``, parentheses and column filters therefore only ever match as plain words.
"""

from __future__ import annotations

import logging
import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from onnxrank.errors import RetrievalError
from onnxrank.retrieval.filters import Filters, compile_filters
from onnxrank.retrieval.store import ChunkStore

logger = logging.getLogger(__name__)

# \w with the unicode flag: letters, digits and underscore in any script, the same characters
# FTS5's unicode61 tokenizer keeps (it splits on everything else).
WORD_PATTERN = re.compile(r"\w+", re.UNICODE)
MAX_QUERY_WORDS = 128
# Words so frequent in English questions that they only add noise to an OR query; BM25's idf
# nearly cancels them, but FTS5 clamps negative idf to a small positive value, so they still
# reward long documents. Kept short and generic on purpose (measured on Cranfield and CACM,
# see docs/retrieval.md).
STOPWORDS = frozenset(
    """a an and are as at be been by can do does for from has have how i in is it its of on or
    that the their there these this to was were what when where which who why will with""".split()
)


@dataclass(frozen=True, slots=True)
class LexicalSettings:
    """BM25 settings. Column weights multiply each column's BM25 contribution (title, text)."""

    title_weight: float = 1.0
    text_weight: float = 1.0
    drop_stopwords: bool = True


def query_words(query: str, *, drop_stopwords: bool = True) -> list[str]:
    """The words of a user query, lower-cased, in order, at most MAX_QUERY_WORDS.

    Repeated words are kept: FTS5's bm25 sums over the OR-ed phrases, so a word the user repeats
    weighs more (+3.5 nDCG@10 points on CACM against de-duplicated words). Stopwords are dropped
    unless that would leave nothing (a query of only stopwords still searches).
    """
    words = [word.lower() for word in WORD_PATTERN.findall(query)]
    if drop_stopwords:
        kept = [word for word in words if word not in STOPWORDS]
        words = kept or words
    return words[:MAX_QUERY_WORDS]


def build_match_query(query: str, *, drop_stopwords: bool = True) -> str:
    """An FTS5 MATCH expression that ORs the query's words, each quoted as an FTS5 string.

    Returns an empty string when the query has no words.

    >>> build_match_query('NEAR(wing "lift") OR title:drag*')
    '"near" OR "wing" OR "lift" OR "title" OR "drag"'
    """
    words = query_words(query, drop_stopwords=drop_stopwords)
    # \w never matches a double quote, so quoting cannot be escaped; the replace is belt and braces
    # for tokenizers that might widen WORD_PATTERN later.
    return " OR ".join('"' + word.replace('"', '""') + '"' for word in words)


def search_lexical(
    store: ChunkStore,
    query: str,
    *,
    depth: int,
    filters: Filters | None = None,
    settings: LexicalSettings = LexicalSettings(),
) -> list[tuple[int, float]]:
    """BM25 search; returns ``(label, score)`` best first, score = -bm25 (higher is better).

    Args:
        store: The index database.
        query: Raw user text (sanitised here).
        depth: Maximum number of chunks to return.
        filters: Metadata filters, applied in the same SQL statement (before the LIMIT).
        settings: Column weights and stopword handling.

    Raises:
        RetrievalError: SQLite failed (never caused by the query text).
    """
    match = build_match_query(query, drop_stopwords=settings.drop_stopwords)
    if not match or depth < 1:
        return []
    condition, parameters = compile_filters(filters)
    sql = (
        "SELECT c.label, bm25(chunks_fts, ?, ?) AS rank FROM chunks_fts "
        "JOIN chunks c ON c.label = chunks_fts.rowid "
        f"WHERE chunks_fts MATCH ? AND {condition} ORDER BY rank LIMIT ?"
    )
    arguments: Sequence[Any] = [
        settings.title_weight,
        settings.text_weight,
        match,
        *parameters,
        depth,
    ]
    try:
        rows = store.connection.execute(sql, arguments).fetchall()
    except sqlite3.Error as err:
        raise RetrievalError(f"lexical search failed for MATCH {match!r}: {err}") from err
    return [(int(label), -float(rank)) for label, rank in rows]
