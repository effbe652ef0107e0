"""onnxruntime int8 on a graph outside BERT's shape (a tiny random ModernBERT): the ladder finds
the fused Wi feed-forward projections, and a recipe that quantizes nothing never passes as int8."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from child_process import in_child_process

from onnxrank.export.fidelity import FidelityThresholds
from onnxrank.export.pipeline import ExportRequest, export_model
from onnxrank.export.quantize import Int8Settings, ffn_up_projections, quantized_nodes

pytestmark = pytest.mark.costly(10)


@pytest.fixture(scope="module")
def modernbert_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from onnxrank.bench.family_checkpoints import build_family_checkpoint

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # 512 positions, not the published 8192: validation rows of the tiny tokenizer stay under 512
    # tokens (at 8192 they run to ~2,200, and eager attention over them took 6 GB)
    return build_family_checkpoint("modernbert", tmp_path_factory.mktemp("ckpt") / "modernbert",
                                   max_position_embeddings=512)


def test_a_recipe_that_quantizes_nothing_is_recorded_not_kept(modernbert_checkpoint: Path,
                                                               tmp_path: Path) -> None:
    # a fused-Attention-only recipe on a family the optimizer does not fuse: the file would be fp32
    attention_only = Int8Settings("dynamic", per_channel=True,
                                  op_types=("Attention", "EmbedLayerNormalization"))
    result = in_child_process(export_model, ExportRequest(
        model=str(modernbert_checkpoint), out_dir=tmp_path / "m", variants=("fp32", "int8"),
        int8=(attention_only,), validation_pairs=16))
    assert list(result.spec.variants) == ["fp32"]
    failed = result.spec.failed_variants["int8"]
    assert failed["stage"] == "quantization"
    assert failed["reason"].startswith("the last int8 recipe quantized no operator of this graph")
    assert failed["attempts"][0]["quantized_nodes"] == 0
    assert not (tmp_path / "m" / "model_int8.onnx").exists()
    # the fp32 graph's gated feed-forward projections (Wi -> Slice -> GELU), bottom layer first,
    # then the head's dense (it feeds a GELU too)
    names = ffn_up_projections(tmp_path / "m" / "model.onnx")
    assert [name.split("/")[-2:] for name in names[:2]] == [["Wi", "MatMul"]] * 2
    assert ".0/" in names[0] and ".1/" in names[1] and "head" in names[2] and len(names) == 3
    assert quantized_nodes(tmp_path / "m" / "model.onnx") == 0


def test_per_row_int8_passes_the_gate_on_modernbert(modernbert_checkpoint: Path,
                                                    tmp_path: Path) -> None:
    # dynamic int8 found no passing rung on ModernBERT (issue 34); per-token scales do, with the
    # head (dense MatMul, classifier Gemm) in fp32 and no batch effect. Top-10 at 0.9: the tiny
    # random model's one tuning group of 30 swaps one of its top ten (the default floor is 0.95)
    result = in_child_process(export_model, ExportRequest(
        model=str(modernbert_checkpoint), out_dir=tmp_path / "m", variants=("fp32", "int8"),
        int8=(Int8Settings("per_row"),), validation_pairs=48,
        thresholds=FidelityThresholds(int8_min_top10_overlap=0.9)))
    assert "int8" not in result.spec.failed_variants
    variant = result.spec.variants["int8"]
    assert variant.quantization["method"] == "per_row"
    assert set(variant.quantization["nodes_kept_fp32"]) == {"/model/head/dense/MatMul",
                                                           "/model/classifier/Gemm"}
    assert variant.quantization["int8_gemm_flops_share"]["share"] >= 0.6
    assert variant.fidelity["batch_1_vs_64_max_abs_diff"] <= 1e-3 * variant.fidelity["reference_std"]
