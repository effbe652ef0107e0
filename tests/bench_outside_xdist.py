"""The environment for a bench run in a subprocess, as a user's shell has it.

pytest-xdist marks its workers with ``PYTEST_XDIST_*`` variables, and pytest-benchmark turns
itself off in any process that carries them (parallel timings are noisy): an ``onnxrank bench``
started from a worker would inherit them and time nothing. A user's bench runs outside xdist.
"""

from __future__ import annotations

import os


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without xdist's worker variables, plus `extra`."""
    return {**{name: value for name, value in os.environ.items()
               if not name.startswith("PYTEST_XDIST_")}, **extra}
