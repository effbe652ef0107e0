"""Build a pairs file for `onnxrank score` from a collection (queries.jsonl + corpus.jsonl).

    python -m onnxrank.scoring.sample_pairs --dataset DIR --pairs 20000 --out pairs.jsonl

Pair i takes query i mod (number of queries) and a document drawn with a seeded generator, so the
same arguments always write the same file. Each line: {"id": "QID:DOCID", "query", "document"}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def _read(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        raise ValueError(f"{path.name} not found in {path.parent}; --dataset needs queries.jsonl "
                         "and corpus.jsonl (records with 'id' and 'text')")
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_pairs(dataset: Path, pairs: int, out: Path, *, seed: int = 0) -> int:
    """Write `pairs` (query, document) lines drawn from `dataset` to `out`; returns the count.

    Raises:
        ValueError: pairs < 1, or the dataset files are missing.
    """
    if pairs < 1:
        raise ValueError(f"--pairs must be >= 1, got {pairs}")
    queries = _read(dataset / "queries.jsonl")
    corpus = _read(dataset / "corpus.jsonl")
    documents = np.random.default_rng(seed).integers(0, len(corpus), size=pairs)
    with out.open("w", encoding="utf-8") as handle:
        for index, document_index in enumerate(documents):
            query = queries[index % len(queries)]
            document = corpus[int(document_index)]
            handle.write(json.dumps({"id": f"{query['id']}:{document['id']}",
                                     "query": query["text"], "document": document["text"]}) + "\n")
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m onnxrank.scoring.sample_pairs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, type=Path,
                        help="directory with queries.jsonl and corpus.jsonl")
    parser.add_argument("--pairs", type=int, default=20_000, help="pairs to write")
    parser.add_argument("--seed", type=int, default=0, help="seed of the document draw")
    parser.add_argument("--out", required=True, type=Path, help="JSONL file to write")
    args = parser.parse_args(argv)
    count = write_pairs(args.dataset, args.pairs, args.out, seed=args.seed)
    print(f"wrote {count} pairs to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
