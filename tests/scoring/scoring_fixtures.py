"""Input builders shared by the scoring tests."""

from __future__ import annotations

import json

QUERIES = ["what similarity laws must be obeyed for aeroelastic models",
           "heat conduction in composite slabs", "boundary layer transition"]
DOCUMENTS = ["experimental investigation of the aerodynamics of a wing in a slipstream .",
             "the theory of aeroelastic models of heated high speed aircraft",
             "", "simple shear flow past a flat plate " * 20, "a",
             "the effect of ablation on the heat transfer to a blunt body"]

# (line, reason) for every kind of bad JSONL row
BAD_LINES = [
    ("", "blank line"),
    ('{"query": "q", "document": ', "not valid JSON: "),
    ('["q", "d"]', "not a JSON object (got list)"),
    ('{"document": "d", "id": "x1"}', "missing field 'query'"),
    ('{"query": "q", "id": "x2"}', "missing field 'document'"),
    ('{"query": 7, "document": "d"}', "field 'query' must be text, got int"),
    ('{"query": "q", "document": ["d"]}', "field 'document' must be text, got list"),
    ('{"query": "   ", "document": "d"}', "field 'query' is empty"),
    ('{"query": "q", "document": "d", "id": {"a": 1}}', "id column 'id' must be text or a number, got dict"),
]


def make_lines(count: int, *, bad_every: int = 0) -> list[str]:
    """`count` JSONL lines of pairs with ids; every `bad_every`-th line is one of BAD_LINES."""
    lines = []
    for row in range(count):
        if bad_every and row % bad_every == bad_every - 1:
            lines.append(BAD_LINES[(row // bad_every) % len(BAD_LINES)][0])
            continue
        lines.append(json.dumps({"id": f"p{row}", "query": QUERIES[row % len(QUERIES)],
                                 "document": f"{DOCUMENTS[row % len(DOCUMENTS)]} {row}"}))
    return lines
