"""Batch invariance: the load measures the padding multiple at which a runner's scores stop moving
with their batch mates on this machine, the planner pads to it, and precision="auto" leaves out a
probed rerank candidate that no multiple bounds."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from delayed_runner import DelayedRunner

from onnxrank import Reranker
from onnxrank.engine import runtime
from onnxrank.engine.backends.openvino import cpu_capabilities
from onnxrank.engine.batch_invariance import (
    BATCH_DEPENDENCE_BOUND,
    PAD_MULTIPLES,
    batch_movement,
    measure_batch_invariance,
)
from onnxrank.engine.batching import DEFAULT_PAD_MULTIPLE, plan_engine_batches
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.runtime import BATCH_DEPENDENCE_KEY, open_model_file, pad_rows
from onnxrank.engine.spec import load_model_spec
from onnxrank.engine.tokenize import load_tokenizer

RUNS = [("onnxruntime", "fp32"), ("openvino", "fp32"), ("openvino", "bf16")]


def runnable(backend: str, precision: str) -> None:
    if precision == "bf16" and "BF16" not in cpu_capabilities():
        pytest.skip("this CPU has no native bf16")


def held_out_pairs() -> list[tuple[str, str]]:
    """Pairs the check never saw (it runs the first 16 validation pairs), cut to many lengths."""
    text = Path(__file__).parents[2] / "onnxrank" / "data" / "validation_pairs.jsonl"
    records = [json.loads(line) for line in text.read_text("utf-8").splitlines()[48:88]]
    return [(record["query"], " ".join(record["passage"].split()[:12 + 7 * (index % 13)]))
            for index, record in enumerate(records)]


@pytest.mark.parametrize(("backend", "precision"), RUNS, ids=["/".join(run) for run in RUNS])
def test_scores_alone_and_in_a_batch_agree_within_the_bound(tiny_model_dir: Path, backend: str,
                                                            precision: str) -> None:
    runnable(backend, precision)
    reranker = Reranker.from_dir(tiny_model_dir, device="cpu", backend=backend,
                                 precision=precision, max_batch_size=64)
    pairs = held_out_pairs()
    run = reranker.score_detailed(pairs)
    assert len(run.batches) < len(pairs) and len({length for _, length in run.batches}) > 1
    alone = np.array([reranker.score([pair])[0] for pair in pairs])
    moved = np.abs(np.asarray(run.scores) - alone).max()
    assert moved <= BATCH_DEPENDENCE_BOUND * np.std(alone), (moved, np.std(alone))
    info = reranker.device_info
    assert info.batch_invariant_multiple in PAD_MULTIPLES and info.batch_movement is not None
    assert info.batch_movement <= BATCH_DEPENDENCE_BOUND
    assert reranker.padding_multiple == info.batch_invariant_multiple
    assert all(length % info.batch_invariant_multiple == 0 for _, length in run.batches)


def test_the_check_takes_the_first_multiple_within_the_bound(tiny_model_dir: Path) -> None:
    runnable("openvino", "bf16")
    runner = open_model_file(tiny_model_dir / "model.onnx", backend="openvino", precision="bf16")
    spec = load_model_spec(tiny_model_dir)
    tokenizer = load_tokenizer(spec, tiny_model_dir)
    rows = [row for tokens in (37, 85, 150) for row in Reranker.probe_rows(spec, tokenizer, tokens)]

    def feeds_at(batch, length):  # noqa: ANN001, ANN202
        return pad_rows(batch, spec.pad_token_id, length)

    check = measure_batch_invariance(runner.run, feeds_at, rows, 512)
    tried = list(check.moved)
    assert tried == list(PAD_MULTIPLES[:len(tried)]) and tried[-1] == check.pad_to_multiple
    assert all(check.moved[multiple] > BATCH_DEPENDENCE_BOUND for multiple in tried[:-1])
    assert check.within_bound
    # measured again at that multiple, the rows stay within the bound
    assert batch_movement(runner.run, feeds_at, rows, check.pad_to_multiple, 512) \
        <= BATCH_DEPENDENCE_BOUND


def test_the_check_refuses_no_rows_and_a_multiple_below_one(tiny_model_dir: Path) -> None:
    runner = open_model_file(tiny_model_dir / "model.onnx")
    spec = load_model_spec(tiny_model_dir)
    rows = Reranker.probe_rows(spec, load_tokenizer(spec, tiny_model_dir), 37)

    def feeds_at(batch, length):  # noqa: ANN001, ANN202
        return pad_rows(batch, spec.pad_token_id, length)

    with pytest.raises(ValueError, match="^the batch check needs rows, got none$"):
        measure_batch_invariance(runner.run, feeds_at, [], 512)
    with pytest.raises(ValueError, match="^the padding multiple must be >= 1, got 0$"):
        batch_movement(runner.run, feeds_at, rows, 0, 512)


def test_the_check_is_measured_once_per_machine(tiny_model_dir: Path, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = Reranker.from_dir(tiny_model_dir, device="cpu", backend="onnxruntime",
                              precision="fp32")
    entry = next(iter(json.loads((tmp_path / "onnxrank" / "runtime_choices.json")
                                 .read_text()).values()))
    assert entry["choice"] == "onnxruntime/fp32"
    assert entry["batch_check"]["pad_to_multiple"] == first.device_info.batch_invariant_multiple

    def measured_again(*args: object) -> None:
        raise AssertionError("the cached check was measured again")

    monkeypatch.setattr(runtime, "measure_batch_invariance", measured_again)
    again = Reranker.from_dir(tiny_model_dir, device="cpu", backend="onnxruntime",
                              precision="fp32")
    assert (again.device_info.batch_invariant_multiple, again.device_info.batch_movement) == (
        first.device_info.batch_invariant_multiple, first.device_info.batch_movement)
    # a multiple in the settings is used as it is, and no check runs
    named = Reranker.from_dir(tiny_model_dir, device="cpu", backend="onnxruntime",
                              precision="fp32", pad_to_multiple=3)
    assert named.device_info.batch_invariant_multiple is None and named.padding_multiple == 3
    assert named.score_detailed([("q", "a short document")]).batches == [(1, 9)]


def test_the_planner_pads_to_the_measured_multiple_unless_the_settings_name_one(
    tiny_model_dir: Path
) -> None:
    runner = open_model_file(tiny_model_dir / "model.onnx").with_info(batch_invariant_multiple=16)
    lengths = [37, 85, 150, 61]
    planned = plan_engine_batches(lengths, EngineConfig(), runner)
    assert {batch.padded_length for batch in planned} <= {48, 96, 160, 64}
    assert all(batch.padded_length % 16 == 0 for batch in planned)
    named = plan_engine_batches(lengths, EngineConfig(pad_to_multiple=5), runner)
    assert all(batch.padded_length % 5 == 0 for batch in named)
    unchecked = open_model_file(tiny_model_dir / "model.onnx")
    assert unchecked.info.batch_invariant_multiple is None
    assert all(batch.padded_length % DEFAULT_PAD_MULTIPLE == 0
               for batch in plan_engine_batches([37], EngineConfig(), unchecked))
    assert plan_engine_batches([37], EngineConfig(), unchecked)[0].padded_length == 40


def with_dynamic_int8(model_dir: Path, tmp_path: Path) -> Path:
    """A copy whose int8 file is onnxruntime's dynamic int8 (one activation scale per batch), with
    no batch record in the manifest: only the load's check can see that it moves."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    target = tmp_path / "dynamic-int8"
    shutil.copytree(model_dir, target, ignore=shutil.ignore_patterns("checkpoint"))
    data = json.loads((target / "manifest.json").read_text())
    variant = data["variants"]["int8"]
    quantize_dynamic(target / "model.onnx", target / variant["file"], weight_type=QuantType.QInt8)
    variant["sha256"] = hashlib.sha256((target / variant["file"]).read_bytes()).hexdigest()
    variant["fidelity"].pop(BATCH_DEPENDENCE_KEY, None)
    (target / "manifest.json").write_text(json.dumps(data))
    return target


