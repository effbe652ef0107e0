"""The export's tables and stages without a model: the variant facts and the steps that build
them, the one ladder runner, how a variant's failure becomes its failed_variants entry, and the
family hooks the pipeline asks instead of checking family names."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from onnxrank.bench.family_checkpoints import FAMILY_NAMES, checkpoint_config
from onnxrank.engine.backends.onnxruntime import OnnxruntimeBackend
from onnxrank.engine.backends.openvino import OpenvinoBackend
from onnxrank.engine.spec import VARIANT_NAMES
from onnxrank.engine.variants import VARIANTS
from onnxrank.export import ladder, pipeline
from onnxrank.export.context import BuiltVariant, VariantFailed
from onnxrank.export.families import families, family_for
from onnxrank.export.ladder import Rung, run_ladder
from onnxrank.export.tasks import EMBEDDING, EXPORT_TASKS, RERANK, export_task
from onnxrank.export.variants import VARIANT_STEPS, VariantStep


def test_every_variant_has_its_facts_and_a_build_step() -> None:
    assert VARIANT_NAMES == tuple(VARIANTS) == ("fp32", "opt", "int8", "fp16", "ov_int8")
    # fp32 is traced and gated by the pipeline itself; every other variant is one step
    assert set(VARIANT_STEPS) == set(VARIANT_NAMES) - {"fp32"}
    assert {name: facts.file for name, facts in VARIANTS.items()} == {
        "fp32": "model.onnx", "opt": "model_opt.onnx", "int8": "model_int8.onnx",
        "fp16": "model_fp16.onnx", "ov_int8": "model_ov_int8.xml"}
    assert VARIANTS["ov_int8"].extra_files == ("model_ov_int8.bin",)
    assert [name for name, facts in VARIANTS.items() if facts.cpu] == ["fp32", "opt", "int8", "ov_int8"]
    # a variant with a prefix graph file: fp32 (the traced one) and each step that makes one
    assert {name: facts.prefix_file for name, facts in VARIANTS.items() if facts.prefix_file} == {
        "fp32": "model_prefix.onnx", "fp16": "model_prefix_fp16.onnx",
        "ov_int8": "model_prefix_ov_int8.xml"}
    assert {name for name, step in VARIANT_STEPS.items() if step.prefix_graph} == {"fp16", "ov_int8"}


def test_the_backends_precision_maps_come_from_the_facts() -> None:
    assert OnnxruntimeBackend.variants == {"fp32": "fp32", "opt": "opt", "int8": "int8",
                                           "fp16": "fp16"}
    assert OpenvinoBackend.variants == {"fp32": "fp32", "bf16": "fp32", "int8": "ov_int8",
                                        "int8+bf16": "ov_int8"}
    assert OpenvinoBackend.gate_records == {"bf16": "openvino_bf16",
                                            "int8+bf16": "openvino_int8_bf16"}


class _Progress:
    def __init__(self) -> None:
        self.steps: list[str] = []

    def step(self, name: str) -> None:
        self.steps.append(name)


def _context(**fields: Any) -> Any:
    """An export context without a model: each variant's file where no step writes it."""
    defaults = {"task": RERANK, "progress": _Progress(), "inputs": None, "thresholds": None,
                "paths": {name: Path(facts.file) for name, facts in VARIANTS.items()}}
    return SimpleNamespace(**{**defaults, **fields})


def _fake_validation(monkeypatch: pytest.MonkeyPatch, spearmans: list[float]) -> None:
    """Each validation of the ladder measures the next of `spearmans`; 0.9 and up passes."""
    measured = iter(spearmans)
    monkeypatch.setattr(ladder, "validate_file", lambda context, variant: (
        {"spearman": next(measured), "part": "tuning"}, {}))
    monkeypatch.setattr(ladder, "open_variant", lambda context, variant: SimpleNamespace(run=None))
    monkeypatch.setattr(ladder, "tuning_failures", lambda context, variant, metrics: (
        [] if metrics["spearman"] >= 0.9 else ["spearman too low"]))
    monkeypatch.setattr(ladder, "batch_dependence", lambda run, inputs: {"batch": 0.0})


def test_the_ladder_stops_at_the_first_rung_that_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_validation(monkeypatch, [0.5, 0.95, 0.99])
    rungs = [Rung(recipe, lambda recipe=recipe: {"recipe": recipe, "quantized_nodes": 3},
                  batch_dependent=recipe == "b")
             for recipe in ("a", "b", "c")]
    context = _context()
    built = run_ladder(context, "int8", rungs)
    assert [attempt["recipe"] for attempt in built.quantization["attempts"]] == ["a", "b"]
    assert [attempt["passed_on_tuning"] for attempt in built.quantization["attempts"]] == [
        False, True]
    assert built.quantization["recipe"] == "b"
    assert built.fidelity == {"spearman": 0.95, "part": "tuning", "batch": 0.0}
    assert context.progress.steps == ["int8 recipe 1 of 3", "int8 recipe 2 of 3"]


