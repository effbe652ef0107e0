"""The retrieval stack on the shared tiny exported models (real export pipeline, random weights)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from retrieval_fixtures import CORPUS, write_jsonl

from onnxrank import Reranker
from onnxrank.engine.embedder import Embedder
from onnxrank.retrieval import HybridRetriever, build_index

TEXTS = [record["title"] + " " + record["text"] for record in CORPUS] + ["", "word " * 600]


def test_fp32_embeddings_match_sentence_transformers(
    tiny_embedder_dir: Path, tiny_embedder_checkpoint_dir: Path
) -> None:
    import sentence_transformers

    embedder = Embedder.from_dir(tiny_embedder_dir, device="cpu", precision="fp32", threads=1)
    reference = sentence_transformers.SentenceTransformer(str(tiny_embedder_checkpoint_dir), device="cpu")
    reference.max_seq_length = embedder.spec.max_length
    expected = reference.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=False)
    actual = embedder.embed(TEXTS)
    np.testing.assert_allclose(
        actual,
        expected,
        atol=1e-4,
        rtol=0,
        err_msg="tiny-embedder fp32 ONNX vs sentence-transformers",
    )
    np.testing.assert_allclose(np.linalg.norm(actual, axis=1), 1.0, atol=1e-5)


def test_int8_embeddings_stay_close_to_fp32(tiny_embedder_dir: Path) -> None:
    fp32 = Embedder.from_dir(tiny_embedder_dir, device="cpu", precision="fp32", threads=1)
    int8 = Embedder.from_dir(tiny_embedder_dir, device="cpu", backend="onnxruntime", precision="int8",
                             threads=1)
    assert int8.device_info.variant == "int8"
    cosine = np.sum(fp32.embed(TEXTS) * int8.embed(TEXTS), axis=1)
    assert cosine.min() > 0.9, f"tiny-embedder int8 vs fp32 cosine {cosine}"


def test_index_and_rerank_end_to_end(tmp_path: Path, tiny_embedder_dir: Path, tiny_model_dir: Path) -> None:
    embedder = Embedder.from_dir(tiny_embedder_dir, device="cpu", threads=1)
    report = build_index(write_jsonl(tmp_path / "c.jsonl", CORPUS), tmp_path / "i", embedder)
    assert (report.documents, report.chunks) == (6, 6)
    reranker = Reranker.from_dir(tiny_model_dir, device="cpu", threads=1)
    retriever = HybridRetriever.open(tmp_path / "i")  # reloads the embedder named in the manifest
    try:
        hits = retriever.search("heat conduction", k=3, rerank=True, reranker=reranker)
        # the backend and variant the index was built with (auto picks them per machine)
        built, reloaded = embedder.device_info, retriever.embedder.device_info
        assert (reloaded.backend, reloaded.variant) == (built.backend, built.variant)
    finally:
        retriever.close()
    scores = [hit.rerank_score for hit in hits]
    assert all(hit.reranked for hit in hits) and scores == sorted(scores, reverse=True)
