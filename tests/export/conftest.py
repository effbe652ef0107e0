"""The family tests' tiny random checkpoints, one per registered cross-encoder family, built once
per run (tests/built_once.py) for every test_families*.py file; the tiny reranker's calibration
rows and a validation batch for the OpenVINO int8 tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from built_once import built_once

from onnxrank.bench.family_checkpoints import FAMILY_NAMES, build_family_checkpoint
from onnxrank.engine.runtime import pad_rows
from onnxrank.engine.spec import load_model_spec
from onnxrank.engine.tokenize import PairEncoder, load_tokenizer
from onnxrank.export.validate import load_calibration_pairs, load_validation_pairs

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



def _encoded(model_dir: Path, pairs: list) -> list:
    spec = load_model_spec(model_dir)
    return PairEncoder(load_tokenizer(spec, model_dir), spec.max_length).encode(
        [(pair.query, pair.passage) for pair in pairs])


@pytest.fixture(scope="module")
def calibration(tiny_model_dir: Path) -> list[dict[str, np.ndarray]]:
    """One whole calibration group (30 pairs) of the tiny reranker, one unpadded row per item (as
    the export's)."""
    pad = load_model_spec(tiny_model_dir).pad_token_id
    return [pad_rows([row], pad) for row in _encoded(tiny_model_dir, load_calibration_pairs(32))]


@pytest.fixture(scope="module")
def validation_batch(tiny_model_dir: Path) -> dict[str, np.ndarray]:
    """The 48-pair validation subset (two whole groups of 30) of the tiny reranker as one padded
    batch."""
    return pad_rows(_encoded(tiny_model_dir, load_validation_pairs(48)),
                    load_model_spec(tiny_model_dir).pad_token_id)


@pytest.fixture(scope="module")
def plain_rung_record(tiny_model_dir: Path, calibration: list,
                      tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The ov_int8 ladder's first rung (NNCF's defaults, head fp32) on the tiny reranker: its
    ``quantization`` record, what the rungs that rewrite the graph are compared with."""
    from onnxrank.export.quantize_openvino import OvInt8Settings, quantize_openvino_int8

    return quantize_openvino_int8(
        fp32_path=tiny_model_dir / "model.onnx", layers=2, calibration=calibration,
        out_path=tmp_path_factory.mktemp("plain-rung") / "plain.xml",
        settings=OvInt8Settings(fp32_head=True))
