"""Build a costly test artefact (a tiny checkpoint, an export) once per pytest run, not once per
worker or once per parametrised fixture instance.

pytest-xdist gives each worker its own session, so a session fixture that exports a model ran on
both workers, and a session fixture parametrised over recipes was torn down and built again each
time another file switched the parameter back. Here the first caller builds under a file lock in
the run's shared temporary directory (the parent of the workers' own ones), the others wait for
it and reuse the result. Callers must treat what they get as read-only (tests that change a
model copy it first). A failed build leaves nothing behind, so the next caller tries again and
fails the same way in its own test.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def built_once(factory: pytest.TempPathFactory, relative: str,
               build: Callable[[Path], object]) -> Path:
    """The directory `relative` (its last part is what the artefact is named, e.g. a model's
    directory name) under this run's shared temporary directory, built by `build(path)` if no
    caller has built it yet."""
    base = factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # one per run
    target = root / "built-once" / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    done = target.with_name(target.name + ".built")  # beside it: tests list a model's files
    with FileLock(str(target) + ".lock"):
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)
            try:
                build(target)
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)
                raise
            done.touch()
    return target
