"""What the family tests share (test_families.py, test_families_ov_int8.py,
test_families_edges.py; their tiny checkpoints: conftest.py's family_checkpoints)."""

from __future__ import annotations

from onnxrank.export.families import families

# the decoder family scores through a prompt recipe and is tested in tests/decoder
CROSS_ENCODERS = [family.name for family in families() if not family.uses_recipe]
TINY_PAIRS = 48
# one whole calibration group (a BM25 top-30 list) of the 12: NNCF's statistics passes over all
# 360 pairs took half of a tiny ov_int8 export, and ELECTRA's ov_int8 (which must fail) tries every
# rung of the ladder
TINY_CALIBRATION_PAIRS = 30
PAIRS = [
    ("what is the lift of a thin wing", "the lift of a thin wing in supersonic flow is computed"),
    ("what is the lift of a thin wing", "heat transfer in laminar boundary layers"),
    ("what is the lift of a thin wing", "an experimental study of wing flutter at high speed"),
    ("boundary layer transition", "transition of the boundary layer on a flat plate"),
    ("boundary layer transition", "the buckling of thin cylindrical shells under pressure"),
    ("boundary layer transition", "measurements of skin friction in turbulent flow"),
    ("information retrieval systems", "a retrieval system ranks documents by relevance"),
    ("information retrieval systems", "compilers translate programs into machine code"),
]
# A tiny model's export keeps about one core busy (tracing, NNCF, validation in Python), so the
# fixtures run two at a time, each in a child process of its own: both of CI's two cores work.
EXPORTS_AT_ONCE = 2
