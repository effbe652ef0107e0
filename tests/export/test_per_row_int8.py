"""Per-row int8 (MatMulNBits, one activation scale per token) on the tiny reranker: which nodes
turn int8, the manifest's record, fidelity against the fp32 graph and batch independence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from onnxrank.engine.runtime import open_model_file, pad_rows
from onnxrank.engine.spec import load_model_spec
from onnxrank.engine.tokenize import PairEncoder, load_tokenizer
from onnxrank.export.fidelity import score_metrics
from onnxrank.export.quantize import Int8Settings, head_projections, quantize_int8
from onnxrank.export.validate import load_validation_pairs

ROWS = 64


@pytest.fixture(scope="module")
def per_row(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    fp32 = tiny_model_dir / "model.onnx"
    out = tmp_path_factory.mktemp("per-row") / "int8.onnx"
    record = quantize_int8(fp32_path=fp32, opt_path=None, out_path=out,
                           settings=Int8Settings("per_row", block_size=32),
                           keep_fp32=dict.fromkeys(head_projections(fp32), "head"))
    return out, record


def _scores(path: Path, rows: list, pad_id: int, *, batch: int) -> np.ndarray:
    runner = open_model_file(path, precision="int8" if "int8" in path.name else "fp32", threads=1)
    return np.concatenate([runner.run(pad_rows(rows[start:start + batch], pad_id))[:, 0]
                           for start in range(0, len(rows), batch)])


def test_every_encoder_matmul_is_int8_and_the_record_says_what_stayed_fp32(
        tiny_model_dir: Path, per_row: tuple[Path, dict]) -> None:
    out, record = per_row
    fp32_graph = onnx.load(str(tiny_model_dir / "model.onnx"), load_external_data=False).graph
    weights = {tensor.name for tensor in fp32_graph.initializer}
    weight_matmuls = {node.name for node in fp32_graph.node
                      if node.op_type == "MatMul" and node.input[1] in weights}
    nodes = {node.name: node for node in onnx.load(str(out)).graph.node}
    assert {name for name, node in nodes.items() if node.op_type == "MatMulNBits"} == weight_matmuls
    for name in weight_matmuls:
        attributes = {attribute.name: onnx.helper.get_attribute_value(attribute)
                      for attribute in nodes[name].attribute}
        assert (attributes["bits"], attributes["block_size"], attributes["accuracy_level"]) == (8, 32, 4)
    assert record["quantized_nodes"] == len(weight_matmuls)
    assert record["nodes_kept_fp32"] == {"/model/bert/pooler/dense/Gemm": "head",
                                         "/model/classifier/Gemm": "head"}
    assert all(nodes[name].op_type == "Gemm" for name in record["nodes_kept_fp32"])
    share = record["int8_gemm_flops_share"]
    assert share["tokens"] == 128 and 0.6 <= share["share"] < 1.0
    # no position-0 split: no float product, so nothing stored fp16 (the tables keep fp32)
    assert record["float_weights_stored_fp16"]["tensors"] == []
    assert all(tensor.data_type != onnx.TensorProto.FLOAT16
               for tensor in onnx.load(str(out)).graph.initializer)


def test_scores_follow_fp32_and_not_the_batch_mates(tiny_model_dir: Path,
                                                    per_row: tuple[Path, dict]) -> None:
    spec = load_model_spec(tiny_model_dir)
    pairs = load_validation_pairs(ROWS)
    rows = PairEncoder(load_tokenizer(spec, tiny_model_dir), spec.max_length).encode(
        [(pair.query, pair.passage) for pair in pairs])
    assert len({len(row.ids) for row in rows}) > 20  # mixed lengths, padded together below
    out, _ = per_row
    reference = _scores(tiny_model_dir / "model.onnx", rows, spec.pad_token_id, batch=ROWS)
    alone = _scores(out, rows, spec.pad_token_id, batch=1)
    together = _scores(out, rows, spec.pad_token_id, batch=ROWS)
    effect = float(np.abs(alone - together).max())
    assert effect <= 1e-3 * reference.std(), f"batch effect {effect:.2e}, std {reference.std():.3f}"
    metrics = score_metrics(reference, together, [pair.group for pair in pairs])
    # the gate's own metrics, at the export's per-query floor; top-10 at 0.9, below the gate's
    # 0.95: three groups of 30 scored by a tiny random model move 1 in 15 of their top ten
    assert metrics["spearman_per_query_mean"] >= 0.98, metrics
    assert metrics["top10_overlap"] >= 0.9, metrics
    # and it is int8: not the fp32 scores to float rounding
    assert np.abs(together - reference).max() > 1e-5


def test_a_missed_gate_measures_each_layer_group_and_keeps_the_most_sensitive_fp32(
        tiny_checkpoint_dir: Path, tmp_path: Path) -> None:
    from child_process import in_child_process

    from onnxrank.export.fidelity import FidelityThresholds
    from onnxrank.export.pipeline import ExportRequest, export_model

    # a per-query floor of 1.0 only fp32 meets: the search measures both layers, keeps one fp32
    result = in_child_process(export_model, ExportRequest(
        model=str(tiny_checkpoint_dir), out_dir=tmp_path / "m", variants=("fp32", "int8"),
        int8=(Int8Settings("per_row", search_fp32_groups=1),), validation_pairs=16,
        thresholds=FidelityThresholds(int8_min_spearman_per_query=1.0)))
    failed = result.spec.failed_variants["int8"]
    (attempt,) = failed["attempts"]
    table = attempt["sensitivity"]["groups"]
    assert [(row["group"], row["nodes"]) for row in table] == [(0, 6), (1, 6)]
    most_sensitive = max(table, key=lambda row: row["spearman_per_query_mean"])["group"]
    layer_kept = {name: why for name, why in attempt["nodes_kept_fp32"].items()
                  if why.startswith("sensitivity search")}
    assert len(layer_kept) == 6
    assert set(layer_kept.values()) == {f"sensitivity search: layer group {most_sensitive} fp32"}
    assert all(f"layer.{most_sensitive}/" in name for name in layer_kept)
    assert attempt["quantized_nodes"] == 6  # the other group stayed int8


def test_the_search_leaves_position_0_float_out_of_its_groups(tiny_checkpoint_dir: Path,
                                                              tmp_path: Path) -> None:
    from child_process import in_child_process

    from onnxrank.export.fidelity import FidelityThresholds
    from onnxrank.export.pipeline import ExportRequest, export_model

    # ratio 0 splits position 0 off every MatMul that sees every row (a random tiny model has no
    # massive [CLS] activations); the floor only fp32 meets makes the search run
    result = in_child_process(export_model, ExportRequest(
        model=str(tiny_checkpoint_dir), out_dir=tmp_path / "m", variants=("fp32", "int8"),
        int8=(Int8Settings("per_row", search_fp32_groups=1, cls_row_ratio=0.0),),
        validation_pairs=16, thresholds=FidelityThresholds(int8_min_spearman_per_query=1.0)))
    (attempt,) = result.spec.failed_variants["int8"]["attempts"]
    split = attempt["float_cls_row"]
    # layer 0: its 6 products split; layer 1 (pruned to [CLS]): keys and values split, its other
    # 4 products see position 0 only and stay fp32 whatever the search keeps
    assert (len(split["split"]), len(split["first_row_only"])) == (8, 4)
    table = attempt["sensitivity"]["groups"]
    assert [(row["group"], row["nodes"]) for row in table] == [(0, 6), (1, 2)]
    kept = attempt["nodes_kept_fp32"]
    assert all(kept[name + "/cls_row"] == "position 0 of a split MatMul (float side path)"
               for name in split["split"])


@pytest.mark.parametrize(("passing", "validations"), [(1, 3), (2, 4)])
def test_the_search_measures_the_best_group_once(monkeypatch: pytest.MonkeyPatch, passing: int,
                                                 validations: int) -> None:
    from types import SimpleNamespace

    from onnxrank.export import sensitivity

    on_disk: list[frozenset[str]] = []  # the fp32 groups of the file last written
    validated: list[frozenset[str]] = []
    gains = {"g0": 0.5, "g1": 0.9, "g2": 0.7}  # group 1 gains most, then group 2

    def quantize_per_row(path, out, *, block_size, keep_fp32, cls_rows):  # type: ignore[no-untyped-def]
        assert cls_rows is None  # the recipe splits nothing off
        on_disk.append(frozenset(why.split()[-2] for why in keep_fp32.values()))
        return {"method": "per_row", "kept": sorted(keep_fp32)}

    def validate_file(context, variant):  # type: ignore[no-untyped-def]
        validated.append(on_disk[-1])
        return {sensitivity.METRIC: sum(gains[f"g{group}"] for group in on_disk[-1])}, {}

    monkeypatch.setattr(sensitivity, "layer_groups", lambda path, keep: [["g0"], ["g1"], ["g2"]])
    monkeypatch.setattr(sensitivity, "quantize_per_row", quantize_per_row)
    monkeypatch.setattr(sensitivity, "validate_file", validate_file)
    monkeypatch.setattr(sensitivity, "tuning_failures", lambda context, variant, metrics: (
        [] if metrics[sensitivity.METRIC] >= sum(sorted(gains.values())[-passing:]) - 1e-9
        else ["misses"]))
    context = SimpleNamespace(paths={"fp32": "fp32", "int8": "int8"},
                              progress=SimpleNamespace(step=lambda name: None))
    record = sensitivity.search_per_row(context, Int8Settings("per_row", search_fp32_groups=3), {})
    chosen = frozenset(["1", "2"][:passing])
    assert len(validated) == validations and validated.count(frozenset("1")) == 1
    assert on_disk[-1] == chosen  # the kept file is the chosen groups'
    assert record["kept"] == sorted(f"g{group}" for group in chosen)
    assert [row["group"] for row in record["sensitivity"]["groups"]] == [0, 1, 2]
