"""Batch independence as a gate: precision="auto" leaves out a variant whose scores move with their
batch mates by more than BATCH_DEPENDENCE_BOUND x the score spread; an explicit precision still
runs it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from onnxrank import Device, Reranker
from onnxrank.engine.backends import openvino as openvino_backend
from onnxrank.engine.runtime import (
    BATCH_DEPENDENCE_BOUND,
    BATCH_DEPENDENCE_KEY,
    SPREAD_KEY,
    choose_candidates,
    gate_refusal,
)
from onnxrank.engine.spec import ModelSpec, load_model_spec


def with_batch_records(model_dir: Path, tmp_path: Path, name: str,
                       records: dict[str, float | None], *, spread: float | None = 1.0) -> Path:
    """A copy of the model whose variants record these batch dependences (None: no record),
    with `spread` as their reference_std (None: none recorded)."""
    target = tmp_path / name
    shutil.copytree(model_dir, target, ignore=shutil.ignore_patterns("checkpoint"))
    data = json.loads((target / "manifest.json").read_text())
    for variant, moved in records.items():
        fidelity = data["variants"][variant]["fidelity"]
        fidelity.pop(BATCH_DEPENDENCE_KEY, None)
        fidelity.pop(SPREAD_KEY, None)
        if moved is not None:
            fidelity[BATCH_DEPENDENCE_KEY] = moved
        if spread is not None:
            fidelity[SPREAD_KEY] = spread
    (target / "manifest.json").write_text(json.dumps(data))
    return target


def labels(spec: ModelSpec, backend: str = "auto", precision: str = "auto") -> list[str]:
    return [c.label for c in choose_candidates(spec, Device.CPU, backend, precision)[0]]


@pytest.fixture
def spread() -> float:
    return 2.5  # the stand-in's reference_std on the tuning pairs, about


def test_the_bound_is_a_thousandth_of_the_spread() -> None:
    assert BATCH_DEPENDENCE_BOUND == 1e-3


def test_a_batch_dependent_int8_is_not_an_auto_candidate(tiny_model_dir: Path, tmp_path: Path,
                                                         spread: float) -> None:
    above = with_batch_records(tiny_model_dir, tmp_path, "above",
                               {"int8": 2 * BATCH_DEPENDENCE_BOUND * spread}, spread=spread)
    spec = load_model_spec(above)
    assert "onnxruntime/int8" not in labels(spec, "onnxruntime")
    assert labels(spec, "onnxruntime") == ["onnxruntime/opt"]
    reason = gate_refusal(spec, "onnxruntime", "int8")
    assert reason == ("its scores move with their batch mates by up to 0.005 "
                      "(batch_1_vs_64_max_abs_diff), 0.002 x the score spread 2.5, above the "
                      "bound of 0.001 x the spread (ask for it explicitly to run it)")
    # the load says what it left out and why
    auto = Reranker.from_dir(above, device="cpu", backend="onnxruntime")
    assert auto.device_info.variant == "opt"
    assert auto.device_info.reason == ("the only validated candidate here; left out: "
                                       f"onnxruntime/int8: {reason}")
    # asked for, it runs
    explicit = Reranker.from_dir(above, device="cpu", backend="onnxruntime", precision="int8")
    assert (explicit.device_info.variant, explicit.device_info.reason) == ("int8", "requested")


def test_int8_within_the_bound_or_unmeasured_stays_a_candidate(tiny_model_dir: Path,
                                                               tmp_path: Path,
                                                               spread: float) -> None:
    below = with_batch_records(tiny_model_dir, tmp_path, "below",
                               {"int8": 0.5 * BATCH_DEPENDENCE_BOUND * spread}, spread=spread)
    unmeasured = with_batch_records(tiny_model_dir, tmp_path, "unmeasured", {"int8": None},
                                    spread=spread)
    for directory in (below, unmeasured):
        spec = load_model_spec(directory)
        assert gate_refusal(spec, "onnxruntime", "int8") is None
        assert labels(spec, "onnxruntime") == ["onnxruntime/int8"]


def test_a_batch_record_without_a_spread_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    spec = load_model_spec(with_batch_records(tiny_model_dir, tmp_path, "no-spread",
                                              {"int8": 1e-9}, spread=None))
    assert gate_refusal(spec, "onnxruntime", "int8") == (
        "its scores move with their batch mates by up to 1e-09 (batch_1_vs_64_max_abs_diff) "
        "and the manifest records no score spread (reference_std) to bound it by")
    assert labels(spec, "onnxruntime") == ["onnxruntime/opt"]


def test_the_openvino_int8_file_is_gated_for_both_its_precisions(
    tiny_model_dir: Path, tmp_path: Path, spread: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(openvino_backend, "cpu_capabilities", lambda: ["BF16", "FP32", "INT8"])
    directory = with_batch_records(tiny_model_dir, tmp_path, "ov-above",
                                   {"int8": None, "ov_int8": 2 * BATCH_DEPENDENCE_BOUND * spread},
                                   spread=spread)
    data = json.loads((directory / "manifest.json").read_text())
    # its own int8+bf16 record passed: only the batch gate keeps it out; bf16 has no record
    data["variants"]["ov_int8"]["fidelity"]["openvino_int8_bf16"] = {"passed": True}
    data["variants"]["fp32"]["fidelity"].pop("openvino_bf16", None)
    (directory / "manifest.json").write_text(json.dumps(data))
    spec = load_model_spec(directory)
    assert labels(spec, "openvino") == ["openvino/fp32"]
    assert labels(spec, "openvino", "int8") == ["openvino/int8"]
    assert labels(spec, "openvino", "int8+bf16") == ["openvino/int8+bf16"]


def test_embedding_models_are_not_gated(tiny_embedder_dir: Path, tmp_path: Path) -> None:
    # their record compares embedding components, not scores in the units of the spread
    spec = load_model_spec(with_batch_records(tiny_embedder_dir, tmp_path, "embedder",
                                              {"int8": 1.0}, spread=1.0))
    assert gate_refusal(spec, "onnxruntime", "int8") is None
