"""PlainTokenizer gives exactly the tokenizer's ids and offsets, whichever texts its ASCII twin
takes, for each kind of normalizer the twin moves to Python or trims."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

from onnxrank.engine.plain_tokens import PlainTokenizer, ascii_twin

VOCAB = {word: index for index, word in enumerate(
    ["[UNK]", "[SEP]", "[MASK]", "the", "lift", "wing", "##s", "##ing", "a", "b", ",", ".", "!",
     "WING", "The", "Lift", "mach", "2", "5", '"', "`"])}
NORMALIZERS = {
    "bert": normalizers.BertNormalizer(lowercase=True),
    "bert, cased": normalizers.BertNormalizer(lowercase=False, strip_accents=True),
    "bert without clean_text": normalizers.BertNormalizer(clean_text=False, lowercase=True),
    "lowercase": normalizers.Lowercase(),
    "sequence": normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase(),
                                      normalizers.StripAccents(), normalizers.Replace("``", '"')]),
    "nested sequence, Rust step first": normalizers.Sequence([
        normalizers.Replace("``", '"'), normalizers.Sequence([normalizers.NFKC(),
                                                              normalizers.Lowercase()])]),
    "nfkc": normalizers.NFKC(),
}
PLAIN_ASCII = [
    "The Lift of a WING, at Mach 2.5!", "tabs\tand\nnew lines\r\n and  doubled  spaces",
    "``quoted'' wings", "",
]
# texts the twin must leave to the tokenizer: characters a BERT normalizer drops, added tokens in
# any case (BERT's special tokens are matched before normalizing), text that is not ASCII
REFUSED = ["control \x00\x07\x1b chars", "a wing [SEP] b", "a wing [sep] b", "[Mask] lifts",
           "Schrödinger’s wing", "東京 wing"]
# every ASCII character, in a seeded random order, in ten texts
EVERY_CHARACTER = ["".join(chr(code) for code in np.random.default_rng(seed).permutation(128))
                   for seed in range(10)]


def _tokenizer(normalizer: normalizers.Normalizer) -> Tokenizer:
    tokenizer = Tokenizer(models.WordPiece(VOCAB, unk_token="[UNK]"))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.add_special_tokens(["[SEP]", AddedToken("[MASK]", normalized=True)])
    return tokenizer


@pytest.mark.parametrize("kind", list(NORMALIZERS))
def test_plain_tokenizer_equals_the_tokenizer_on_every_text(kind: str) -> None:
    tokenizer = _tokenizer(NORMALIZERS[kind])
    assert ascii_twin(tokenizer) is not None  # so the twin's path runs
    plain = PlainTokenizer(tokenizer)
    texts = PLAIN_ASCII + REFUSED + EVERY_CHARACTER
    for offsets in (False, True):
        expected = tokenizer.encode_batch(texts, add_special_tokens=False)
        got = plain.encode(texts, offsets=offsets)
        for text, mine, theirs in zip(texts, got, expected):
            assert mine.ids == theirs.ids, (kind, text)
            if offsets:
                assert mine.offsets == theirs.offsets, (kind, text)


@pytest.mark.parametrize("kind", list(NORMALIZERS))
def test_the_twin_takes_plain_ascii_and_refuses_the_rest(kind: str) -> None:
    twin = ascii_twin(_tokenizer(NORMALIZERS[kind]))
    assert twin is not None
    assert all(twin.prepared(text) is not None for text in PLAIN_ASCII), kind
    assert twin.prepared("東京 wing") is None
    # added tokens matter only where Python steps stand in for the normalizer (the others only trim
    # steps that are identities on ASCII text)
    assert (twin.prepared("a wing [SEP] b") is None) is bool(twin.steps), kind
    # only a normalizer whose Python steps drop characters refuses control characters
    drops = kind in ("bert", "bert, cased")
    assert (twin.prepared("control \x00\x07\x1b chars") is None) is drops


def test_the_twins_python_steps_do_what_the_normalizer_does() -> None:
    twin = ascii_twin(_tokenizer(NORMALIZERS["bert"]))
    assert twin is not None and twin.tokenizer.normalizer is None  # all of it moved to Python
    assert twin.prepared("The\tLIFT\r\nof a Wing") == "the lift  of a wing"
    nested = ascii_twin(_tokenizer(NORMALIZERS["nested sequence, Rust step first"]))
    assert nested is not None and nested.steps == ()  # a Rust step first: only NFKC is trimmed


def test_no_twin_without_a_step_to_move_or_skip() -> None:
    assert ascii_twin(_tokenizer(normalizers.Replace("``", '"'))) is None
    tokenizer = _tokenizer(normalizers.Lowercase())
    tokenizer.normalizer = None
    assert ascii_twin(tokenizer) is None
