"""Late-interaction exports of every layout score like sentence-transformers' MultiVectorEncoder
(each document encoded alone, MaxSim), through `Reranker.from_dir(OUT).score(pairs)`."""

from __future__ import annotations

import json
import re
import shutil
import string
from pathlib import Path

import numpy as np
import pytest
from colbert_checkpoints import reference_model

from onnxrank.engine.late_interaction import LateInteractionReranker
from onnxrank.engine.reranker import Reranker
from onnxrank.errors import ExportError, FidelityError, ModelLoadError
from onnxrank.export.fidelity import FidelityThresholds
from onnxrank.export.pipeline import ExportRequest, export_model
from onnxrank.export.quantize import Int8Settings

pytestmark = pytest.mark.costly(40)

QUERY = "what is the lift, of a thin wing at high speed?"
DOCUMENTS = [
    "The lift of a thin wing in supersonic flow is computed; results agree with experiment.",
    "Heat transfer in laminar boundary layers!",
    "An experimental study of wing flutter at high speed.",
    "wing",
    "Transition of the boundary layer on a flat plate was measured, again and again, " * 4,
    "",
]


def reference_scores(checkpoint_dir: Path, query: str, documents: list[str]) -> np.ndarray:
    """MultiVectorEncoder's MaxSim of the query against each document encoded alone (not
    pylate.rank.rerank's zero-padded batch, whose scores depend on list mates)."""
    model = reference_model(checkpoint_dir)
    query_vectors = model.encode_query([query], convert_to_numpy=True)
    return np.asarray([float(model.similarity(
        query_vectors, model.encode_document([document], convert_to_numpy=True))[0, 0])
        for document in documents])


def test_scores_match_the_reference(layout: str, checkpoint_dir: Path, model_dir: Path) -> None:
    reranker = Reranker.from_dir(model_dir, device="cpu", precision="fp32")
    assert isinstance(reranker, LateInteractionReranker)
    scores = reranker.score([(QUERY, document) for document in DOCUMENTS])
    expected = reference_scores(checkpoint_dir, QUERY, DOCUMENTS)
    spread = float(expected.std())
    assert np.abs(scores - expected).max() <= 1e-3 * spread, (
        f"{layout}: onnxrank {scores} against MultiVectorEncoder {expected}")
    ranked = reranker.rerank(QUERY, DOCUMENTS)
    assert [item.index for item in ranked] == list(np.argsort(-expected, kind="stable"))
    np.testing.assert_allclose([item.score for item in ranked], np.sort(scores)[::-1], rtol=0,
                               atol=1e-6)  # rerank is score plus a sort, activation "none"


def test_token_vectors_match_the_reference(checkpoint_dir: Path, model_dir: Path) -> None:
    reranker = Reranker.from_dir(model_dir, device="cpu", precision="fp32")
    assert isinstance(reranker, LateInteractionReranker)
    model = reference_model(checkpoint_dir)
    ours = reranker.encode_documents(DOCUMENTS)
    theirs = [np.asarray(model.encode_document([document], convert_to_numpy=True)[0])
              for document in DOCUMENTS]
    assert [vectors.shape for vectors in ours] == [vectors.shape for vectors in theirs]
    for mine, reference in zip(ours, theirs):
        np.testing.assert_allclose(mine, reference, atol=1e-5, rtol=0)
    query = reranker.encode_queries([QUERY])[0]
    np.testing.assert_allclose(query, model.encode_query([QUERY], convert_to_numpy=True)[0],
                               atol=1e-5, rtol=0)


def test_each_document_is_scored_alone(bert_model_dir: Path) -> None:
    reranker = Reranker.from_dir(bert_model_dir, device="cpu", precision="fp32")
    assert isinstance(reranker, LateInteractionReranker)
    together = reranker.score([(QUERY, document) for document in DOCUMENTS])
    alone = np.concatenate([reranker.score([(QUERY, document)]) for document in DOCUMENTS])
    np.testing.assert_allclose(together, alone, atol=1e-5, rtol=0)
    small = Reranker.from_dir(bert_model_dir, device="cpu", precision="fp32",
                              max_batch_tokens=64, max_batch_size=2)
    np.testing.assert_allclose(small.score([(QUERY, d) for d in DOCUMENTS]), together,
                               atol=1e-5, rtol=0)
    # a deadline long enough for every batch scores every document as without one
    timed = reranker.rerank(QUERY, DOCUMENTS, deadline_ms=60_000.0)
    assert all(item.reranked for item in timed)
    np.testing.assert_allclose(sorted(item.score for item in timed), np.sort(together),
                               atol=1e-6, rtol=0)
    # one past its deadline before the first batch scores nothing, in retrieval order
    late = reranker.rerank(QUERY, DOCUMENTS, deadline_ms=1e-9)
    assert [(item.index, item.reranked) for item in late] == [
        (index, False) for index in range(len(DOCUMENTS))]
    stored = reranker.encode_documents(DOCUMENTS)
    np.testing.assert_allclose(reranker.score_vectors(QUERY, stored), together, atol=1e-6, rtol=0)


