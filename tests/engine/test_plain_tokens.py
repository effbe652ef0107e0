"""PlainTokenizer gives exactly the tokenizer's ids and offsets, whichever texts its ASCII twin
takes, for each kind of normalizer the twin moves to Python or trims; its `ids`, which split words
in Python and look up the words it has seen, give exactly the tokenizer's ids too."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

from onnxrank.bench.paths import DEFAULT_DATASET
from onnxrank.bench.workloads import load_dataset
from onnxrank.engine import plain_tokens
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


PRE_TOKENIZERS = {
    "BertPreTokenizer": pre_tokenizers.BertPreTokenizer(),
    "Whitespace": pre_tokenizers.Whitespace(),
    "WhitespaceSplit": pre_tokenizers.WhitespaceSplit(),
}
# a word past WordPiece's max_input_chars_per_word (100) is one [UNK] as a whole
LONG_WORDS = ["wing" * 30 + " lift", "a " + "b" * 101 + ", " + "wings" * 20]


def _tokenizer(normalizer: normalizers.Normalizer | None,
               pre_tokenizer: str = "BertPreTokenizer") -> Tokenizer:
    tokenizer = Tokenizer(models.WordPiece(VOCAB, unk_token="[UNK]"))
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre_tokenizer]
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
    # added tokens matter only where Python steps stand in for the normalizer or a regular
    # expression for the pre-tokenizer (the others only trim steps that are identities on ASCII)
    assert (twin.prepared("a wing [SEP] b") is None) is bool(twin.steps or twin.words), kind
    # only a normalizer whose Python steps drop characters refuses control characters
    drops = kind in ("bert", "bert, cased")
    assert (twin.prepared("control \x00\x07\x1b chars") is None) is drops


def test_the_twins_python_steps_do_what_the_normalizer_does() -> None:
    twin = ascii_twin(_tokenizer(NORMALIZERS["bert"]))
    assert twin is not None and twin.tokenizer.normalizer is None  # all of it moved to Python
    assert twin.prepared("The\tLIFT\r\nof a Wing") == "the lift  of a wing"
    nested = ascii_twin(_tokenizer(NORMALIZERS["nested sequence, Rust step first"]))
    assert nested is not None and nested.steps == ()  # a Rust step first: only NFKC is trimmed


def test_no_twin_without_a_step_to_move_or_skip_or_words_to_split() -> None:
    assert ascii_twin(_tokenizer(normalizers.Replace("``", '"'))) is None
    tokenizer = _tokenizer(None)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.BertPreTokenizer()])
    assert ascii_twin(tokenizer) is None
    byte_pair = Tokenizer(models.BPE({"a": 0, "b": 1}, []))
    byte_pair.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    assert ascii_twin(byte_pair) is None  # BPE: words are not split in Python


@pytest.mark.parametrize("pre_tokenizer", list(PRE_TOKENIZERS))
def test_the_word_patterns_split_ascii_as_the_pre_tokenizers_do(pre_tokenizer: str) -> None:
    twin = ascii_twin(_tokenizer(None, pre_tokenizer))
    assert twin is not None and twin.words is not None and twin.tokenizer.normalizer is None
    for text in PLAIN_ASCII + EVERY_CHARACTER + ["control \x00\x07\x1b\x1c\x7f chars"]:
        expected = [word for word, _ in PRE_TOKENIZERS[pre_tokenizer].pre_tokenize_str(text)]
        assert twin.words.findall(text) == expected, (pre_tokenizer, text)


@pytest.mark.parametrize("kind", [*NORMALIZERS, None])
@pytest.mark.parametrize("pre_tokenizer", list(PRE_TOKENIZERS))
def test_ids_equal_the_tokenizers_on_every_text(kind: str | None, pre_tokenizer: str) -> None:
    tokenizer = _tokenizer(None if kind is None else NORMALIZERS[kind], pre_tokenizer)
    plain = PlainTokenizer(tokenizer)
    texts = PLAIN_ASCII + REFUSED + EVERY_CHARACTER + LONG_WORDS
    expected = [encoding.ids for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)]
    assert plain.ids(texts) == expected, kind
    assert plain.ids(texts[::-1]) == expected[::-1], kind  # now from the words it has seen
    twin = ascii_twin(tokenizer)
    # words are split in Python where the whole normalizer runs there (or there is none)
    assert (twin is not None and twin.words is not None) is (
        kind in (None, "bert", "bert, cased", "bert without clean_text", "lowercase", "nfkc")), kind


def _real_tokenizer(checkpoint_dir: Path) -> Tokenizer:
    """all-MiniLM-L6-v2's tokenizer, as onnxrank loads it (its file pads and truncates)."""
    tokenizer = Tokenizer.from_file(str(checkpoint_dir / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def test_ids_look_up_the_words_they_have_seen(tiny_checkpoint_dir: Path) -> None:
    tokenizer = _real_tokenizer(tiny_checkpoint_dir)
    documents = list(load_dataset(DEFAULT_DATASET).documents)
    plain = PlainTokenizer(tokenizer)
    expected = [encoding.ids for encoding in tokenizer.encode_batch(documents,
                                                                     add_special_tokens=False)]
    assert plain.ids(documents[:100]) == expected[:100]
    seen = dict(plain._word_ids)
    assert "aerodynamic" in seen and len(seen) > 1000
    assert plain.ids(documents) == expected
    assert plain._word_ids.keys() >= seen.keys()  # kept, and grown


def test_ids_start_the_kept_words_again_past_the_bound(
        tiny_checkpoint_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tokenizer = _real_tokenizer(tiny_checkpoint_dir)
    documents = list(load_dataset(DEFAULT_DATASET).documents)[:400]
    expected = [encoding.ids for encoding in tokenizer.encode_batch(documents,
                                                                     add_special_tokens=False)]
    monkeypatch.setattr(plain_tokens, "_KEPT_WORDS", 1500)
    plain = PlainTokenizer(tokenizer)
    kept = []
    for start in range(0, len(documents), 20):
        assert plain.ids(documents[start:start + 20]) == expected[start:start + 20]
        kept.append(len(plain._word_ids))
    assert max(kept) <= 1500 and any(now < before for before, now in zip(kept, kept[1:])), kept
    monkeypatch.setattr(plain_tokens, "_KEPT_WORD_CHARACTERS", 1000)
    plain = PlainTokenizer(tokenizer)
    assert plain.ids(documents[:50]) == expected[:50]  # more unseen words than the bound: kept all
    assert plain.ids(documents[50:100]) == expected[50:100]
    assert sum(map(len, plain._word_ids)) == plain._word_characters


def test_no_words_split_in_python_for_a_tokenizer_that_pads_or_truncates(
        tiny_checkpoint_dir: Path) -> None:
    tokenizer = Tokenizer.from_file(str(tiny_checkpoint_dir / "tokenizer.json"))
    assert tokenizer.padding is not None and tokenizer.truncation is not None  # as the file says
    twin = ascii_twin(tokenizer)
    assert twin is not None and twin.words is None
    texts = PLAIN_ASCII + LONG_WORDS * 5
    assert PlainTokenizer(tokenizer).ids(texts) == [
        encoding.ids for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)]
