"""The engine's prompt encoder: the model card's token ids, only the document cut, windows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from decoder_commands import uncapped_pairs
from decoder_reference import ModelCardReranker
from tokenizers import Tokenizer

from onnxrank.engine.prompt import PromptEncoder
from onnxrank.engine.tokenize import PairEncoder
from onnxrank.export.recipes import QWEN3_RERANKER

LONG = " ".join(["The flutter of swept wings was measured at transonic speeds."] * 40)


@pytest.fixture(scope="module")
def tokenizer(decoder_checkpoint: Path) -> Tokenizer:
    loaded = Tokenizer.from_file(str(decoder_checkpoint / "tokenizer.json"))
    loaded.no_padding()
    loaded.no_truncation()
    return loaded


def test_rows_are_the_model_cards_token_ids(tokenizer: Tokenizer, model_card: ModelCardReranker) -> None:
    pairs = uncapped_pairs(tokenizer, QWEN3_RERANKER, 24)
    pairs += [("wing flutter", LONG), ("x", ""), ("unicode: naïve façade", "Ünïcödé — text")]
    encoder = PromptEncoder(tokenizer, model_card.max_length, QWEN3_RERANKER)
    rows = encoder.encode(pairs)
    assert [row.ids.tolist() for row in rows] == [model_card.token_ids(q, d) for q, d in pairs]
    assert len(rows[-3].ids) == model_card.max_length  # the long document was cut to fit
    custom = encoder.encode(pairs[:3], instruction="Find aircraft reports")
    assert [row.ids.tolist() for row in custom] == [
        model_card.token_ids(q, d, "Find aircraft reports") for q, d in pairs[:3]]


def test_only_the_document_is_cut(tokenizer: Tokenizer) -> None:
    encoder = PromptEncoder(tokenizer, 256, QWEN3_RERANKER)
    long_query = "flutter " * 400
    row = encoder.encode([(long_query, LONG)])[0].ids.tolist()
    prefix = tokenizer.encode(QWEN3_RERANKER.prefix, add_special_tokens=False).ids
    suffix = tokenizer.encode(QWEN3_RERANKER.suffix, add_special_tokens=False).ids
    assert len(row) == 256 and row[:len(prefix)] == prefix and row[-len(suffix):] == suffix
    # the query keeps half of what the recipe and the instruction leave (its query_share), the
    # document the rest
    kept = encoder.max_query_tokens()
    assert 0 < kept < 128
    query_ids = tokenizer.encode(long_query, add_special_tokens=False).ids
    text = tokenizer.decode(row, skip_special_tokens=False)
    assert tokenizer.decode(query_ids[:kept]) + "\n<Document>: The flutter" in text


def test_windows_cover_the_document(tokenizer: Tokenizer) -> None:
    encoder = PromptEncoder(tokenizer, 256, QWEN3_RERANKER)
    rows = encoder.encode_windows([("wing flutter", LONG), ("q", "short one")],
                                  window_tokens=40, overlap_tokens=8)
    long_rows = [row for row in rows if row.item_index == 0]
    spans = [row.span for row in long_rows]
    assert len(long_rows) > 2 and all(len(row.ids) <= 256 for row in rows)
    assert spans[0][0] == 0 and spans[-1][1] == len(LONG)
    assert all(left[1] > right[0] for left, right in zip(spans, spans[1:]))  # they overlap
    assert [row.span for row in rows if row.item_index == 1] == [(0, len("short one"))]
    whole = encoder.encode_windows([("wing flutter", "short one")], window_tokens=None,
                                   overlap_tokens=8)
    assert [row.ids.tolist() for row in whole] == [
        row.ids.tolist() for row in encoder.encode([("wing flutter", "short one")])]


def test_instruction_errors(tokenizer: Tokenizer) -> None:
    encoder = PromptEncoder(tokenizer, 256, QWEN3_RERANKER)
    with pytest.raises(ValueError, match=re.escape(
            "instruction must be a non-empty string or None (the recipe's default), got '  '")):
        encoder.encode([("q", "d")], instruction="  ")
    with pytest.raises(ValueError, match=re.escape(
            "instruction) leave no room for the query and the document in max_length=256; "
            "shorten the instruction or raise max_length")):
        encoder.encode([("q", "d")], instruction="very long instruction " * 60)
    cross_encoder = PairEncoder(tokenizer, 256)
    with pytest.raises(ValueError, match=re.escape(
            "instruction='Find' applies only to decoder rerankers (models exported with --recipe); "
            "this model is a cross-encoder: leave instruction unset")):
        cross_encoder.encode([("q", "d")], instruction="Find")