def test_manifest_records_the_settings(bert_model_dir: Path) -> None:
    manifest = json.loads((bert_model_dir / "manifest.json").read_text())
    vocabulary = json.loads((bert_model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    settings = manifest["late_interaction"]
    assert manifest["task"] == "late_interaction" and manifest["activation"] == "none"
    assert (settings["query_prefix_id"], settings["document_prefix_id"]) == (
        vocabulary["[unused0]"], vocabulary["[unused1]"])
    assert settings["skiplist_ids"] == sorted(
        vocabulary[mark] for mark in string.punctuation if mark in vocabulary)
    assert (settings["query_length"], settings["document_length"], settings["dim"]) == (16, 48, 16)
    assert settings["query_expansion"] and not settings["attend_to_expansion_tokens"]
    assert set(manifest["variants"]) == {"fp32", "int8"} and not manifest["failed_variants"]
    # the ladder's first rung, per-row int8 with no row in float: every token's vector is scored
    int8_record = manifest["variants"]["int8"]
    assert int8_record["fidelity"]["attempts"] == []
    assert int8_record["quantization"]["method"].startswith("per_row")
    assert int8_record["quantization"]["float_cls_row"] is None
    assert int8_record["quantization"]["quantized_nodes"] > 0
    int8 = Reranker.from_dir(bert_model_dir, device="cpu", precision="int8")
    assert int8.device_info.precision == "int8"
    assert np.isfinite(int8.score([(QUERY, document) for document in DOCUMENTS])).all()


def test_bad_input_is_refused(bert_model_dir: Path) -> None:
    reranker = Reranker.from_dir(bert_model_dir, device="cpu", precision="fp32")
    assert isinstance(reranker, LateInteractionReranker)
    with pytest.raises(ValueError, match=re.escape("query must be a non-empty string, got ' '")):
        reranker.rerank(" ", DOCUMENTS)
    with pytest.raises(ValueError, match=re.escape("query must be a non-empty string, got ''")):
        reranker.encode_queries([""])
    with pytest.raises(ValueError, match=re.escape("document_vectors[0] must be [rows, 16], got "
                                                   "shape (3, 8)")):
        reranker.score_vectors(QUERY, [np.zeros((3, 8), np.float32)])
    assert reranker.rerank(QUERY, []) == []


def test_a_malformed_config_is_refused_at_export(bert_checkpoint_dir: Path,
                                                 tmp_path: Path) -> None:
    source = tmp_path / "broken"
    shutil.copytree(bert_checkpoint_dir, source)
    config_path = source / "config_sentence_transformers.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "query_length": "32"}))
    with pytest.raises(ExportError, match=re.escape(
            f"malformed late-interaction config {config_path}: query_length must be an int >= 4, "
            "got '32'")):
        export_model(ExportRequest(model=str(source), out_dir=tmp_path / "out"))
    config_path.write_text(json.dumps({**config, "query_prefix": "[Q] "}))
    with pytest.raises(ExportError, match=re.escape(
            f"the query prefix '[Q] ' of {source} is not one token of its tokenizer")):
        export_model(ExportRequest(model=str(source), out_dir=tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_a_malformed_manifest_is_refused_at_load(bert_model_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(bert_model_dir, broken)
    manifest = json.loads((broken / "manifest.json").read_text())
    del manifest["late_interaction"]["dim"]
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelLoadError, match=re.escape(
            f"malformed manifest {broken / 'manifest.json'}: late_interaction needs exactly the "
            "fields attend_to_expansion_tokens, dim, document_length, document_prefix_id, "
            "expansion_token_id, query_expansion, query_length, query_prefix_id, skiplist_ids; "
            "missing ['dim'], unknown []")):
        Reranker.from_dir(broken, device="cpu", precision="fp32")


def test_gates_are_enforced(bert_checkpoint_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FidelityError, match=re.escape(
            "the fp32 token-vector graph failed validation against the PyTorch reference: "
            "variant fp32 (tuning pairs): max_abs_diff_scaled = ")):
        export_model(ExportRequest(model=str(bert_checkpoint_dir), out_dir=tmp_path / "strict",
                                   variants=("fp32",), validation_pairs=16,
                                   thresholds=FidelityThresholds(fp32_max_abs_diff=0.0)))
    assert not (tmp_path / "strict").exists()
    # no int8 file can keep more than all of the top 10: int8 is left out with its attempt
    result = export_model(ExportRequest(
        model=str(bert_checkpoint_dir), out_dir=tmp_path / "out", variants=("fp32", "int8"),
        validation_pairs=16, int8=(Int8Settings("per_row"),),
        thresholds=FidelityThresholds(int8_min_top10_overlap=1.01)))
    assert list(result.spec.variants) == ["fp32"]
    entry = result.spec.failed_variants["int8"]
    assert entry["stage"] == "validation" and len(entry["attempts"]) == 1
    assert "top10_overlap" in entry["reason"]
    assert Reranker.from_dir(result.model_dir, device="cpu").device_info.precision == "fp32"
