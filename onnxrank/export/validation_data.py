"""Builds the shipped data files: validation pairs, calibration pairs and the stand-in's head pairs.

Run once from the repository root (the output is committed; re-running with the same seed and data
reproduces all three files byte for byte, which tests/export checks)::

    python -m onnxrank.export.validation_data --data ../shared/data --out-dir onnxrank/data

The validation and calibration groups look like what a reranker is given: per query, the top
CANDIDATES documents a first stage returns (BM25 over SQLite FTS5, with the lexical retriever's own
query words, onnxrank.retrieval.lexical), each cut into a passage of one of two regimes:

- ``short``: the first 25-90 words of the document (about 30-120 wordpiece tokens): a chunk, the
  traffic most reranking sees;
- ``mixed``: log-uniform 15-480 words (about 20-620 tokens, the bench's mixed regime run past the
  512-token limit so truncation is exercised), starting at the document and running on into the
  next documents of its pool, as a chunker over concatenated text would.

Each collection's documents are dealt at random into three disjoint pools, one per part (tuning,
held_out, calibration), and each part's queries retrieve from their own pool only; queries are
dealt out the same way, one query to one (part, regime). So no query and no passage (not even a
document inside one) is shared between calibration, tuning and held-out. Queries and documents of
the stand-in's head pairs are left out of all three.

``validation_pairs.jsonl``: the tuning and held-out groups; ``calibration_pairs.jsonl``: the
calibration groups (the static int8 variants are calibrated on them). Every row names its part and
regime. ``standin_head_pairs.jsonl``: labelled pairs from other Cranfield queries (judged
documents as positives, random documents as negatives) on which the stand-in reranker's head is
fitted.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from onnxrank.export.validate import CALIBRATION, HELD_OUT, REGIMES, SHORT, TUNING
from onnxrank.retrieval.lexical import build_match_query

logger = logging.getLogger(__name__)

CANDIDATES = 30
# queries per regime of each part: (Cranfield, CACM). Held out is the largest part: it judges each
# regime's per-query mean on 10 queries
QUERIES = {TUNING: (5, 3), HELD_OUT: (7, 3), CALIBRATION: (4, 2)}
# each part's share of a collection's documents, the pool its queries retrieve from
POOL_SHARES = {TUNING: 0.3, HELD_OUT: 0.4, CALIBRATION: 0.3}
# passage length in words per regime (about 1.3 wordpiece tokens a word on these collections)
SHORT_WORDS = (25, 90)
MIXED_WORDS = (15, 480)
MIN_PASSAGE_CHARS = 80
HEAD_QUERIES = 70
HEAD_PAIRS_PER_SIDE = 3
HEAD_PASSAGE_CHARS = 700
# Cranfield queries the head was never fitted on: those of the first validation set, which the
# head's draw left out; fixed so the head (and so the stand-in) stays what it was
HEAD_EXCLUDED_QUERIES = ("12", "38", "57", "62", "74", "87", "90", "92", "104", "120", "121",
                         "177", "213")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _passage(document: dict[str, str]) -> str:
    title = document.get("title", "").strip()
    text = document.get("text", "").strip()
    if text.startswith(title):
        return text
    return f"{title}. {text}".strip(". ") if text else title


def _corpus(directory: Path) -> dict[str, str]:
    """Document id -> text, in id order, without texts too short to be a passage."""
    corpus = {doc["id"]: _passage(doc) for doc in _read_jsonl(directory / "corpus.jsonl")}
    return {doc_id: corpus[doc_id] for doc_id in sorted(corpus, key=int)
            if len(corpus[doc_id]) >= MIN_PASSAGE_CHARS}


def _queries(directory: Path) -> dict[str, str]:
    return {query["id"]: query["text"].strip() for query in _read_jsonl(directory / "queries.jsonl")}


class _Pool:
    """One part's documents of a collection, indexed for BM25 (SQLite FTS5, in memory)."""

    def __init__(self, corpus: dict[str, str], doc_ids: list[str]) -> None:
        self.doc_ids = sorted(doc_ids, key=int)
        self.texts = [corpus[doc_id] for doc_id in self.doc_ids]
        self.connection = sqlite3.connect(":memory:")
        self.connection.execute("CREATE VIRTUAL TABLE docs USING fts5(text)")
        self.connection.executemany("INSERT INTO docs(rowid, text) VALUES (?, ?)",
                                    list(enumerate(self.texts)))

    def search(self, query: str) -> list[int]:
        """Positions in the pool of the top CANDIDATES documents, best first (ties by position)."""
        rows = self.connection.execute(
            "SELECT rowid FROM docs WHERE docs MATCH ? ORDER BY bm25(docs), rowid LIMIT ?",
            (build_match_query(query), CANDIDATES)).fetchall()
        return [int(rowid) for (rowid,) in rows]

    def passage(self, position: int, regime: str, rng: random.Random) -> tuple[str, list[str]]:
        """The regime's passage starting at the document at `position`, and its document ids."""
        if regime == SHORT:
            words = self.texts[position].split()[:rng.randint(*SHORT_WORDS)]
            return " ".join(words), [self.doc_ids[position]]
        low, high = MIXED_WORDS
        length = min(int(math.exp(rng.uniform(math.log(low), math.log(high + 1)))), high)
        words, used = [], []
        while len(words) < length:  # run on into the next documents of the pool
            used.append(self.doc_ids[position])
            words.extend(self.texts[position].split())
            position = (position + 1) % len(self.texts)
        return " ".join(words[:length]), used


