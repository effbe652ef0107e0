"""Shared type aliases and small enums."""

from __future__ import annotations

from enum import Enum

import numpy as np
from numpy.typing import NDArray

Pair = tuple[str, str]
"""A (query, document) pair."""

Scores = NDArray[np.float32]


class Device(str, Enum):
    """Where inference runs. `auto` picks CUDA when a working CUDA provider is present, else CPU."""

    CPU = "cpu"
    CUDA = "cuda"
    AUTO = "auto"
