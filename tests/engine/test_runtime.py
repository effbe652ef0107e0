"""The runtime layer: backend and precision choice, the probe cache, OpenVINO vs onnxruntime."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from delayed_runner import DelayedRunner

from onnxrank import Device, Reranker
from onnxrank.engine import runtime
from onnxrank.engine.backends import openvino as openvino_backend
from onnxrank.engine.backends.openvino import BF16_FIDELITY_KEY, INT8_BF16_FIDELITY_KEY
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.rows import EncodedRow
from onnxrank.engine.runtime import (
    choose_candidates,
    gate_refusal,
    load_model,
    pad_rows,
    probe_choice,
    resolve_model_dir,
)
from onnxrank.engine.spec import load_model_spec
from onnxrank.errors import ModelLoadError

PAIRS = [("wing flutter", "flutter of a wing in a slipstream"), ("heat", "heat transfer in slabs"),
         ("boundary layer", "the laminar boundary layer on a flat plate at zero incidence")]


def labels(spec, backend: str = "auto", precision: str = "auto") -> list[str]:  # noqa: ANN001
    return [c.label for c in choose_candidates(spec, Device.CPU, backend, precision)[0]]


def manifest_copy(model_dir: Path, tmp_path: Path, *, ov_int8: bool, bf16_passed: bool | None,
                  int8_bf16_passed: bool | None = None) -> Path:
    """A copy of the model with or without the OpenVINO int8 variant and the records of OpenVINO
    bf16 and int8+bf16 (None: no record, as in a manifest written before that gate existed)."""
    target = tmp_path / f"copy-{ov_int8}-{bf16_passed}-{int8_bf16_passed}"
    shutil.copytree(model_dir, target, ignore=shutil.ignore_patterns("checkpoint"))
    data = json.loads((target / "manifest.json").read_text())
    records = {BF16_FIDELITY_KEY: ("fp32", bf16_passed),
               INT8_BF16_FIDELITY_KEY: ("ov_int8", int8_bf16_passed)}
    for key, (variant, passed) in records.items():
        if variant not in data["variants"]:
            continue
        fidelity = data["variants"][variant]["fidelity"]
        fidelity.pop(key, None)
        if passed is not None:
            fidelity[key] = {"validated": True, "spearman": 0.999, "passed": passed}
    if not ov_int8:
        data["variants"].pop("ov_int8", None)
    (target / "manifest.json").write_text(json.dumps(data))
    return target


def test_openvino_f32_matches_onnxruntime_fp32(tiny_model_dir: Path) -> None:
    openvino = Reranker.from_dir(tiny_model_dir, device="cpu", backend="openvino", precision="fp32")
    onnxruntime = Reranker.from_dir(tiny_model_dir, device="cpu", backend="onnxruntime",
                                    precision="fp32")
    assert (openvino.device_info.backend, openvino.device_info.precision) == ("openvino", "fp32")
    assert openvino.device_info.reason == "requested"
    np.testing.assert_allclose(openvino.score(PAIRS), onnxruntime.score(PAIRS), atol=1e-4)


def test_openvino_missing(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino now raises ImportError
    spec = load_model_spec(tiny_model_dir)
    # the tiny int8 file is per-row int8: its scores do not move with their batch mates
    assert labels(spec) == ["onnxruntime/int8"]
    with pytest.raises(ValueError, match=re.escape(
        "nothing can run model 'tiny-reranker' with backend='openvino', precision='fp32' on cpu: "
        "openvino/fp32: the openvino package is not installed (pip install \"onnxrank[openvino]\"). "
        "Available backends: onnxruntime"
    )):
        choose_candidates(spec, Device.CPU, "openvino", "fp32")


def test_bf16_needs_the_cpu(tiny_model_dir: Path, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_model_spec(manifest_copy(tiny_model_dir, tmp_path, ov_int8=True, bf16_passed=True))
    monkeypatch.setattr(openvino_backend, "cpu_capabilities", lambda: ["FP32", "INT8"])
    assert "openvino/bf16" not in labels(spec)
    with pytest.raises(ValueError, match=re.escape(
        "openvino/bf16: this CPU has no native bf16 (OpenVINO's CPU capabilities lack BF16)"
    )):
        choose_candidates(spec, Device.CPU, "openvino", "bf16")
    monkeypatch.setattr(openvino_backend, "cpu_capabilities", lambda: ["BF16", "FP32", "INT8"])
    # OpenVINO's int8 and bf16 both enter the probe (which wins depends on the CPU); without a
    # record of int8+bf16 the third place goes to fp32
    assert labels(spec) == ["onnxruntime/int8", "openvino/int8", "openvino/bf16", "openvino/fp32"]


def test_a_failed_or_missing_gate_keeps_a_precision_out_of_auto(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(openvino_backend, "cpu_capabilities", lambda: ["BF16", "FP32", "INT8"])
    failed = load_model_spec(manifest_copy(tiny_model_dir, tmp_path, ov_int8=False,
                                           bf16_passed=False))
    unrecorded = load_model_spec(manifest_copy(tiny_model_dir, tmp_path, ov_int8=False,
                                               bf16_passed=None))
    for spec in (failed, unrecorded):
        assert "openvino/bf16" not in labels(spec)
        # an explicit request still runs: the user chose it
        assert labels(spec, "openvino", "bf16") == ["openvino/bf16"]
    # a variant that was not exported (or was refused by the export gate) is not a candidate
    assert "ov_int8" not in unrecorded.variants
    with pytest.raises(ValueError, match=re.escape(
        "openvino/int8: variant 'ov_int8' was not exported"
    )):
        choose_candidates(unrecorded, Device.CPU, "openvino", "int8")


def _load(model_dir: Path, *, config: EngineConfig, choice_cache: Path) -> runtime.LoadedModel:
    """Load a cross-encoder's files as Reranker.from_dir does (its probe rows included)."""
    return load_model(load_model_spec(model_dir), model_dir, config=config,
                      probe_rows=Reranker.probe_rows, choice_cache=choice_cache)


