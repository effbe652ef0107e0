"""The bench's ColBERT stand-in (onnxrank.bench.late_checkpoint), tiny size: it exports through
the real `onnxrank export`, scores like sentence-transformers' MultiVectorEncoder on the checkpoint,
and drives the retrieval cascade scenario of a quick `onnxrank bench` run."""

from __future__ import annotations

import json
import string
import subprocess
import sys
from pathlib import Path

import bench_outside_xdist
import numpy as np
import pytest
import torch
import transformers
import worker_cores

from onnxrank.bench.late_checkpoint import (
    DIM,
    DOCUMENT_LENGTH,
    QUERY_LENGTH,
    build_late_checkpoint,
    sample_texts,
    spread_projection,
)
from onnxrank.cli import main
from onnxrank.engine.late_interaction import LateInteractionReranker
from onnxrank.engine.reranker import Reranker
from onnxrank.export.standin import package_model_dir, read_marker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "late_interaction"))
from test_late_interaction import DOCUMENTS, QUERY, reference_scores  # noqa: E402

pytestmark = pytest.mark.costly(40)


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("late-checkpoint") / "colbert"
    build_late_checkpoint(directory, size="tiny", seed=0)
    return directory


@pytest.fixture(scope="module")
def late_model_dir(checkpoint_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("late-model") / "colbert-standin"
    assert main(["export", "--model", str(checkpoint_dir), "--out", str(out), "--variants",
                 "fp32", "--validation-pairs", "16", "--quiet"]) == 0
    return out


def test_the_export_scores_like_multivectorencoder(checkpoint_dir: Path,
                                                   late_model_dir: Path) -> None:
    reranker = Reranker.from_dir(late_model_dir, device="cpu", precision="fp32")
    assert isinstance(reranker, LateInteractionReranker)
    scores = reranker.score([(QUERY, document) for document in DOCUMENTS])
    expected = reference_scores(checkpoint_dir, QUERY, DOCUMENTS)
    assert np.abs(scores - expected).max() <= 1e-3 * float(expected.std()), (
        f"tiny ColBERT stand-in: onnxrank {scores} against MultiVectorEncoder {expected}")


def test_the_manifest_says_what_was_built(checkpoint_dir: Path, late_model_dir: Path) -> None:
    manifest = json.loads((late_model_dir / "manifest.json").read_text())
    vocabulary = json.loads((late_model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    settings = manifest["late_interaction"]
    assert manifest["task"] == "late_interaction" and manifest["relevance_trained"] is False
    assert (settings["query_prefix_id"], settings["document_prefix_id"]) == (
        vocabulary["[unused0]"], vocabulary["[unused1]"])
    assert (settings["query_length"], settings["document_length"], settings["dim"]) == (
        QUERY_LENGTH, DOCUMENT_LENGTH, DIM)
    assert settings["skiplist_ids"] == sorted(
        vocabulary[mark] for mark in string.punctuation if mark in vocabulary)
    marker = read_marker(checkpoint_dir)
    assert marker is not None and marker["relevance_trained"] is False
    assert "NOT relevance-trained" in marker["note"]


def test_the_projection_drops_the_shared_direction_and_scales_its_rows() -> None:
    source = package_model_dir()
    torch.manual_seed(0)
    encoder = transformers.BertModel(transformers.BertConfig(
        vocab_size=transformers.BertConfig.from_pretrained(str(source)).vocab_size,
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    texts = sample_texts()[:8]
    weight = spread_projection(encoder, tokenizer, texts, seed=3)
    assert weight.shape == (DIM, 32)
    batch = tokenizer(texts, truncation=True, max_length=DOCUMENT_LENGTH, padding=True,
                      return_tensors="pt")
    with torch.inference_mode():
        states = encoder(**batch).last_hidden_state[batch["attention_mask"].bool()]
    projected = states @ weight.T
    np.testing.assert_allclose(projected.std(dim=0).numpy(), np.ones(DIM), rtol=1e-4)
    # the states' mean direction is gone from every row: the mean state projects to ~0
    assert float((states.mean(dim=0) @ weight.T).abs().max()) < 1e-4 * float(projected.abs().max())
    np.testing.assert_array_equal(
        weight.numpy(), spread_projection(encoder, tokenizer, texts, seed=3).numpy())
    assert not np.allclose(weight.numpy(), spread_projection(encoder, tokenizer, texts,
                                                             seed=4).numpy())


def test_a_quick_bench_runs_the_cascade_with_it(late_model_dir: Path, tiny_model_dir: Path,
                                                tiny_embedder_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "report"
    completed = subprocess.run(
        [sys.executable, "-m", "onnxrank", "bench", "--quick", "--scenarios", "retrieval_stages",
         "--device", "cpu", "--threads", "1", "--model", str(tiny_model_dir), "--embedder",
         str(tiny_embedder_dir), "--late-model", str(late_model_dir), "--out", str(out)],
        cwd=tmp_path, env=bench_outside_xdist.environment(), preexec_fn=worker_cores.all_cores,
        capture_output=True, text=True,
        timeout=600)
    assert completed.returncode == 0, completed.stdout[-4000:] + completed.stderr[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    [row] = [r for r in summary["results"] if r["scenario"] == "retrieval_cascade"]
    assert row["status"] == "measured", row["status"]
    contenders = row["contenders"]
    assert set(contenders) == {"cascade", "cross_alone", "late_stored", "late_fresh",
                               "cascade_late_interaction", "cascade_cross_encoder"}
    assert set(row["ratios"]) == {"cascade/cross_alone", "late_stored/cross_alone",
                                  "late_stored/late_fresh"}
    assert all(ratio["n"] == 2 for ratio in row["ratios"].values())
    agreements = {(name, other): agreement for name, contender in contenders.items()
                  for other, agreement in contender.get("top10_agreement", {}).items()}
    assert set(agreements) == {("cascade", "cross_alone"), ("late_stored", "cross_alone"),
                               ("late_stored", "late_fresh")}
    assert all(agreement["queries"] == 2 and 0.0 <= agreement["min"] <= agreement["mean"] <= 1.0
               for agreement in agreements.values())
    for name in ("cascade", "late_stored", "late_fresh"):
        assert "colbert-standin is NOT relevance-trained" in contenders[name]["label"], name
    assert "NOT relevance-trained" not in contenders["cross_alone"]["label"]
    settings = contenders["cascade"]["settings"]
    assert settings["candidates"] == 100 and settings["late_relevance_trained"] is False
    assert settings["late_runtime"].split()[0] in ("onnxruntime", "openvino")
    assert row["workload"]["candidates_mean"] == 100
    markdown = (out / "summary.md").read_text()
    assert "## Top-10 agreement" in markdown and "late_stored/late_fresh" in markdown
