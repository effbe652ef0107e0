"""Texts to token ids without special tokens, in one Rust `tokenizers` call per kind of text: ASCII
texts through a cheaper twin of the tokenizer (`AsciiTwin`), with the same ids and offsets, and,
where ids alone are asked for and the tokenizer reads ASCII text word by word, each word's ids
looked up from the last texts'."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Encoding, Tokenizer

# Normalizer steps that leave ASCII text as it is: Unicode normal forms and accent stripping change
# only non-ASCII characters.
_ASCII_IDENTITIES = frozenset({"NFC", "NFD", "NFKC", "NFKD", "StripAccents"})
# A BERT normalizer's clean_text on ASCII (tokenizers' normalizers/bert.rs): tab, newline and
# return become spaces and the other control characters are dropped. A text that loses a character
# is left to the tokenizer (its offsets would move).
_SPACES = bytes.maketrans(b"\t\n\r", b"   ")
_CONTROLS = bytes([*range(0x09), 0x0B, 0x0C, *range(0x0E, 0x20), 0x7F])


# Pre-tokenizers whose split of ASCII text one regular expression (re.ASCII) gives exactly, by type
# (tokenizers' pre_tokenizers: bert.rs drops whitespace and isolates each punctuation character,
# whitespace.rs's Whitespace is `\w+|[^\w\s]+` and WhitespaceSplit drops whitespace; Rust's ASCII
# whitespace is Python's \s, its ASCII punctuation the printable characters that are not letters,
# digits or space).
_PUNCTUATION = r"!-/:-@\[-`{-~"
_ASCII_WORDS = {
    "BertPreTokenizer": rf"[^\s{_PUNCTUATION}]+|[{_PUNCTUATION}]",
    "Whitespace": r"\w+|[^\w\s]+",
    "WhitespaceSplit": r"\S+",
}
# Models whose ids for a word do not depend on the words around it (WordPiece's greedy longest
# match; BPE is left out, its dropout samples).
_WORDWISE_MODELS = frozenset({"WordPiece"})
# How many words, and how many of their characters, PlainTokenizer keeps ids for; past either the
# kept words start again from none (a few MB; English prose settles near 10,000 words).
_KEPT_WORDS = 1 << 16
_KEPT_WORD_CHARACTERS = 1 << 21


def _clean_ascii(text: str) -> str:
    return text.encode("ascii").translate(_SPACES, _CONTROLS).decode("ascii")


def _python_steps(step: dict[str, Any]) -> list[Callable[[str], str]] | None:
    """`step` (one tokenizer.json normalizer) as str functions equal to it on ASCII text (none for
    an identity there); None when it has no such twin."""
    if step["type"] in _ASCII_IDENTITIES:
        return []
    if step["type"] == "Lowercase":
        return [str.lower]
    if step["type"] == "BertNormalizer":  # accents and CJK padding touch non-ASCII only
        return [*([_clean_ascii] if step["clean_text"] else []),
                *([str.lower] if step["lowercase"] else [])]
    return None


def _rust_step(step: dict[str, Any]) -> dict[str, Any] | None:
    """`step` less what is an identity on ASCII text (None when all of it is)."""
    if step["type"] in _ASCII_IDENTITIES:
        return None
    if step["type"] == "BertNormalizer":
        return {**step, "handle_chinese_chars": False, "strip_accents": False}
    return step


def _flat_steps(config: dict[str, Any]) -> list[dict[str, Any]]:
    if config["type"] == "Sequence":
        return [step for inner in config["normalizers"] for step in _flat_steps(inner)]
    return [config]


@dataclass(frozen=True, slots=True)
class AsciiTwin:
    """A cheaper way through a tokenizer for ASCII text, with the same ids and offsets.

    The normalizer's leading steps that have a str twin (lowercasing, a BERT normalizer's
    clean_text) run in Python, as C string methods without the alignment bookkeeping of the
    tokenizer's normalized strings; the twin tokenizer's normalizer keeps the other steps, less
    those that change only non-ASCII characters (Unicode normal forms, accent stripping, a BERT
    normalizer's CJK padding). Where the whole normalizer runs in Python, the pre-tokenizer's
    split has a regular expression and the model reads each word on its own, `words` splits a
    prepared text as the tokenizer does.
    """

    tokenizer: Tokenizer
    steps: tuple[Callable[[str], str], ...]
    # The added tokens in any case (and as the Python steps leave them): the tokenizer matches
    # them before or after its own normalizer, which the Python steps stand in for, and before
    # its pre-tokenizer, which `words` stands in for, so a text with one is left to the tokenizer.
    added_tokens: re.Pattern[str] | None
    words: re.Pattern[str] | None

    def prepared(self, text: str) -> str | None:
        """`text` as the twin tokenizer reads it, or None for a text the twin does not take
        (not ASCII, a character the Python steps drop, or an added token)."""
        if not text.isascii():
            return None
        prepared = text
        for step in self.steps:
            prepared = step(prepared)
        if len(prepared) != len(text):
            return None
        if self.added_tokens is not None and (self.added_tokens.search(text)
                                              or self.added_tokens.search(prepared)):
            return None
        return prepared


def ascii_twin(tokenizer: Tokenizer) -> AsciiTwin | None:
    """The tokenizer's AsciiTwin; None when its normalizer has no step to move or skip and its
    words cannot be split in Python."""
    # Decided from the normalizer and the type names alone (0.1 ms): copying the whole tokenizer
    # costs tens of ms at load (50 ms for a 30k WordPiece vocabulary), paid only when there is a
    # step to skip.
    steps = ([] if tokenizer.normalizer is None
             else _flat_steps(json.loads(tokenizer.normalizer.__getstate__())))
    python: list[Callable[[str], str]] = []
    moved = 0
    for step in steps:
        twin = _python_steps(step)
        if twin is None:
            break
        python += twin
        moved += 1
    kept = [rust for rust in map(_rust_step, steps[moved:]) if rust is not None]
    split = _ASCII_WORDS.get(type(tokenizer.pre_tokenizer).__name__)
    # a word's ids alone are a text's only without padding or truncation (onnxrank's own loader
    # turns both off)
    words = (re.compile(split, re.ASCII)
             if split and not kept and type(tokenizer.model).__name__ in _WORDWISE_MODELS
             and tokenizer.padding is None and tokenizer.truncation is None else None)
    unchanged = moved == 0 and kept == steps
    if unchanged and words is None:
        return None
    contents = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    for python_step in python:
        contents |= {python_step(content) for content in contents if content.isascii()}
    added = (re.compile("|".join(map(re.escape, sorted(contents))), re.IGNORECASE)
             if (python or words) and contents else None)
    if unchanged:
        return AsciiTwin(tokenizer, (), added, words)
    config = json.loads(tokenizer.to_str())
    normalizer = (None if not kept else kept[0] if len(kept) == 1
                  else {"type": "Sequence", "normalizers": kept})
    return AsciiTwin(Tokenizer.from_str(json.dumps({**config, "normalizer": normalizer})),
                     tuple(python), added, words)


class PlainTokenizer:
    """Texts to encodings without special tokens: ASCII ones through the tokenizer's AsciiTwin,
    the others through the tokenizer itself, order kept.

    `ids` gives the ids alone, and where the twin splits words it keeps each word's ids: a text
    is split by a regular expression and its words' ids looked up, the unseen ones from one twin
    call (safe to share between threads: the kept words only grow, or are replaced whole). Ids of
    a query's 50 passages on amx's 2 cores, short / mixed: 1.1 / 2.1 ms looked up, 2.3 / 3.8
    through the twin, 3.6 / 6.0 through the tokenizer (research/engine_overhead.py).
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._twin = ascii_twin(tokenizer)
        self._word_ids: dict[str, tuple[int, ...]] = {}
        self._word_characters = 0

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's ids, as `encode` gives them."""
        twin = self._twin
        if twin is None or twin.words is None:
            return [encoding.ids for encoding in self.encode(texts)]
        split = [None if text is None else twin.words.findall(text)
                 for text in map(twin.prepared, texts)]
        word_ids = self._word_ids
        unseen = list({word for text_words in split if text_words is not None
                       for word in text_words if word not in word_ids})
        if unseen:
            characters = sum(map(len, unseen))
            if (len(word_ids) + len(unseen) > _KEPT_WORDS
                    or self._word_characters + characters > _KEPT_WORD_CHARACTERS):
                # start again from this call's words
                word_ids = self._word_ids = {
                    word: word_ids[word] for word in {word for text_words in split
                                                      if text_words is not None
                                                      for word in text_words}
                    if word in word_ids}
                self._word_characters = sum(map(len, word_ids))
            self._word_characters += characters
            word_ids.update(zip(unseen, (tuple(encoding.ids) for encoding in _encode(
                twin.tokenizer, unseen, False))))
        others = iter(_encode(self.tokenizer, [
            text for text, text_words in zip(texts, split) if text_words is None], False))
        return [next(others).ids if text_words is None
                else [token for word in text_words for token in word_ids[word]]
                for text_words in split]

    def encode(self, texts: Sequence[str], *, offsets: bool = False) -> list[Encoding]:
        """One encoding per text (with character offsets when `offsets`; without, the tokenizer's
        faster call)."""
        if self._twin is None or self._twin.tokenizer is self.tokenizer:
            return _encode(self.tokenizer, list(texts), offsets)
        prepared = [self._twin.prepared(text) for text in texts]
        if None not in prepared:
            return _encode(self._twin.tokenizer, prepared, offsets)  # type: ignore[arg-type]
        twin_encodings = iter(_encode(self._twin.tokenizer,
                                      [text for text in prepared if text is not None], offsets))
        other_encodings = iter(_encode(self.tokenizer, [
            text for text, twin_text in zip(texts, prepared) if twin_text is None], offsets))
        return [next(other_encodings if twin_text is None else twin_encodings)
                for twin_text in prepared]


def _encode(tokenizer: Tokenizer, texts: list[str], offsets: bool) -> list[Encoding]:
    if offsets:
        return tokenizer.encode_batch(texts, add_special_tokens=False)
    return tokenizer.encode_batch_fast(texts, add_special_tokens=False)
