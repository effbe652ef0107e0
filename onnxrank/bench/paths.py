"""Where the shipped bench suite, its budgets and its sample dataset live, and where reports go.

The suite ships inside the package (``onnxrank/bench/suite/``), so ``onnxrank bench`` runs the same
from a wheel as from a checkout. Reports default to a path relative to the working directory: an
installed package's own directory may be read-only and is no place for results.
"""

from __future__ import annotations

from pathlib import Path

from onnxrank.data import SAMPLE_DATASETS

SUITE_DIR = Path(__file__).resolve().parent / "suite"
PYTEST_CONFIG = SUITE_DIR / "pytest.ini"
DEFAULT_BUDGETS = SUITE_DIR / "budgets.toml"
DEFAULT_DATASET = SAMPLE_DATASETS["cranfield-sample"]
DEFAULT_OUT = Path("bench-results") / "latest"
