"""Last layer for [CLS] only: the pruned export matches the full graph and really computes one row."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from child_process import in_child_process

from onnxrank.cli import main
from onnxrank.engine.runtime import open_model_file, pad_rows
from onnxrank.engine.spec import load_model_spec
from onnxrank.engine.tokenize import PairEncoder, load_tokenizer
from onnxrank.export.families import family_for
from onnxrank.export.prune import cls_only_model, cls_only_support
from onnxrank.export.quantize import ffn_up_projections
from onnxrank.export.validate import length_batches, load_validation_pairs, run_batches


@pytest.fixture(scope="module")
def unpruned_dir(tiny_checkpoint_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint exported with the rewrite switched off (fp32 and opt only)."""
    out = tmp_path_factory.mktemp("unpruned") / "tiny-full"
    assert in_child_process(main, ["export", "--model", str(tiny_checkpoint_dir), "--out", str(out),
                                   "--quiet", "--variants", "fp32,opt", "--validation-pairs", "48",
                                   "--no-cls-only-last-layer"]) == 0
    return out


def _scores(path: Path, rows: list, pad_id: int) -> np.ndarray:  # type: ignore[type-arg]
    runner = open_model_file(path, precision="fp32", threads=1)
    return run_batches(length_batches(rows, pad_id), runner.run, len(rows))[:, 0]


def test_cls_only_export_matches_the_full_graph(tiny_model_dir: Path, unpruned_dir: Path) -> None:
    pruned, full = load_model_spec(tiny_model_dir), load_model_spec(unpruned_dir)
    assert pruned.graph_rewrites["cls_only_last_layer"]["applied"] is True
    assert full.graph_rewrites["cls_only_last_layer"] == {
        "applied": False, "reason": "switched off (--no-cls-only-last-layer)"}
    pairs = [(pair.query, pair.passage) for pair in load_validation_pairs()]
    rows = PairEncoder(load_tokenizer(pruned, tiny_model_dir), pruned.max_length).encode(pairs)
    for name in ("model.onnx", "model_opt.onnx"):
        pruned_scores = _scores(tiny_model_dir / name, rows, pruned.pad_token_id)
        full_scores = _scores(unpruned_dir / name, rows, full.pad_token_id)
        np.testing.assert_allclose(
            pruned_scores, full_scores, atol=1e-4, rtol=0,
            err_msg=f"tiny model {name}: [CLS]-only last layer vs the full graph on all the validation pairs")
    # the unpruned graph fuses attention in every layer, the pruned one in all but the last
    assert full.variants["opt"].optimization["fusions"]["Attention"] == 2
    assert pruned.variants["opt"].optimization["fusions"]["Attention"] == 1


def _last_ffn_output_shape(path: Path, feeds: dict[str, np.ndarray]) -> tuple[int, ...]:
    """Shape of the last layer's feed-forward up-projection output, read from a real run."""
    model = onnx.load(str(path))
    name = ffn_up_projections(path)[-1]
    tensor = next(node for node in model.graph.node if node.name == name).output[0]
    model.graph.output.append(onnx.helper.make_tensor_value_info(tensor, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return tuple(session.run([tensor], feeds)[0].shape)


def test_pruned_last_layer_computes_one_row(tiny_model_dir: Path, unpruned_dir: Path) -> None:
    spec = load_model_spec(tiny_model_dir)
    rows = PairEncoder(load_tokenizer(spec, tiny_model_dir), spec.max_length).encode(
        [("a query", "a passage of some words"), ("another query", "x")])
    feeds = pad_rows(rows, spec.pad_token_id)
    batch, length = feeds["input_ids"].shape
    assert _last_ffn_output_shape(tiny_model_dir / "model.onnx", feeds) == (batch, 1, 128)
    assert _last_ffn_output_shape(unpruned_dir / "model.onnx", feeds) == (batch, length, 128)


def test_pruned_module_keeps_the_reference_untouched(tiny_checkpoint_dir: Path) -> None:
    from transformers import AutoModel, AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(
        str(tiny_checkpoint_dir), attn_implementation="eager").eval()
    head_classes = family_for(model.config).cls_head_classes
    pruned = cls_only_model(model, head_classes)
    assert type(model.bert.encoder.layer[-1]).__name__ == "BertLayer"
    ids = torch.tensor([[101, 2054, 2003, 102, 1037, 3231, 102, 0]])
    mask = (ids != 0).long()
    with torch.inference_mode():
        full_hidden = model.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        pruned_hidden = pruned.bert(input_ids=ids, attention_mask=mask).last_hidden_state
    assert pruned_hidden.shape == (1, 1, 64)
    torch.testing.assert_close(pruned_hidden[:, 0], full_hidden[:, 0], atol=1e-5, rtol=0)
    encoder = AutoModel.from_pretrained(str(tiny_checkpoint_dir))
    assert cls_only_support(encoder, head_classes) == \
        "BertModel is not one of BertForSequenceClassification"
    with pytest.raises(ValueError, match=re.escape(
            "cannot prune the last layer to [CLS] only: BertModel is not one of")):
        cls_only_model(encoder, head_classes)
