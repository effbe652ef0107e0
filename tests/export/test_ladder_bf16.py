"""The OpenVINO int8 ladder on a CPU with BF16: a rung passes only when the int8+bf16 run of its
file (how precision="auto" runs it there) passes too, judged on the tuning pairs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from child_process import in_child_process

from onnxrank.export.fidelity import FidelityThresholds
from onnxrank.export.quantize_openvino import OvInt8Settings

pytestmark = pytest.mark.costly(15)

FLOORS = {"spearman": "int8_min_spearman", "spearman_per_query_mean": "int8_min_spearman_per_query",
          "top10_overlap": "int8_min_top10_overlap"}
PAIRS = 200
LADDER = (OvInt8Settings(), OvInt8Settings(fp32_head=True))


def _export(checkpoint: Path, out_dir: Path, thresholds: object) -> dict:
    from onnxrank.export.pipeline import ExportRequest, export_model

    result = in_child_process(export_model, ExportRequest(
        model=str(checkpoint), out_dir=out_dir, variants=("fp32", "ov_int8"), ov_int8=LADDER,
        validation_pairs=PAIRS, calibration_pairs=32, thresholds=thresholds))
    spec = result.spec
    # the last rung is kept and gated on both parts; a miss there leaves the variant out
    return (spec.variants["ov_int8"].quantization if "ov_int8" in spec.variants
            else spec.failed_variants["ov_int8"])["attempts"]


def _lowest(record: dict, metric: str) -> float:
    """A metric's lowest value over the regimes of an attempt's record: what the floors judge."""
    return min(values[metric] for values in record["regimes"].values())


def test_a_rung_whose_bf16_run_misses_is_passed_over(tiny_checkpoint_dir: Path,
                                                     tmp_path: Path) -> None:
    from onnxrank.engine.backends.openvino import cpu_capabilities

    if "BF16" not in cpu_capabilities():
        pytest.skip("needs a CPU with BF16: elsewhere there is no int8+bf16 run to judge")
    lenient = FidelityThresholds(int8_min_spearman=0.5, int8_min_spearman_per_query=0.5,
                                 int8_min_top10_overlap=0.5)
    first = _export(tiny_checkpoint_dir, tmp_path / "lenient", lenient)[0]
    assert first["passed_on_tuning"] is True
    lowered = [(metric, _lowest(first, metric), _lowest(first["openvino_int8_bf16"], metric))
               for metric in FLOORS
               if _lowest(first["openvino_int8_bf16"], metric) < _lowest(first, metric)]
    if not lowered:
        pytest.skip(f"bf16 rounding lowered none of {', '.join(FLOORS)} on this model")
    metric, int8, bf16 = lowered[0]
    # a floor the int8 run meets in every regime and its int8+bf16 run does not
    attempts = _export(tiny_checkpoint_dir, tmp_path / "strict",
                       replace(lenient, **{FLOORS[metric]: int8}))
    assert _lowest(attempts[0], metric) == int8
    assert _lowest(attempts[0]["openvino_int8_bf16"], metric) == bf16
    assert attempts[0]["passed_on_tuning"] is False
    assert len(attempts) == 2 and attempts[1]["fp32_head"] is True
