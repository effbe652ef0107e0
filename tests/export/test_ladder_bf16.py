"""The OpenVINO int8 ladder on a CPU with BF16: a rung passes only when the int8+bf16 run of its
file (how precision="auto" runs it there) passes too, judged on the tuning pairs; when no rung
does, the first whose int8 run passed is kept, without its bf16 run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from child_process import in_child_process

from onnxrank.engine.reranker import Reranker
from onnxrank.export.fidelity import FidelityThresholds
from onnxrank.export.quantize_openvino import OvInt8Settings

pytestmark = pytest.mark.costly(15)

FLOORS = {"spearman": "int8_min_spearman", "spearman_per_query_mean": "int8_min_spearman_per_query",
          "top10_overlap": "int8_min_top10_overlap"}
PAIRS = 200
# the second rung is the first one spelled out (NNCF's default SmoothQuant alpha for
# transformers, 0.95): the same file again, so a rung whose bf16 run misses misses twice
LADDER = (OvInt8Settings(), OvInt8Settings(smooth_quant_alpha=0.95))


def _export(checkpoint: Path, out_dir: Path, thresholds: object) -> Any:
    from onnxrank.export.pipeline import ExportRequest, export_model

    return in_child_process(export_model, ExportRequest(
        model=str(checkpoint), out_dir=out_dir, variants=("fp32", "ov_int8"), ov_int8=LADDER,
        validation_pairs=PAIRS, calibration_pairs=32, thresholds=thresholds)).spec


def _lowest(record: dict, metric: str) -> float:
    """A metric's lowest value over the regimes of a record: what the floors judge."""
    return min(values[metric] for values in record["regimes"].values())


def test_a_rung_whose_bf16_run_misses_is_passed_over_then_kept(tiny_checkpoint_dir: Path,
                                                               tmp_path: Path) -> None:
    from onnxrank.engine.backends.openvino import cpu_capabilities

    if "BF16" not in cpu_capabilities():
        pytest.skip("needs a CPU with BF16: elsewhere there is no int8+bf16 run to judge")
    lenient = FidelityThresholds(int8_min_spearman=0.5, int8_min_spearman_per_query=0.5,
                                 int8_min_top10_overlap=0.5)
    kept = _export(tiny_checkpoint_dir, tmp_path / "lenient", lenient).variants["ov_int8"]
    first = kept.quantization["attempts"][0]
    assert first["passed_on_tuning"] is True and len(kept.quantization["attempts"]) == 1
    lowered = [(metric, _lowest(first, metric), _lowest(first["openvino_int8_bf16"], metric))
               for metric in FLOORS
               if _lowest(first["openvino_int8_bf16"], metric) < _lowest(first, metric)]
    if not lowered:
        pytest.skip(f"bf16 rounding lowered none of {', '.join(FLOORS)} on this model")
    metric, int8, bf16 = lowered[0]
    # a floor the int8 run meets in every regime and its int8+bf16 run does not
    out = tmp_path / "strict"
    spec = _export(tiny_checkpoint_dir, out, replace(lenient, **{FLOORS[metric]: int8}))
    ov_int8 = spec.variants.get("ov_int8")
    entry = ov_int8.quantization if ov_int8 is not None else spec.failed_variants["ov_int8"]
    # the ladder goes on past a rung whose bf16 run misses ...
    attempts = entry["attempts"]
    assert [attempt["passed_on_tuning"] for attempt in attempts] == [False, False]
    assert attempts[1]["smooth_quant_alpha"] == 0.95
    for attempt in attempts:
        assert _lowest(attempt, metric) == int8
        assert _lowest(attempt["openvino_int8_bf16"], metric) == bf16
    # ... and, when no rung passes with it, keeps the first whose own run passed, for the final
    # gate on both parts, with no set-aside file left behind
    assert entry["kept_attempt"] == 1 and "first whose file passed" in entry["kept_because"]
    assert sorted(path.name for path in out.iterdir() if "ov_int8" in path.name) == (
        ["model_ov_int8.bin", "model_ov_int8.xml"] if ov_int8 is not None else [])
    if ov_int8 is None:  # the tiny random model's held-out pairs may miss the floor
        assert spec.failed_variants["ov_int8"]["stage"] == "validation"
        assert _lowest(spec.failed_variants["ov_int8"]["fidelity"], metric) == int8
        return
    assert ov_int8.quantization["smooth_quant_alpha"] == "default"
    assert ov_int8.fidelity["openvino_int8_bf16"]["passed"] is False
    assert _lowest(ov_int8.fidelity, metric) == int8
    # its failed bf16 record keeps precision="auto" from running it with bf16
    auto = Reranker.from_dir(out, device="cpu", backend="openvino", precision="auto")
    assert ("openvino/int8+bf16: openvino/int8+bf16 has no passing fidelity record in the "
            "manifest") in auto.device_info.reason
    assert Reranker.from_dir(out, device="cpu", backend="openvino",
                             precision="int8").device_info.variant == "ov_int8"
