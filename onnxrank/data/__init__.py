"""Shipped data: validation and calibration pairs (onnxrank/export/validation_data.py), stand-in
head pairs, and the sample collection that `onnxrank bench` and `onnxrank eval` can use by name."""

from __future__ import annotations

from pathlib import Path

# The sample ships inside the bench suite (onnxrank/bench/suite/data/README.md says what it is).
SAMPLE_DATASETS = {
    "cranfield-sample": Path(__file__).resolve().parents[1] / "bench" / "suite" / "data"
    / "cranfield-sample",
}


def resolve_dataset(name_or_path: str | Path) -> Path:
    """A dataset directory: an existing path as given, else a shipped sample by name."""
    path = Path(name_or_path)
    if path.is_dir() or str(name_or_path) not in SAMPLE_DATASETS:
        return path
    return SAMPLE_DATASETS[str(name_or_path)]