def test_a_probed_candidate_that_moves_at_every_multiple_is_left_out_of_auto(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = with_dynamic_int8(tiny_model_dir, tmp_path)
    # the dynamic int8 file is the fastest candidate, whatever this machine's speeds
    real_open = runtime._Opener.open
    monkeypatch.setattr(runtime._Opener, "open", lambda opener, candidate: DelayedRunner(
        real_open(opener, candidate), 0.0 if candidate.label == "onnxruntime/int8" else 0.02))
    auto = Reranker.from_dir(directory, device="cpu")
    info = auto.device_info
    assert f"{info.backend}/{info.precision}" != "onnxruntime/int8"
    assert info.batch_movement is not None and info.batch_movement <= BATCH_DEPENDENCE_BOUND
    left_out = info.reason.split("; left out: ")[1]
    assert left_out.startswith("onnxruntime/int8: its outputs move with their batch mates on this "
                               "machine (moved ")
    assert left_out.endswith(f"at {PAD_MULTIPLES[-1]}), above the bound of 0.001 x the spread "
                             "(ask for it explicitly to run it)")
    # the cached choice says the same without measuring again
    cached = Reranker.from_dir(directory, device="cpu").device_info
    assert cached.reason.startswith("fastest of ") and cached.reason.endswith(left_out)
    # asked for, it runs (padded to the multiple that moved least), and says how far it moves
    explicit = Reranker.from_dir(directory, device="cpu", backend="onnxruntime",
                                 precision="int8").device_info
    assert explicit.reason == "requested"
    assert explicit.batch_movement is not None and explicit.batch_movement > BATCH_DEPENDENCE_BOUND
