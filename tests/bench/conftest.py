"""pytest-benchmark's fixture, on in pytest-xdist's workers too.

pytest-benchmark turns itself off in xdist's workers, as parallel timings are noisy. The harness
tests check how the harness interleaves, counts and stops runs, not the speed it measures, so they
need the fixture's machinery working, not a quiet machine.
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def benchmark(benchmark: Any) -> Any:
    benchmark.disabled = False
    return benchmark