def test_probe_choice_is_cached_per_machine(tiny_model_dir: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "choices.json"
    config = EngineConfig(device="cpu", threads=1)
    tiny_model_dir = manifest_copy(tiny_model_dir, tmp_path, ov_int8=False, bf16_passed=None)
    first = _load(tiny_model_dir, config=config, choice_cache=cache)
    assert first.runner.info.reason.startswith("fastest when probed now (onnxruntime/int8 16x64 ")
    entry = next(iter(json.loads(cache.read_text()).values()))
    assert entry["choice"] == f"{first.runner.info.backend}/{first.runner.info.precision}"
    assert entry["fingerprint"]["threads"] == "1"
    # every candidate's time at each shape, and the scores the choice was made by
    assert {label: set(times) for label, times in entry["probe_ms"].items()} == {
        "onnxruntime/int8": {"16x64", "8x256"}, "openvino/fp32": {"16x64", "8x256"}}
    assert probe_choice(entry["probe_ms"]) == (entry["choice"], entry["score"])
    again = _load(tiny_model_dir, config=config, choice_cache=cache)
    assert again.runner.info.reason.startswith("fastest of onnxruntime/int8, openvino/fp32 when "
                                               "probed on this machine at ")
    for label, times in entry["probe_ms"].items():  # the times it was chosen by, per shape
        shapes = ", ".join(f"{shape} {ms:.1f} ms" for shape, ms in times.items())
        assert f"{label} {shapes}" in again.runner.info.reason
    assert (again.runner.info.backend, again.runner.info.precision) == (
        first.runner.info.backend, first.runner.info.precision)
    # the same cache file on another machine (another CPU model) is a miss: probe again
    monkeypatch.setattr(runtime, "cpu_model", lambda: "Another CPU 9000")
    elsewhere = _load(tiny_model_dir, config=config, choice_cache=cache)
    assert elsewhere.runner.info.reason.startswith("fastest when probed now")
    assert len(json.loads(cache.read_text())) == 2


def test_the_probe_ranks_by_the_geometric_mean_of_relative_times() -> None:
    # b is faster in total milliseconds (105 against 110), but twice as slow on short batches
    # and only 15% faster on long ones: a wins
    choice, scores = probe_choice({"a": {"16x64": 10.0, "8x256": 100.0},
                                   "b": {"16x64": 20.0, "8x256": 85.0}})
    assert choice == "a"
    assert scores == pytest.approx({"a": (100 / 85) ** 0.5, "b": 2 ** 0.5})
    # fastest at every shape scores 1.0; a tie goes to the first candidate (the preference order)
    assert probe_choice({"x": {"s": 2.0, "l": 8.0}, "y": {"s": 1.0, "l": 4.0}}) == (
        "y", {"x": 2.0, "y": 1.0})
    assert probe_choice({"x": {"s": 1.0, "l": 8.0}, "y": {"s": 2.0, "l": 4.0}})[0] == "x"


@pytest.mark.parametrize("entry", [
    # the one-shape probe's record: one time per candidate, not one per shape
    {"choice": "openvino/fp32", "probe_ms": {"onnxruntime/int8": 3.0, "openvino/fp32": 2.0}},
    {"choice": "openvino/fp32"},
    ["damaged"],
], ids=["one-shape", "no-times", "not-a-record"])
def test_a_cached_entry_of_another_format_is_probed_again(
    tiny_model_dir: Path, tmp_path: Path, entry: object
) -> None:
    cache = tmp_path / "choices.json"
    config = EngineConfig(device="cpu", threads=1)
    tiny_model_dir = manifest_copy(tiny_model_dir, tmp_path, ov_int8=False, bf16_passed=None)
    _load(tiny_model_dir, config=config, choice_cache=cache)
    # the entry under this machine's key replaced by one in another format
    cache.write_text(json.dumps(dict.fromkeys(json.loads(cache.read_text()), entry)))
    again = _load(tiny_model_dir, config=config, choice_cache=cache)
    assert again.runner.info.reason.startswith("fastest when probed now")
    rewritten = next(iter(json.loads(cache.read_text()).values()))
    assert set(rewritten["probe_ms"]["openvino/fp32"]) == {"16x64", "8x256"}


def test_a_stall_of_the_machine_does_not_decide_the_probe(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # onnxruntime/int8 is probed first and is 40 ms faster a run than openvino/fp32, but the
    # machine stalls through the first two timed runs: timed back to back, those were both of
    # onnxruntime's, which lost; in rounds, each candidate loses one round and keeps its best
    tiny_model_dir = manifest_copy(tiny_model_dir, tmp_path, ov_int8=False, bf16_passed=None)
    stalls = [2]
    real_open = runtime._Opener.open
    monkeypatch.setattr(runtime._Opener, "open", lambda opener, candidate: DelayedRunner(
        real_open(opener, candidate), 0.0 if candidate.label == "onnxruntime/int8" else 0.04,
        stalls))
    loaded = _load(tiny_model_dir, config=EngineConfig(device="cpu", threads=1),
                        choice_cache=tmp_path / "choices.json")
    assert stalls == [0]
    assert (loaded.runner.info.backend, loaded.runner.info.variant) == ("onnxruntime", "int8")
    assert "best of 3 interleaved rounds" in loaded.runner.info.reason


def test_explicit_choices_are_never_silently_replaced(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match=re.escape(
        "onnxruntime/bf16: onnxruntime runs precisions fp32, opt, int8, fp16, not 'bf16' "
        "(bf16 runs on backend='openvino')"
    )):
        Reranker.from_dir(tiny_model_dir, device="cpu", backend="onnxruntime", precision="bf16")
    with pytest.raises(ValueError, match=re.escape(
        "backend must be one of 'auto', 'onnxruntime', 'openvino', got 'tensorrt'"
    )):
        Reranker.from_dir(tiny_model_dir, device="cpu", backend="tensorrt")


def test_embedder_goes_through_the_same_layer(tiny_embedder_dir: Path) -> None:
    from onnxrank.engine.embedder import Embedder

    with pytest.raises(ModelLoadError, match=re.escape(
        f"{tiny_embedder_dir} holds a 'embedding' model, but this needs a cross-encoder"
    )):
        Reranker.from_dir(tiny_embedder_dir, device="cpu")
    openvino = Embedder.from_dir(tiny_embedder_dir, device="cpu", backend="openvino",
                                 precision="fp32")
    onnxruntime = Embedder.from_dir(tiny_embedder_dir, device="cpu", backend="onnxruntime",
                                    precision="fp32")
    texts = ["wing flutter", "heat transfer in slabs of finite thickness"]
    np.testing.assert_allclose(openvino.embed(texts), onnxruntime.embed(texts), atol=1e-4)


def test_pad_rows_right_pads() -> None:
    rows = [EncodedRow(np.array([101, 7, 102]), np.array([0, 0, 0]), 0),
            EncodedRow(np.array([101, 102]), np.array([0, 1]), 1)]
    feeds = pad_rows(rows, pad_token_id=0, padded_length=4)
    np.testing.assert_array_equal(feeds["input_ids"], [[101, 7, 102, 0], [101, 102, 0, 0]])
    np.testing.assert_array_equal(feeds["attention_mask"], [[1, 1, 1, 0], [1, 1, 0, 0]])
    np.testing.assert_array_equal(feeds["token_type_ids"], [[0, 0, 0, 0], [0, 1, 0, 0]])
    assert {array.dtype for array in feeds.values()} == {np.dtype(np.int64)}


def test_resolve_model_dir_prefers_the_models_dir(tiny_model_dir: Path, tmp_path: Path) -> None:
    assert resolve_model_dir(tiny_model_dir.name, tiny_model_dir.parent) == tiny_model_dir.parent / \
        tiny_model_dir.name
    assert resolve_model_dir(tiny_model_dir, tmp_path) == tiny_model_dir
    with pytest.raises(ModelLoadError, match=re.escape(
        f"no exported model named 'nope' in {tmp_path.resolve()}"
    )):
        resolve_model_dir("nope", tmp_path)


def test_engine_config_rejects_unknown_and_bad_options(tiny_model_dir: Path) -> None:
    with pytest.raises(TypeError, match=re.escape("unknown engine options ['max_tokens']")):
        Reranker.from_dir(tiny_model_dir, max_tokens=8)
    with pytest.raises(ValueError, match=re.escape("max_batch_size must be >= 1, got 0")):
        EngineConfig(max_batch_size=0)
    with pytest.raises(ValueError, match=re.escape(
        "long_documents must be one of 'truncate', 'max_chunk', got 'split'"
    )):
        EngineConfig(long_documents="split")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape("threads must be an int or None, got '2'")):
        EngineConfig(threads="2")  # type: ignore[arg-type]


def test_int8_with_bf16_needs_the_cpu_and_its_own_passing_record(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    passed = load_model_spec(manifest_copy(tiny_model_dir, tmp_path, ov_int8=True, bf16_passed=True,
                                           int8_bf16_passed=True))
    # the gate read is exactly variants.ov_int8.fidelity.openvino_int8_bf16
    assert passed.variants["ov_int8"].fidelity[INT8_BF16_FIDELITY_KEY]["passed"] is True
    assert gate_refusal(passed, "openvino", "int8+bf16") is None
    monkeypatch.setattr(openvino_backend, "cpu_capabilities", lambda: ["FP32", "INT8"])
    assert labels(passed) == ["onnxruntime/int8", "openvino/int8", "openvino/fp32"]
    with pytest.raises(ValueError, match=re.escape(
        "nothing can run model 'tiny-reranker' with backend='openvino', precision='int8+bf16' on "
        "cpu: openvino/int8+bf16: this CPU has no native bf16 (OpenVINO's CPU capabilities lack "
        "BF16)"
    )):
        Reranker.from_dir(tiny_model_dir, device="cpu", backend="openvino", precision="int8+bf16")
    monkeypatch.setattr(openvino_backend, "cpu_capabilities", lambda: ["BF16", "FP32", "INT8"])
    assert labels(passed) == ["onnxruntime/int8", "openvino/int8", "openvino/int8+bf16",
                              "openvino/bf16"]
    for record in (False, None):  # failed, or a manifest written before this gate existed
        spec = load_model_spec(manifest_copy(tiny_model_dir, tmp_path, ov_int8=True,
                                             bf16_passed=True, int8_bf16_passed=record))
        assert gate_refusal(spec, "openvino", "int8+bf16") is not None
        assert "openvino/int8+bf16" not in labels(spec)
        assert labels(spec, "openvino", "int8+bf16") == ["openvino/int8+bf16"]  # asked for


def test_a_record_elsewhere_is_not_the_int8_bf16_gate(tiny_model_dir: Path, tmp_path: Path) -> None:
    directory = manifest_copy(tiny_model_dir, tmp_path, ov_int8=True, bf16_passed=None)
    data = json.loads((directory / "manifest.json").read_text())
    # a passing record under the wrong variant, and a "validated: false" one under the right one
    data["variants"]["fp32"]["fidelity"][INT8_BF16_FIDELITY_KEY] = {"passed": True}
    data["variants"]["ov_int8"]["fidelity"][INT8_BF16_FIDELITY_KEY] = {
        "validated": False, "passed": False, "reason": "this CPU has no native bf16"}
    (directory / "manifest.json").write_text(json.dumps(data))
    assert gate_refusal(load_model_spec(directory), "openvino", "int8+bf16") is not None


def test_int8_with_bf16_runs_the_int8_file_when_asked(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Compiled with the bf16 hint: on a CPU without BF16 OpenVINO keeps f32 for the rest, so this
    # checks the wiring (file, hint, label); the bf16 arithmetic itself needs a CPU that has it.
    monkeypatch.setattr(openvino_backend, "cpu_capabilities", lambda: ["BF16", "FP32", "INT8"])
    mixed = Reranker.from_dir(tiny_model_dir, device="cpu", backend="openvino",
                              precision="int8+bf16", compile_cache=False)
    int8 = Reranker.from_dir(tiny_model_dir, device="cpu", backend="openvino", precision="int8",
                             compile_cache=False)
    info = mixed.device_info
    assert (info.backend, info.variant, info.precision, info.reason) == (
        "openvino", "ov_int8", "int8+bf16", "requested")
    assert info.model_file == int8.device_info.model_file
    # bf16 keeps 8 bits of mantissa and shifts what the int8 layers quantize: on a BF16 CPU the
    # tiny random model's scores move by up to ~7% of their spread (measured), its ranking holds.
    mixed_scores, int8_scores = mixed.score(PAIRS), int8.score(PAIRS)
    assert list(np.argsort(mixed_scores)) == list(np.argsort(int8_scores))
    spread = float(int8_scores.max() - int8_scores.min())
    np.testing.assert_allclose(mixed_scores, int8_scores, atol=0.15 * spread)
