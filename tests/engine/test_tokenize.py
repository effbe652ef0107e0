"""PairEncoder's spliced rows are exactly the tokenizer's own pair encoding, and TextEncoder's rows
its own truncating single-text encoding, for every kind of post-processor the `tokenizers`
library has."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from onnxrank.engine.plain_tokens import ascii_twin
from onnxrank.engine.rows import RowBudget
from onnxrank.engine.spec import load_model_spec
from onnxrank.engine.text import TextEncoder
from onnxrank.engine.tokenize import PairEncoder, load_tokenizer
from onnxrank.errors import ModelLoadError

PAIRS = [
    ("what is wing flutter", "Flutter is an aeroelastic instability of lifting surfaces."),
    ("empty document", ""),
    ("unicode", "Schrödinger’s équation — naïve café, 東京, emoji 🚀 and  odd   spacing\tand\ttabs"),
    ("long", "boundary layer transition on a flat plate " * 120),
    ("punctuation-heavy query: (a) [b] {c} \"d\" 'e'", "x-y=z; a/b, c.d!"),
    ("query " * 300, "a query longer than half of max_length gets cut to leave the document room"),
]


@pytest.fixture(scope="module")
def encoder(tiny_model_dir: Path) -> PairEncoder:
    spec = load_model_spec(tiny_model_dir)
    return PairEncoder(load_tokenizer(spec, tiny_model_dir), max_length=128)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(128, strategy="only_second")
    return tokenizer


def test_spliced_rows_equal_the_tokenizers_pair_encoding(
    encoder: PairEncoder, reference: Tokenizer
) -> None:
    rows = encoder.encode(PAIRS[:-1])
    for row, (query, document) in zip(rows, PAIRS[:-1]):
        expected = reference.encode(query, document)
        assert row.ids.tolist() == expected.ids, (query, document)
        assert row.type_ids.tolist() == expected.type_ids
        assert row.ids.dtype == np.int64 and len(row.ids) <= 128


def test_long_queries_are_cut_to_half_of_max_length(
    encoder: PairEncoder, reference: Tokenizer
) -> None:
    query, document = PAIRS[-1]
    (row,) = encoder.encode([(query, document)])
    query_tokens = int((row.type_ids == 0).sum()) - 2  # minus [CLS] and the first [SEP]
    assert query_tokens == 64
    # the whole (short) document survives after the cut query
    document_ids = reference.encode(document, add_special_tokens=False).ids
    assert row.ids[-len(document_ids) - 1:-1].tolist() == document_ids


def test_windows_cover_the_document_with_overlap(encoder: PairEncoder, reference: Tokenizer) -> None:
    query, document = PAIRS[3]
    rows = encoder.encode_windows([(query, document)], window_tokens=40, overlap_tokens=10)
    assert len(rows) > 5 and all(row.item_index == 0 for row in rows)
    assert rows[0].span[0] == 0 and rows[-1].span[1] == len(document.rstrip())
    for previous, current in zip(rows, rows[1:]):
        assert current.span[0] < previous.span[1]  # consecutive windows overlap
    # Each window is the pair encoding of its own text (the spans cut at whole words here).
    for row in rows:
        window_text = document[row.span[0]:row.span[1]]
        reference_ids = reference.encode(query, window_text).ids
        assert row.ids.tolist() == reference_ids


WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "<s>", "</s>", "query", "document", "wing",
         "flutter", "is", "an", "of", "the", "lift", "##s", "##ing", "a", "b", ",", "."]
VOCAB = {word: index for index, word in enumerate(WORDS)}
POST_PROCESSORS = {
    "bert": processors.BertProcessing(("[SEP]", VOCAB["[SEP]"]), ("[CLS]", VOCAB["[CLS]"])),
    "roberta": processors.RobertaProcessing(("</s>", VOCAB["</s>"]), ("<s>", VOCAB["<s>"])),
    "template with token types": processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", VOCAB["[CLS]"]), ("[SEP]", VOCAB["[SEP]"])]),
    "template without a prefix": processors.TemplateProcessing(
        single="$A [SEP]", pair="$A:0 [SEP]:1 $B:1 </s>:1",
        special_tokens=[("[SEP]", VOCAB["[SEP]"]), ("</s>", VOCAB["</s>"])]),
    "byte-level (no special tokens)": processors.ByteLevel(trim_offsets=False),
    "sequence": processors.Sequence([
        processors.ByteLevel(trim_offsets=True),
        processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", VOCAB["<s>"]), ("</s>", VOCAB["</s>"])])]),
}
SMALL_PAIRS = [
    ("the lift of a wing", "flutter is an instability of the wing."),
    ("wing flutter", ""),
    ("lifts", "the wing, the wing, the wing. " * 20),  # truncated
    ("unknown words here", "zzz qqq the lift"),
]


def _tokenizer(post_processor: object) -> Tokenizer:
    tokenizer = Tokenizer(models.WordPiece(VOCAB, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = post_processor
    return tokenizer


@pytest.mark.parametrize("kind", list(POST_PROCESSORS))
def test_rows_equal_the_pair_encoding_under_every_post_processor(kind: str) -> None:
    tokenizer = _tokenizer(POST_PROCESSORS[kind])
    encoder = PairEncoder(tokenizer, max_length=24)
    reference = Tokenizer.from_str(tokenizer.to_str())
    reference.enable_truncation(24, strategy="only_second")
    rows = encoder.encode(SMALL_PAIRS)
    assert [row.item_index for row in rows] == list(range(len(SMALL_PAIRS)))
    for row, (query, document) in zip(rows, SMALL_PAIRS):
        expected = reference.encode(query, document)
        assert (row.ids.tolist(), row.type_ids.tolist()) == (expected.ids, expected.type_ids)
    assert len(rows[2].ids) == 24  # the long document was cut to fit
    # a whole-document window row is the same row
    windows = encoder.encode_windows(SMALL_PAIRS[:1], window_tokens=None, overlap_tokens=0)
    assert windows[0].ids.tolist() == rows[0].ids.tolist()


def test_a_template_that_swaps_the_texts_is_refused_at_load() -> None:
    swapped = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $B [SEP] $A [SEP]",
        special_tokens=[("[CLS]", VOCAB["[CLS]"]), ("[SEP]", VOCAB["[SEP]"])])
    with pytest.raises(ModelLoadError, match="does not place a pair as"):
        PairEncoder(_tokenizer(swapped), max_length=24)


def test_ascii_and_other_documents_keep_their_order(encoder: PairEncoder,
                                                    reference: Tokenizer) -> None:
    assert ascii_twin(reference) is not None  # so both tokenizers run here
    pairs = [(query, document) for query, document in PAIRS[:3]] * 2
    pairs.insert(1, ("café", "naïve résumé"))
    for row, (query, document) in zip(encoder.encode(pairs), pairs):
        assert row.ids.tolist() == reference.encode(query, document).ids, (query, document)


TEXTS = [text for pair in SMALL_PAIRS for text in pair] + ["", "lift " * 40]


@pytest.mark.parametrize("kind", list(POST_PROCESSORS))
def test_text_rows_equal_the_tokenizers_truncating_encoding(kind: str) -> None:
    # the embedder's rows: the tokenizer's own single-text encoding with enable_truncation
    tokenizer = _tokenizer(POST_PROCESSORS[kind])
    encoder = TextEncoder(tokenizer, max_length=12)
    reference = Tokenizer.from_str(tokenizer.to_str())
    reference.enable_truncation(12)
    rows = encoder.encode(TEXTS)
    assert [row.item_index for row in rows] == list(range(len(TEXTS)))
    expected = reference.encode_batch(TEXTS)
    for row, encoding in zip(rows, expected):
        assert (row.ids.tolist(), row.type_ids.tolist()) == (encoding.ids, encoding.type_ids)
    assert encoder.count_tokens(TEXTS) == [len(encoding.ids) for encoding in expected]
    whole = Tokenizer.from_str(tokenizer.to_str()).encode_batch(TEXTS)
    assert encoder.count_tokens(TEXTS, truncate=False) == [len(e.ids) for e in whole]
    assert max(encoder.count_tokens(TEXTS, truncate=False)) > 12 == len(rows[-1].ids)
    assert encoder.row_budget() == RowBudget(12, tokenizer.num_special_tokens_to_add(False), 0)


def test_text_windows_cover_the_text_and_refuse_an_instruction() -> None:
    tokenizer = _tokenizer(POST_PROCESSORS["bert"])
    encoder = TextEncoder(tokenizer, max_length=8)
    text = "the lift of a wing " * 5
    rows = encoder.encode_windows([text, "wing"], window_tokens=None, overlap_tokens=2)
    long_rows = [row for row in rows if row.item_index == 0]
    assert len(long_rows) > 2 and all(len(row.ids) <= 8 for row in rows)
    assert long_rows[0].span[0] == 0 and long_rows[-1].span[1] == len(text.rstrip())
    assert [row.span for row in rows if row.item_index == 1] == [(0, len("wing"))]
    with pytest.raises(ValueError, match=re.escape(
            "instruction='Find' applies only to decoder rerankers (models exported with "
            "--recipe); this model is an embedding model: leave instruction unset")):
        encoder.encode(["wing"], instruction="Find")