def _collection_groups(root: Path, name: str, column: int, rng: random.Random,
                       head: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Rows per part of one collection: QUERIES[part][column] queries per regime."""
    directory = root / name
    corpus = _corpus(directory)
    queries = _queries(directory)
    if name == "cranfield":  # nothing the stand-in's head was fitted on
        head_docs = {str(row["doc_id"]) for row in head}
        head_queries = {str(row["query"]) for row in head}
        corpus = {doc_id: text for doc_id, text in corpus.items() if doc_id not in head_docs}
        queries = {query_id: text for query_id, text in queries.items() if text not in head_queries}
    doc_ids = list(corpus)
    rng.shuffle(doc_ids)
    pools, start = {}, 0
    for part, share in POOL_SHARES.items():
        end = len(doc_ids) if part == list(POOL_SHARES)[-1] else start + round(share * len(doc_ids))
        pools[part] = _Pool(corpus, doc_ids[start:end])
        start = end
    texts = {text: query_id for query_id, text in sorted(queries.items(), key=lambda item: int(item[0]))}
    order = sorted(texts.values(), key=int)  # one id per distinct text
    rng.shuffle(order)
    dealt: Iterator[str] = iter(order)
    rows: dict[str, list[dict[str, Any]]] = {part: [] for part in QUERIES}
    for part, counts in QUERIES.items():
        pool = pools[part]
        for regime in REGIMES:
            for _ in range(counts[column]):
                query_id = next(dealt)
                while len(hits := pool.search(queries[query_id])) < CANDIDATES:
                    query_id = next(dealt)  # too few words in this pool for a full list
                for position in hits:
                    passage, used = pool.passage(position, regime, rng)
                    rows[part].append({"part": part, "regime": regime, "group": f"{name}:{query_id}",
                                       "query": queries[query_id], "passage": passage,
                                       "doc_ids": used})
    return rows


def _interleaved(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The groups of a part with regimes alternating (short, mixed, short, ...), so that whole
    groups spread evenly over the file (a --validation-pairs subset) hold both regimes."""
    groups: dict[str, dict[str, list[dict[str, Any]]]] = {regime: {} for regime in REGIMES}
    for row in rows:
        groups[row["regime"]].setdefault(row["group"], []).append(row)
    columns = [list(groups[regime].values()) for regime in REGIMES]
    ordered = []
    for index in range(max(len(column) for column in columns)):
        for column in columns:
            if index < len(column):
                ordered.extend(column[index])
    return ordered


def _write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def build_head_pairs(data_root: Path, out_path: Path, *, seed: int = 13) -> int:
    """Write labelled Cranfield pairs for fitting the stand-in head and return the number of pairs.

    Args:
        data_root: Directory holding ``cranfield/``.
        out_path: Where to write the JSON-lines file.
        seed: Seed for the choice of queries and negatives.
    """
    rng = random.Random(seed)
    directory = data_root / "cranfield"
    corpus = _corpus(directory)
    queries = _queries(directory)
    judged: dict[str, list[str]] = {}
    with open(directory / "qrels.tsv", encoding="utf-8") as handle:
        next(handle)
        for line in handle:
            query_id, doc_id, relevance = line.rstrip("\n").split("\t")
            if int(relevance) > 0 and doc_id in corpus:
                judged.setdefault(query_id, []).append(doc_id)
    eligible = sorted(
        (query_id for query_id in judged
         if query_id in queries and query_id not in HEAD_EXCLUDED_QUERIES),
        key=lambda query_id: int(query_id),
    )
    doc_ids = list(corpus)
    rows = []
    for query_id in sorted(rng.sample(eligible, HEAD_QUERIES), key=lambda query_id: int(query_id)):
        positives = judged[query_id][:HEAD_PAIRS_PER_SIDE]
        negatives = rng.sample([d for d in doc_ids if d not in judged[query_id]], len(positives))
        for label, chosen in ((1, positives), (0, negatives)):
            for doc_id in chosen:
                # the head sees short inputs only: feature extraction on 2 CPU cores stays ~1 min
                rows.append({"query": queries[query_id], "passage": corpus[doc_id][:HEAD_PASSAGE_CHARS],
                             "label": label, "doc_id": doc_id})
    _write_rows(out_path, rows)
    return len(rows)


def build_pairs(data_root: Path, out_dir: Path, *, head_path: Path,
                seed: int = 13) -> dict[str, list[dict[str, Any]]]:
    """Write the validation and calibration pairs files and return their rows per part.

    Args:
        data_root: Directory holding ``cranfield/`` and ``cacm/`` (corpus.jsonl, queries.jsonl).
        out_dir: Where ``validation_pairs.jsonl`` and ``calibration_pairs.jsonl`` go.
        head_path: The stand-in head's pairs, whose queries and documents are left out.
        seed: Seed for the pools, the queries and the passage lengths.
    """
    head = _read_jsonl(head_path)
    parts: dict[str, list[dict[str, Any]]] = {part: [] for part in QUERIES}
    for column, name in enumerate(("cranfield", "cacm")):
        for part, rows in _collection_groups(data_root, name, column, random.Random(f"{seed}:{name}"),
                                             head).items():
            parts[part].extend(rows)
    parts = {part: _interleaved(rows) for part, rows in parts.items()}
    _write_rows(out_dir / "validation_pairs.jsonl", parts[TUNING] + parts[HELD_OUT])
    _write_rows(out_dir / "calibration_pairs.jsonl", parts[CALIBRATION])
    return parts


def main() -> None:
    """Command-line entry: ``python -m onnxrank.export.validation_data``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, required=True, help="directory with cranfield/ and cacm/")
    parser.add_argument("--out-dir", type=Path, default=Path("onnxrank/data"),
                        help="where validation_pairs.jsonl, calibration_pairs.jsonl and "
                        "standin_head_pairs.jsonl go")
    parser.add_argument("--seed", type=int, default=13, help="random seed")
    args = parser.parse_args()
    head_path = args.out_dir / "standin_head_pairs.jsonl"
    count = build_head_pairs(args.data, head_path, seed=args.seed)
    parts = build_pairs(args.data, args.out_dir, head_path=head_path, seed=args.seed)
    summary = ", ".join(
        f"{part} {len({row['group'] for row in rows})} groups / {len(rows)} pairs"
        for part, rows in parts.items())
    print(f"wrote {summary} ({CANDIDATES} BM25 candidates a group, regimes {', '.join(REGIMES)}) "
          f"and {count} head pairs to {args.out_dir}")


if __name__ == "__main__":
    main()
