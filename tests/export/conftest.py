"""The family tests' tiny random checkpoints, one per registered cross-encoder family, built once
per run (tests/built_once.py) for every test_families*.py file."""

from __future__ import annotations

from pathlib import Path

import pytest
from built_once import built_once

from onnxrank.bench.family_checkpoints import FAMILY_NAMES, build_family_checkpoint

# ModernBERT's published 8192 positions let the tiny tokenizer's validation rows run to ~2,200
# tokens: with validation batches bounded to 16 x 512 padded tokens (onnxrank.export.validate) its
# fp32 + ov_int8 export peaks at 1.6 GB but takes twice as long (48 s against 24 s); these tests
# are about the family machinery, long rows have their own test
# (test_families_edges.py's test_long_context_family_keeps_its_max_length...)
TINY_POSITIONS = {"modernbert": 512}


@pytest.fixture(scope="session")
def family_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: built_once(tmp_path_factory, f"family-checkpoints/{name}", lambda directory, name=name:
                             build_family_checkpoint(name, directory, size="tiny",
                                                     max_position_embeddings=TINY_POSITIONS.get(name)))
            for name in FAMILY_NAMES}

