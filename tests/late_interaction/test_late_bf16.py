"""A late-interaction export records OpenVINO bf16 on model.onnx as a cross-encoder's does
(fidelity key ``openvino_bf16``, MaxSim scores of the validation pairs against PyTorch), and the
engine's rule for a precision with a record of its own reads it: passed, it runs and ``auto``
may pick it; failed, or not measurable on this CPU, ``auto`` leaves it out."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import VALIDATION_PAIRS

from onnxrank.cli import main
from onnxrank.engine.backends import openvino as openvino_backend
from onnxrank.engine.backends.openvino import cpu_capabilities
from onnxrank.engine.reranker import Reranker
from onnxrank.engine.variants import VARIANTS
from onnxrank.export.validate import HELD_OUT, load_validation_pairs

pytestmark = pytest.mark.costly(8)

KEY = next(run.fidelity_key for run in VARIANTS["fp32"].runs_as if run.fidelity_key)
HAS_BF16 = "BF16" in cpu_capabilities()


def bf16_record(model_dir: Path) -> dict:
    manifest = json.loads((model_dir / "manifest.json").read_text(encoding="utf-8"))
    return manifest["variants"]["fp32"]["fidelity"][KEY]


def largest_difference(record: dict) -> float:
    """The record's largest |score - reference| over both parts."""
    return max(record["max_abs_diff"], record[HELD_OUT]["max_abs_diff"])


def test_the_export_records_openvino_bf16(bert_model_dir: Path) -> None:
    record = bf16_record(bert_model_dir)
    if not HAS_BF16:  # as the cross-encoder's export: not validated, and why
        assert record == {"validated": False, "passed": False,
                          "reason": "this CPU has no native bf16 (OpenVINO's CPU capabilities "
                                    "lack BF16)"}
        return
    assert record["validated"] is True and record["passed"] is True, record
    assert record["failures"] == []
    assert record["validated_on"] == "openvino OpenVINO CPU, INFERENCE_PRECISION_HINT=bf16"
    # judged as the cross-encoder's bf16 record is: on rankings, by the int8 thresholds
    assert set(record["thresholds"]) == {"spearman", "spearman_per_query_mean", "top10_overlap"}
    assert record["pairs"] + record[HELD_OUT]["pairs"] == int(VALIDATION_PAIRS)
    fp32 = json.loads((bert_model_dir / "manifest.json").read_text())["variants"]["fp32"]["fidelity"]
    # bf16 rounds: it moves the scores further from the reference than fp32 does
    assert largest_difference(record) > largest_difference(fp32)
    # the int8 file has no bf16 run (engine.variants), so no record of one
    int8 = json.loads((bert_model_dir / "manifest.json").read_text())["variants"]["int8"]
    assert not {run.fidelity_key for run in VARIANTS["int8"].runs_as} - {None}
    assert KEY not in int8["fidelity"]


def test_bf16_scores_are_within_the_recorded_bound(bert_model_dir: Path) -> None:
    if not HAS_BF16:
        with pytest.raises(ValueError, match=re.escape("this CPU has no native bf16")):
            Reranker.from_dir(bert_model_dir, device="cpu", backend="openvino", precision="bf16")
        return
    bf16 = Reranker.from_dir(bert_model_dir, device="cpu", backend="openvino", precision="bf16")
    fp32 = Reranker.from_dir(bert_model_dir, device="cpu", backend="onnxruntime",
                             precision="fp32")
    assert (bf16.device_info.backend, bf16.device_info.precision) == ("openvino", "bf16")
    pairs = [(pair.query, pair.passage) for pair in load_validation_pairs(int(VALIDATION_PAIRS))]
    ours, exact = bf16.score(pairs), fp32.score(pairs)
    manifest = json.loads((bert_model_dir / "manifest.json").read_text())
    # both are measured against the same PyTorch reference on these pairs, in float64; the
    # engine returns float32 scores, each rounded by up to half a unit in the last place (the
    # largest difference sits at the recorded bound to within one: 4e-7 to 1.6e-6 of slack
    # at scores near 15, where a float32 step is 9.5e-7)
    rounding = float(np.spacing(np.abs(ours).max()) + np.spacing(np.abs(exact).max())) / 2
    bound = largest_difference(bf16_record(bert_model_dir)) + largest_difference(
        manifest["variants"]["fp32"]["fidelity"]) + rounding
    difference = float(np.abs(ours - exact).max())
    assert 0 < difference <= bound, f"bf16 against fp32: {difference} (recorded bound {bound})"
    auto = Reranker.from_dir(bert_model_dir, device="cpu", backend="openvino", precision="auto")
    assert "openvino/bf16" in auto.device_info.reason  # passed: a candidate of auto


def test_a_failed_bf16_record_keeps_bf16_out_of_auto(bf16_failed_model_dir: Path) -> None:
    model_dir = bf16_failed_model_dir
    record = bf16_record(model_dir)
    assert record["passed"] is False
    if HAS_BF16:
        assert record["validated"] is True
        assert record["failures"] and all("top10_overlap" in failure and "threshold >= 1.01"
                                          in failure for failure in record["failures"])
    auto = Reranker.from_dir(model_dir, device="cpu", backend="openvino", precision="auto")
    assert auto.device_info.precision == "fp32"
    refusal = ("openvino/bf16: openvino/bf16 has no passing fidelity record in the manifest"
               if HAS_BF16 else "openvino/bf16: this CPU has no native bf16")
    assert refusal in auto.device_info.reason


def test_a_cpu_without_bf16_records_why_and_auto_leaves_bf16_out(
        bert_checkpoint_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an AVX2-class CPU as OpenVINO reports it: no BF16 among its capabilities
    monkeypatch.setattr(openvino_backend, "cpu_capabilities", lambda: ["FP32", "INT8"])
    out = tmp_path / "model"
    assert main(["export", "--model", str(bert_checkpoint_dir), "--out", str(out), "--variants",
                 "fp32", "--validation-pairs", VALIDATION_PAIRS, "--quiet"]) == 0
    assert bf16_record(out) == {
        "validated": False, "passed": False,
        "reason": "this CPU has no native bf16 (OpenVINO's CPU capabilities lack BF16)"}
    auto = Reranker.from_dir(out, device="cpu", backend="openvino", precision="auto")
    assert auto.device_info.precision == "fp32"
    assert "openvino/bf16: this CPU has no native bf16" in auto.device_info.reason