def _ov_int8_ladder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, files: list[float],
                    bf16: list[float]) -> tuple[BuiltVariant, Path]:
    """The ov_int8 ladder over rungs "a", "b", "c": each writes its name into the IR's two files;
    its file measures the next of `files`, and each file that passes has an int8+bf16 run that
    measures the next of `bf16`."""
    _fake_validation(monkeypatch, files)
    measured = iter(bf16)
    run = next(run for run in VARIANTS["ov_int8"].runs_as if run.fidelity_key)
    monkeypatch.setattr(ladder, "bf16_runs", lambda context, variant: {
        run.fidelity_key: (run, {"validated": True, "spearman": next(measured)}, None)})
    path = tmp_path / VARIANTS["ov_int8"].file

    def quantize(recipe: str) -> dict[str, Any]:
        for name in (path.name, *VARIANTS["ov_int8"].extra_files):
            (tmp_path / name).write_text(recipe)
        return {"recipe": recipe, "quantized_nodes": 3}

    rungs = [Rung(recipe, lambda recipe=recipe: quantize(recipe), batch_dependent=False)
             for recipe in ("a", "b", "c")]
    return run_ladder(_context(paths={"ov_int8": path}), "ov_int8", rungs), tmp_path


def test_when_no_rung_passes_with_its_bf16_run_the_first_whose_file_did_is_kept(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a: its file passes, its bf16 run misses; b: its file misses; c: as a
    built, folder = _ov_int8_ladder(monkeypatch, tmp_path, [0.95, 0.5, 0.97], [0.5, 0.6])
    quantization = built.quantization
    assert [attempt["passed_on_tuning"] for attempt in quantization["attempts"]] == [False] * 3
    assert (quantization["recipe"], quantization["kept_attempt"]) == ("a", 1)
    assert quantization["kept_because"] == ladder.KEPT_WITHOUT_BF16
    assert built.fidelity["spearman"] == 0.95
    assert built.fidelity["openvino_int8_bf16"] == {"validated": True, "spearman": 0.5}
    # rung a's files are back in place, c's are gone, nothing is left set aside
    assert {path.name: path.read_text() for path in folder.iterdir()} == {
        "model_ov_int8.xml": "a", "model_ov_int8.bin": "a"}


def test_a_later_rung_that_passes_with_its_bf16_run_wins_over_a_set_aside_one(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    built, folder = _ov_int8_ladder(monkeypatch, tmp_path, [0.95, 0.97], [0.5, 0.99])
    assert [attempt["passed_on_tuning"] for attempt in built.quantization["attempts"]] == [
        False, True]
    assert built.quantization["recipe"] == "b" and "kept_attempt" not in built.quantization
    assert {path.name: path.read_text() for path in folder.iterdir()} == {
        "model_ov_int8.xml": "b", "model_ov_int8.bin": "b"}


def test_a_last_rung_that_quantizes_nothing_fails_with_every_attempt(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_validation(monkeypatch, [0.5])
    rungs = [Rung("a", lambda: {"quantized_nodes": 2}, batch_dependent=True),
             Rung("b", lambda: {"quantized_nodes": 0}, batch_dependent=True)]
    with pytest.raises(VariantFailed) as failure:
        run_ladder(_context(), "int8", rungs)
    entry = failure.value.entry
    assert entry["stage"] == "quantization"
    assert entry["reason"].startswith("the last int8 recipe quantized no operator")
    assert [attempt.get("skipped") for attempt in entry["attempts"]] == [
        None, "no operator of this graph was quantized"]


def test_a_variant_that_crashes_or_misses_its_gate_is_an_entry_with_its_stage() -> None:
    def crash(context: Any) -> BuiltVariant:
        raise RuntimeError("NNCF fell over\nsecond line")

    def miss(context: Any, variant: str, built: BuiltVariant) -> None:
        raise VariantFailed("validation", "spearman too low", fidelity=built.fidelity,
                            **built.attempts())

    def crash_after_gate(context: Any, variant: str, built: BuiltVariant) -> None:
        raise ValueError("bf16 run failed")

    built = BuiltVariant({"spearman": 0.5}, quantization={"attempts": [{"rung": 1}]})
    steps = {
        "crashes": VariantStep(crash),
        "misses": VariantStep(lambda context: built, gate=miss),
        "late": VariantStep(lambda context: built, gate=lambda *args: None,
                            after_gate=crash_after_gate),
        "passes": VariantStep(lambda context: built, gate=lambda *args: None)}
    assert pipeline._build_variant(_context(), "crashes", steps["crashes"]) == {
        "stage": "build", "reason": "RuntimeError: NNCF fell over"}
    assert pipeline._build_variant(_context(), "misses", steps["misses"]) == {
        "stage": "validation", "reason": "spearman too low", "fidelity": {"spearman": 0.5},
        "attempts": [{"rung": 1}]}
    assert pipeline._build_variant(_context(), "late", steps["late"]) == {
        "stage": "build", "reason": "ValueError: bf16 run failed", "attempts": [{"rung": 1}]}
    assert pipeline._build_variant(_context(), "passes", steps["passes"]) is built


def test_the_families_answer_what_the_pipeline_asked_by_name() -> None:
    tokenizer = SimpleNamespace(model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    deberta_v3 = SimpleNamespace(model_type="deberta-v2", type_vocab_size=0)
    deberta_v2 = SimpleNamespace(model_type="deberta-v2", type_vocab_size=2)
    assert family_for(deberta_v3).input_names(tokenizer, deberta_v3) == (
        "input_ids", "attention_mask")
    assert family_for(deberta_v2).input_names(tokenizer, deberta_v2) == (
        "input_ids", "attention_mask", "token_type_ids")
    qwen3 = SimpleNamespace(model_type="qwen3", num_labels=2)
    bert = SimpleNamespace(model_type="bert", num_labels=1)
    assert family_for(qwen3).num_labels(qwen3, RERANK) == 1  # one output: yes - no
    assert family_for(bert).num_labels(bert, RERANK) == 1
    assert family_for(bert).num_labels(SimpleNamespace(num_labels=3), EMBEDDING) == 1
    assert family_for(qwen3).ov_int8_mode == "weight_only"
    heads = {family.name: family.cls_head_classes for family in families()}
    assert heads["xlm-roberta"] == ("RobertaForSequenceClassification",
                                    "XLMRobertaForSequenceClassification")
    assert heads["electra"] == ("ElectraForSequenceClassification",)


def test_every_cross_encoder_family_carries_its_checkpoint_configuration() -> None:
    cross_encoders = sorted(family.name for family in families() if not family.uses_recipe)
    assert sorted(FAMILY_NAMES) == cross_encoders
    for name in FAMILY_NAMES:
        checkpoint = checkpoint_config(name)
        assert checkpoint.architecture.endswith("ForSequenceClassification")
        assert checkpoint.full["num_hidden_layers"] >= 6
    with pytest.raises(ValueError, match="family must be one of"):
        checkpoint_config("decoder")


def test_the_pipeline_asks_no_family_by_name() -> None:
    for module in ("pipeline", "variants", "ladder", "gate", "prune"):
        text = Path(pipeline.__file__).with_name(f"{module}.py").read_text("utf-8")
        for name in ("deberta", "modernbert", "qwen", "model_type ==", "family.name =="):
            assert name not in text.lower(), f"{module}.py names {name!r}"


def test_the_task_is_read_once_by_name_and_answers_for_itself() -> None:
    assert export_task("rerank") is RERANK and export_task("embedding") is EMBEDDING
    assert list(EXPORT_TASKS) == ["rerank", "embedding"]
    with pytest.raises(ValueError, match=re.escape(
            "task must be 'rerank' or 'embedding', got 'classify'")):
        export_task("classify")
    with pytest.raises(ValueError, match=re.escape(
            "task must be 'rerank' or 'embedding', got 'classify'")):
        pipeline.ExportRequest(task="classify")
    config = SimpleNamespace(num_labels=1, hidden_size=384)
    assert [(task.output_name, task.activation, task.num_labels(config), task.embedding_dim(config),
             task.has_head, task.takes_recipe, task.cls_only_blocker is None)
            for task in (RERANK, EMBEDDING)] == [
        ("logits", "sigmoid", 1, None, True, True, True),
        ("embeddings", "none", 1, 384, False, False, False)]
    assert RERANK.notes(standin=False) == "" and "stand-in" in RERANK.notes(standin=True)
    assert EMBEDDING.notes(standin=True) == EMBEDDING.notes(standin=False)
    # a reranker's rows are the pairs; an embedder's each distinct text once, queries first
    encoder = SimpleNamespace(encode=lambda items: list(items))
    pairs = [("q1", "a"), ("q1", "b"), ("q2", "a")]
    assert RERANK.validation_rows(encoder, pairs) == (pairs, [])
    assert EMBEDDING.validation_rows(encoder, pairs) == (
        ["q1", "q2", "a", "b"], [(0, 2), (0, 3), (1, 2)])
