"""The ONNX embedder on the bag-of-words model, whose output the test can recompute."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from onnxrank.engine.embedder import Embedder
from onnxrank.engine.runtime import resolve_model_dir
from onnxrank.errors import ModelLoadError

TEXTS = ["heat conduction in slabs", "", "wing " * 400, "Shear flow past a flat plate", "a"]


def expected_embeddings(embedder: Embedder, texts: list[str]) -> np.ndarray:
    from retrieval_fixtures import embedding_table
    from tokenizers import Tokenizer

    table = embedding_table()
    tokenizer = Tokenizer.from_file(str(embedder.model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(embedder.spec.max_length)
    rows = []
    for encoding in tokenizer.encode_batch(texts):
        mean = table[encoding.ids].mean(axis=0)
        rows.append(mean / max(np.linalg.norm(mean), 1e-9))
    return np.asarray(rows, dtype=np.float32)


def test_embeddings_match_the_model_formula(bow_embedder: Embedder) -> None:
    actual = bow_embedder.embed(TEXTS)
    expected = expected_embeddings(bow_embedder, TEXTS)
    assert actual.dtype == np.float32 and actual.shape == (len(TEXTS), 32)
    np.testing.assert_allclose(
        actual, expected, atol=1e-5, err_msg=f"bow-embedder: {actual[:, :3]} vs {expected[:, :3]}"
    )


def test_long_texts_are_truncated_to_max_length(bow_embedder: Embedder) -> None:
    # max_length 128 leaves room for 126 words: a word after that cannot change the embedding.
    long_text, tail = "wing " * 200, " heat conduction"
    vectors = bow_embedder.embed([long_text, long_text + tail, "wing " * 100 + tail])
    np.testing.assert_allclose(vectors[0], vectors[1], atol=1e-6)
    assert not np.allclose(vectors[0], vectors[2], atol=1e-3)


@pytest.mark.parametrize("max_batch_tokens", [128, 300, 100_000])
def test_batching_does_not_change_embeddings(
    bow_embedder_dir: Path, bow_embedder: Embedder, max_batch_tokens: int
) -> None:
    other = Embedder.from_dir(bow_embedder_dir, device="cpu", threads=1, max_batch_tokens=max_batch_tokens)
    np.testing.assert_allclose(other.embed(TEXTS), bow_embedder.embed(TEXTS), atol=1e-6)


@pytest.mark.parametrize("pad_to_multiple", [1, 8, 32])
def test_batches_follow_the_engines_plan(bow_embedder_dir: Path, bow_embedder: Embedder,
                                         pad_to_multiple: int) -> None:
    # the reranker's planning (padding multiple included): few distinct shapes, whose first runs
    # are what a dynamic-shape runtime pays for; onnxruntime charges nothing per run, so each
    # padded length runs apart
    texts = [" ".join(["wing"] * words) for words in range(1, 40)]
    other = Embedder.from_dir(bow_embedder_dir, device="cpu", backend="onnxruntime", threads=1,
                              pad_to_multiple=pad_to_multiple)
    run = other.embed_detailed(texts)
    lengths = {length for _, length in run.batches}
    assert all(length % pad_to_multiple == 0 for length in lengths), run.batches
    assert len(lengths) == len({-(-int(n) // pad_to_multiple) for n in run.token_counts})
    np.testing.assert_allclose(run.vectors, bow_embedder.embed(texts), atol=1e-6)


def test_empty_input_and_progress(bow_embedder: Embedder) -> None:
    assert bow_embedder.embed([]).shape == (0, 32)
    assert bow_embedder.embed(["x"], show_progress=True).shape == (1, 32)
    assert bow_embedder.dim == 32


def test_rerank_model_is_refused(bow_reranker_dir: Path) -> None:
    message = (
        f"{bow_reranker_dir} holds a 'rerank' model, but this needs an embedding model exported "
        "with --task embedding, such as models/minilm-embedder"
    )
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        Embedder.from_dir(bow_reranker_dir)


def test_small_batch_budget_is_refused(bow_embedder_dir: Path) -> None:
    with pytest.raises(
        ValueError,
        match=re.escape("max_batch_tokens must be >= the model's max_length (128), got 64"),
    ):
        Embedder.from_dir(bow_embedder_dir, max_batch_tokens=64)


def test_resolve_model_dir(tmp_path: Path, bow_embedder_dir: Path) -> None:
    assert resolve_model_dir(bow_embedder_dir) == bow_embedder_dir
    assert resolve_model_dir("bow-embedder", bow_embedder_dir.parent) == bow_embedder_dir
    with pytest.raises(
        ModelLoadError,
        match=re.escape(
            f"no exported model named 'nope' in {tmp_path.resolve()} and no model directory at "
            f"{Path('nope').resolve()}; export one with `onnxrank export --model nope --out "
            f"{tmp_path / 'nope'}`"
        ),
    ):
        resolve_model_dir("nope", tmp_path)
