"""The engine runs a decoder reranker through the same API: score, rerank, rerank_many, deadlines,
the cache (keyed by the instruction too), long documents, and the instruction option."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from onnxrank.engine.reranker import DecoderReranker, Reranker

QUERY = "what is known about wing flutter at high speeds"
DOCUMENTS = [
    "The flutter of aircraft wings at transonic speeds was studied in a wind tunnel.",
    "Boundary layer transition on a flat plate.",
    " ".join(["Heat transfer to a blunt body in hypersonic flow was measured."] * 25),
    "wings",
]
INSTRUCTION = "Find reports on aircraft structures"


def test_rerank_and_rerank_many_agree_with_score(fp32_decoder: Reranker) -> None:
    # a decoder reranker is a Reranker whose pairs become prompt rows
    assert type(fp32_decoder) is DecoderReranker and isinstance(fp32_decoder, Reranker)
    scores = fp32_decoder.activate(fp32_decoder.score([(QUERY, d) for d in DOCUMENTS]))
    ranked = fp32_decoder.rerank(QUERY, DOCUMENTS)
    assert [r.index for r in ranked] == list(np.argsort(-scores, kind="stable"))
    assert np.allclose([r.score for r in ranked], np.sort(scores)[::-1], atol=1e-6)
    many = fp32_decoder.rerank_many([(QUERY, DOCUMENTS), ("boundary layer", DOCUMENTS[:2])],
                                    top_k=2, instruction=INSTRUCTION)
    assert [[r.index for r in result] for result in many] == [
        [r.index for r in fp32_decoder.rerank(q, d, top_k=2, instruction=INSTRUCTION)]
        for q, d in [(QUERY, DOCUMENTS), ("boundary layer", DOCUMENTS[:2])]]


def test_the_instruction_is_part_of_the_prompt_and_of_the_cache_key(decoder_model_dir: Path) -> None:
    cached = Reranker.from_dir(decoder_model_dir, device="cpu", backend="onnxruntime",
                               precision="fp32", cache_size=64)
    pairs = [(QUERY, d) for d in DOCUMENTS]
    default = cached.score_detailed(pairs)
    assert cached.score_detailed(pairs).token_counts.tolist() == [0] * len(pairs)  # all hits
    custom = cached.score_detailed(pairs, instruction=INSTRUCTION)
    assert custom.token_counts.min() > 0  # a new instruction misses the cache
    assert not np.allclose(custom.scores, default.scores)
    configured = Reranker.from_dir(decoder_model_dir, device="cpu", backend="onnxruntime",
                                   precision="fp32", instruction=INSTRUCTION)
    assert np.allclose(configured.score(pairs), custom.scores, atol=1e-6)
    with pytest.raises(ValueError, match=re.escape(
            "instruction must be a non-empty string or None (the recipe's default), got ''")):
        cached.rerank(QUERY, DOCUMENTS, instruction="")


def test_deadline_and_long_documents(fp32_decoder: Reranker, decoder_model_dir: Path) -> None:
    relaxed = fp32_decoder.rerank(QUERY, DOCUMENTS, deadline_ms=60_000)
    assert [r.index for r in relaxed] == [r.index for r in fp32_decoder.rerank(QUERY, DOCUMENTS)]
    assert all(r.reranked for r in relaxed)
    hopeless = fp32_decoder.rerank(QUERY, DOCUMENTS, deadline_ms=1e-6)
    assert [(r.index, r.reranked) for r in hopeless] == [(i, False) for i in range(len(DOCUMENTS))]
    chunked = Reranker.from_dir(decoder_model_dir, device="cpu", backend="onnxruntime",
                                precision="fp32", long_documents="max_chunk", window_tokens=48)
    windows = {r.index: r for r in chunked.rerank(QUERY, DOCUMENTS)}
    start, stop = windows[2].span
    assert 0 <= start < stop <= len(DOCUMENTS[2]) and windows[2].span != (0, len(DOCUMENTS[2]))
    assert windows[1].span == (0, len(DOCUMENTS[1]))
    # the first window of a full-width max_chunk run is the truncated row, so its best is no lower
    best = Reranker.from_dir(decoder_model_dir, device="cpu", backend="onnxruntime",
                             precision="fp32", long_documents="max_chunk")
    assert best.score([(QUERY, DOCUMENTS[2])])[0] >= fp32_decoder.score([(QUERY, DOCUMENTS[2])])[0] - 1e-5


def test_the_runtime_probe_times_rows_with_the_prompt(decoder_model_dir: Path) -> None:
    # the probe picks the fastest runtime on the rows the engine will run: prompt included
    from onnxrank.engine.runtime import PROBE_SHAPES, pad_rows
    from onnxrank.engine.spec import load_model_spec
    from onnxrank.engine.tokenize import load_tokenizer

    spec = load_model_spec(decoder_model_dir)
    tokenizer = load_tokenizer(spec, decoder_model_dir)
    tokens = max(tokens for _, tokens in PROBE_SHAPES)
    feeds = pad_rows(DecoderReranker.probe_rows(spec, tokenizer, tokens), spec.pad_token_id)
    recipe = spec.recipe
    assert recipe is not None
    prefix = tokenizer.encode(recipe.prefix, add_special_tokens=False).ids
    assert (feeds["input_ids"][:, :len(prefix)] == prefix).all()
    # the recipe's fixed tokens come on top of the probed pair text, which keeps its length
    assert feeds["attention_mask"].sum(axis=1).max() > tokens
