"""Builds the shipped data files: validation pairs, calibration pairs and the stand-in's head pairs.

Run once from the repository root (the output is committed; re-running with the same seed and data
reproduces all three files byte for byte, which tests/export checks)::

    python -m onnxrank.export.validation_data --data ../shared/data --out-dir onnxrank/data

``validation_pairs.jsonl``: 528 (query, passage) pairs from Cranfield and CACM in 33 query groups:
the first 20 groups (13 tuning, 7 held out), then 13 more held-out groups drawn after the other two
files from queries and documents none of them uses, so that the held-out part (20 groups, 320
pairs; onnxrank.export.validate.HELD_OUT_GROUPS) judges the per-query mean against its 0.98 floor on
20 queries, not 7 (where one query weighed a seventh of the mean).
``calibration_pairs.jsonl``: 320 pairs built the same way from *other* queries and *other*
documents: no query and no passage (text or document id) in common with the validation pairs. The
static int8 variants are calibrated on them.
``standin_head_pairs.jsonl``: labelled pairs from *other* Cranfield queries (judged documents as
positives, random documents as negatives) on which the stand-in reranker's head is fitted.

Per query the group holds its judged documents, random other documents of the same collection,
and two long passages (several abstracts concatenated, well past 512 tokens), so that top-10
overlap per query compares rankings of more than ten candidates and truncation at the 512-token
limit is exercised.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# (collection, queries, judged documents per query at most, minimum judged documents)
COLLECTIONS = (("cranfield", 13, 8, 6), ("cacm", 7, 8, 6))
GROUP_SIZE = 16
LONG_PASSAGES_PER_GROUP = 2
ABSTRACTS_PER_LONG_PASSAGE = 5
MIN_PASSAGE_CHARS = 80
HEAD_QUERIES = 70
HEAD_PAIRS_PER_SIDE = 3
HEAD_PASSAGE_CHARS = 700
CALIBRATION_SEED_OFFSET = 1000
# the extra held-out groups, as many per collection as make the held-out part the shape of COLLECTIONS
EXTRA_HELD_OUT = (("cranfield", 8, 8, 6), ("cacm", 5, 8, 6))
EXTRA_HELD_OUT_SEED_OFFSET = 2000


def _read_jsonl(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _passage(document: dict[str, str]) -> str:
    title = document.get("title", "").strip()
    text = document.get("text", "").strip()
    if text.startswith(title):
        return text
    return f"{title}. {text}".strip(". ") if text else title


def _collection_groups(
    root: Path, name: str, n_queries: int, max_judged: int, min_judged: int, rng: random.Random,
    exclude: list[dict[str, Any]] | None = None,
) -> list[dict[str, object]]:
    """Query groups of one collection; with `exclude`, none of its queries, documents or texts."""
    directory = root / name
    corpus = {doc["id"]: _passage(doc) for doc in _read_jsonl(directory / "corpus.jsonl")}
    corpus = {doc_id: text for doc_id, text in corpus.items() if len(text) >= MIN_PASSAGE_CHARS}
    queries = {query["id"]: query["text"].strip() for query in _read_jsonl(directory / "queries.jsonl")}
    if exclude:
        mine = [row for row in exclude if str(row["group"]).startswith(f"{name}:")]
        used_docs = {str(doc_id) for row in mine for doc_id in row["doc_ids"]}
        used_texts = {str(row["passage"]) for row in exclude}
        used_queries = {str(row["query"]) for row in exclude}
        used_query_ids = {str(row["group"]).split(":", 1)[1] for row in mine}
        corpus = {doc_id: text for doc_id, text in corpus.items()
                  if doc_id not in used_docs and text not in used_texts}
        queries = {query_id: text for query_id, text in queries.items()
                   if query_id not in used_query_ids and text not in used_queries}
    judged: dict[str, list[str]] = {}
    with open(directory / "qrels.tsv", encoding="utf-8") as handle:
        next(handle)
        for line in handle:
            query_id, doc_id, relevance = line.rstrip("\n").split("\t")
            if int(relevance) > 0 and doc_id in corpus:
                judged.setdefault(query_id, []).append(doc_id)
    eligible = sorted(
        (query_id for query_id, docs in judged.items() if len(docs) >= min_judged and query_id in queries),
        key=lambda query_id: int(query_id),
    )
    chosen = sorted(rng.sample(eligible, n_queries), key=lambda query_id: int(query_id))
    doc_ids = sorted(corpus, key=lambda doc_id: int(doc_id))
    rows = []
    for query_id in chosen:
        positives = judged[query_id][:max_judged]
        others = [doc_id for doc_id in doc_ids if doc_id not in judged[query_id]]
        n_random = GROUP_SIZE - len(positives) - LONG_PASSAGES_PER_GROUP
        group = f"{name}:{query_id}"
        for doc_id in positives:
            rows.append({"group": group, "query": queries[query_id], "passage": corpus[doc_id],
                         "doc_ids": [doc_id], "judged": True})
        for doc_id in rng.sample(others, n_random):
            rows.append({"group": group, "query": queries[query_id], "passage": corpus[doc_id],
                         "doc_ids": [doc_id], "judged": False})
        for _ in range(LONG_PASSAGES_PER_GROUP):
            # a judged abstract first, so long passages are not all trivially irrelevant
            parts = [rng.choice(positives), *rng.sample(others, ABSTRACTS_PER_LONG_PASSAGE - 1)]
            rows.append({"group": group, "query": queries[query_id],
                         "passage": " ".join(corpus[doc_id] for doc_id in parts),
                         "doc_ids": parts, "judged": True})
    return rows


def _draw_groups(
    data_root: Path, collections: tuple[tuple[str, int, int, int], ...], rng: random.Random,
    exclude: list[dict[str, Any]] | None = None,
) -> list[dict[str, object]]:
    """The query groups of every (collection, queries, max judged, min judged) in order."""
    rows: list[dict[str, object]] = []
    for name, n_queries, max_judged, min_judged in collections:
        rows.extend(_collection_groups(data_root, name, n_queries, max_judged, min_judged, rng,
                                       exclude=exclude))
    return rows


def _write_rows(path: Path, rows: list[dict[str, Any]], mode: str = "w") -> None:
    with open(path, mode, encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def build_validation_pairs(data_root: Path, out_path: Path, *, seed: int = 13) -> set[str]:
    """Write the validation pairs file and return its query groups ("collection:query id").

    Args:
        data_root: Directory holding ``cranfield/`` and ``cacm/`` (corpus.jsonl, queries.jsonl, qrels.tsv).
        out_path: Where to write the JSON-lines file.
        seed: Seed for the choice of queries and random documents.
    """
    rows = _draw_groups(data_root, COLLECTIONS, random.Random(seed))
    _write_rows(out_path, rows)
    logger.info("wrote %d validation pairs to %s", len(rows), out_path)
    return {str(row["group"]) for row in rows}


def build_calibration_pairs(
    data_root: Path, out_path: Path, *, validation_path: Path, seed: int = 13
) -> int:
    """Write the calibration pairs file and return its number of pairs.

    The same shape as the validation pairs (20 query groups of 16, long passages included, so
    calibration sees the same lengths), from queries and documents the validation pairs do not use.

    Args:
        data_root: Directory holding ``cranfield/`` and ``cacm/``.
        out_path: Where to write the JSON-lines file.
        validation_path: The validation pairs file whose queries and documents are left out.
        seed: Seed for the choice of queries and documents (offset from the validation seed, so
            the two files never draw the same sequence).
    """
    rows = _draw_groups(data_root, COLLECTIONS, random.Random(seed + CALIBRATION_SEED_OFFSET),
                        exclude=_read_jsonl(validation_path))
    _write_rows(out_path, rows)
    logger.info("wrote %d calibration pairs to %s", len(rows), out_path)
    return len(rows)


def build_head_pairs(
    data_root: Path, out_path: Path, *, exclude_groups: set[str], seed: int = 13
) -> int:
    """Write labelled Cranfield pairs for fitting the stand-in head and return the number of pairs.

    Args:
        data_root: Directory holding ``cranfield/``.
        out_path: Where to write the JSON-lines file.
        exclude_groups: Validation groups ("cranfield:ID") whose queries are left out.
        seed: Seed for the choice of queries and negatives.
    """
    rng = random.Random(seed)
    directory = data_root / "cranfield"
    corpus = {doc["id"]: _passage(doc) for doc in _read_jsonl(directory / "corpus.jsonl")}
    corpus = {doc_id: text for doc_id, text in corpus.items() if len(text) >= MIN_PASSAGE_CHARS}
    queries = {query["id"]: query["text"].strip() for query in _read_jsonl(directory / "queries.jsonl")}
    judged: dict[str, list[str]] = {}
    with open(directory / "qrels.tsv", encoding="utf-8") as handle:
        next(handle)
        for line in handle:
            query_id, doc_id, relevance = line.rstrip("\n").split("\t")
            if int(relevance) > 0 and doc_id in corpus:
                judged.setdefault(query_id, []).append(doc_id)
    eligible = sorted(
        (query_id for query_id in judged
         if query_id in queries and f"cranfield:{query_id}" not in exclude_groups),
        key=lambda query_id: int(query_id),
    )
    doc_ids = sorted(corpus, key=lambda doc_id: int(doc_id))
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


def append_held_out_groups(
    data_root: Path, validation_path: Path, *, calibration_path: Path, head_path: Path, seed: int = 13
) -> list[str]:
    """Append the extra held-out groups to the validation file and return their names.

    Drawn last, from queries and documents that neither the validation file nor the calibration
    pairs use and from queries the stand-in's head was not fitted on, so the files written before
    stay as they were.

    Args:
        data_root: Directory holding ``cranfield/`` and ``cacm/``.
        validation_path: The validation pairs file (its first 20 groups), appended to.
        calibration_path: The calibration pairs file whose queries and documents are left out.
        head_path: The stand-in head's pairs, whose queries and documents are left out.
        seed: Seed for the choice of queries and documents (offset from the other files' seeds).
    """
    head = [{"group": "cranfield:head", "query": row["query"], "passage": row["passage"],
             "doc_ids": [row["doc_id"]]} for row in _read_jsonl(head_path)]
    rows = _draw_groups(data_root, EXTRA_HELD_OUT, random.Random(seed + EXTRA_HELD_OUT_SEED_OFFSET),
                        exclude=[*_read_jsonl(validation_path), *_read_jsonl(calibration_path), *head])
    _write_rows(validation_path, rows, mode="a")
    return list(dict.fromkeys(str(row["group"]) for row in rows))


def main() -> None:
    """Command-line entry: ``python -m onnxrank.export.validation_data``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--data", type=Path, required=True, help="directory with cranfield/ and cacm/")
    parser.add_argument("--out-dir", type=Path, default=Path("onnxrank/data"),
                        help="where validation_pairs.jsonl, calibration_pairs.jsonl and "
                        "standin_head_pairs.jsonl go")
    parser.add_argument("--seed", type=int, default=13, help="random seed")
    args = parser.parse_args()
    groups = build_validation_pairs(args.data, args.out_dir / "validation_pairs.jsonl", seed=args.seed)
    calibration = build_calibration_pairs(
        args.data, args.out_dir / "calibration_pairs.jsonl",
        validation_path=args.out_dir / "validation_pairs.jsonl", seed=args.seed)
    count = build_head_pairs(args.data, args.out_dir / "standin_head_pairs.jsonl",
                             exclude_groups=groups, seed=args.seed)
    extra = append_held_out_groups(
        args.data, args.out_dir / "validation_pairs.jsonl",
        calibration_path=args.out_dir / "calibration_pairs.jsonl",
        head_path=args.out_dir / "standin_head_pairs.jsonl", seed=args.seed)
    print(f"wrote {len(groups) + len(extra)} validation groups ({len(extra)} of them extra held-out "
          f"groups: {', '.join(extra)}), {calibration} calibration pairs and {count} head pairs to "
          f"{args.out_dir}")


if __name__ == "__main__":
    main()
