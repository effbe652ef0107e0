"""Every registered cross-encoder family but ELECTRA (test_families.py: its ov_int8 must fail its
gate) builds and validates OpenVINO int8, with its bf16 record, beside fp32."""

from __future__ import annotations

import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from child_process import in_child_process
from family_cases import CROSS_ENCODERS, EXPORTS_AT_ONCE, TINY_CALIBRATION_PAIRS, TINY_PAIRS

pytestmark = pytest.mark.costly(45)

if TYPE_CHECKING:
    from onnxrank.export.pipeline import ExportResult


@pytest.fixture(scope="session")
def ov_int8_exports(family_checkpoints: dict[str, Path],
                    tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future[ExportResult]]:
    """Each family but ELECTRA (whose ov_int8 must fail, above) exported with fp32 and one
    ov_int8 recipe, loose thresholds; a family's test raises what its export raised."""
    from onnxrank.export.fidelity import FidelityThresholds
    from onnxrank.export.pipeline import ExportRequest, export_model
    from onnxrank.export.quantize_openvino import OvInt8Settings

    root = tmp_path_factory.mktemp("family-ov-int8")
    thresholds = FidelityThresholds(int8_min_spearman=0.5, int8_min_spearman_per_query=0.5,
                                    int8_min_top10_overlap=0.5)
    with ThreadPoolExecutor(max_workers=EXPORTS_AT_ONCE) as pool:
        return {family: pool.submit(in_child_process, export_model, ExportRequest(
            model=str(family_checkpoints[family]), out_dir=root / family,
            variants=("fp32", "ov_int8"), ov_int8=(OvInt8Settings(fp32_head=True),),
            validation_pairs=TINY_PAIRS, calibration_pairs=TINY_CALIBRATION_PAIRS,
            thresholds=thresholds))
            for family in CROSS_ENCODERS if family != "electra"}


@pytest.mark.parametrize("family", [name for name in CROSS_ENCODERS if name != "electra"])
def test_ov_int8_builds_or_is_recorded_and_records_bf16(
        family: str, ov_int8_exports: dict[str, Future[ExportResult]]) -> None:
    """DeBERTa-v2 once crashed NNCF, ModernBERT was fed token_type_ids in the OpenVINO step and
    then left ov_int8 out for memory (onnxrank.export.validate's batch bound): every family
    builds and validates ov_int8 (with its bf16 record) beside fp32."""
    from onnxrank.engine.backends.openvino import cpu_capabilities
    from onnxrank.export.validate import load_calibration_pairs

    spec = ov_int8_exports[family].result().spec
    assert "fp32" in spec.variants
    assert ("ov_int8" in spec.variants) != ("ov_int8" in spec.failed_variants)
    if "ov_int8" in spec.failed_variants:
        reason = spec.failed_variants["ov_int8"]["reason"]
        assert "token_type_ids" not in reason
        pytest.fail(f"{family}: ov_int8 left out: {reason}")
    quantization = spec.variants["ov_int8"].quantization
    assert quantization is not None
    assert quantization["calibration"]["items"] == len(load_calibration_pairs(TINY_CALIBRATION_PAIRS))
    record = spec.variants["ov_int8"].fidelity["openvino_int8_bf16"]
    if "BF16" in cpu_capabilities():
        assert record["validated"] is True and "spearman" in record and "thresholds" in record
    else:
        assert record == {"validated": False, "passed": False, "reason": record["reason"]}
        assert record["reason"].startswith("this CPU has no native bf16")


@pytest.mark.parametrize("family", [name for name in CROSS_ENCODERS if name != "electra"])
def test_each_layer_has_one_feed_forward_projection_of_each_kind(
        family: str, ov_int8_exports: dict[str, Future[ExportResult]]) -> None:
    """The ov_int8 rungs that keep feed-forward blocks fp32 find them by graph structure: one up-
    and one down-projection per layer (ModernBERT's GLU once hid its down-projections), bottom
    layer first; a head with a GELU (ModernBERT's) adds an up-projection after them."""
    from onnxrank.export.quantize import ffn_down_projections, ffn_up_projections

    result = ov_int8_exports[family].result()
    layers = int(result.spec.model_config["num_hidden_layers"])
    graph = result.model_dir / "model.onnx"
    down, up = ffn_down_projections(graph), ffn_up_projections(graph)
    assert len(down) == layers, down
    assert len(up) in (layers, layers + 1), up
    assert [_layer(name) for name in down] == [_layer(name) for name in up[:layers]] == list(range(layers))


def _layer(name: str) -> int:
    match = re.search(r"layers?[./_](\d+)", name)
    assert match is not None, name
    return int(match.group(1))
