"""Each pytest-xdist worker computes on its own share of the cores; a user's bench, run from a
test, gets them all back.

Unpinned, every worker's torch, onnxruntime and OpenVINO start a thread per core, and two workers'
spinning pools on two cores take turns instead of computing (the whole suite ran 8:58 and 10:11
unpinned, 7:47 pinned, on the 2-core Xeon with AMX in one sitting). tests/conftest.py pins the
worker before any of them sizes a pool.
"""

from __future__ import annotations

import os

# the cores this process could use before any pinning (imported by tests/conftest.py first)
ALL_CORES = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()


def pin_worker() -> None:
    """Pin this xdist worker to its share of ALL_CORES (nothing outside xdist, or with fewer cores
    than workers)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(ALL_CORES)
    share = len(cores) // workers
    if worker.startswith("gw") and workers > 1 and share >= 1:
        index = int(worker.removeprefix("gw"))
        os.sched_setaffinity(0, cores[index * share:(index + 1) * share])


def all_cores() -> None:
    """A subprocess's preexec_fn: the child gets every core back, as a user's shell has them."""
    if ALL_CORES:
        os.sched_setaffinity(0, ALL_CORES)
