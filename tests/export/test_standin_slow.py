"""Full-size stand-ins exported end to end with the default thresholds (minutes on 2 cores)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from onnxrank.cli import main
from onnxrank.engine.runtime import open_model_file
from onnxrank.engine.spec import load_model_spec, verify_files
from onnxrank.engine.tokenize import PairEncoder, load_tokenizer
from onnxrank.export.validate import length_batches, run_batches

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
    assert spec.graph_rewrites["cls_only_last_layer"]["applied"] is True
    # the product's gates, fixed here rather than read from the artefact under test
    for part in (spec.variants["fp32"].fidelity, spec.variants["fp32"].fidelity["held_out"]):
        assert part["max_abs_diff"] <= 1e-4
    for variant in ("int8", "ov_int8"):  # kept only where every regime of both parts passes
        if variant not in spec.variants:
            assert spec.failed_variants[variant]["stage"] == "validation", variant
            continue
        fidelity = spec.variants[variant].fidelity
        for part in (fidelity, fidelity["held_out"]):
            for regime in part["regimes"].values():
                assert regime["spearman_per_query_mean"] >= 0.98, (variant, regime)
                assert regime["top10_overlap"] >= 0.95, (variant, regime)
    assert spec.variants["opt"].optimization["fusions"]["Attention"] == 5  # the last is pruned
    runner = open_model_file(out / "model.onnx", precision="fp32", threads=2)
    rows = PairEncoder(load_tokenizer(spec, out), spec.max_length).encode(PAIRS)
    onnx_scores = run_batches(length_batches(rows, spec.pad_token_id), runner.run, len(rows))[:, 0]
    torch_scores = CrossEncoder(str(out / "checkpoint"), device="cpu",
                                activation_fn=torch.nn.Identity()).predict(PAIRS)
    np.testing.assert_allclose(onnx_scores, torch_scores, atol=1e-4)
    assert onnx_scores[0] > onnx_scores[1], "the fitted head should prefer the on-topic passage"
