"""Texts to token ids without special tokens, in one Rust `tokenizers` call per kind of text: ASCII
texts through a cheaper twin of the tokenizer (`AsciiTwin`), with the same ids and offsets."""

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
    normalizer's CJK padding).
    """

    tokenizer: Tokenizer
    steps: tuple[Callable[[str], str], ...]
    # The added tokens in any case (and as the Python steps leave them): the tokenizer matches
    # them before or after its own normalizer, which the Python steps stand in for, so a text with
    # one is left to the tokenizer.
    added_tokens: re.Pattern[str] | None

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
    """The tokenizer's AsciiTwin; None when its normalizer has no step to move or skip."""
    if tokenizer.normalizer is None:
        return None
    # Decided from the normalizer alone (0.1 ms): copying the whole tokenizer costs tens of ms
    # at load (50 ms for a 30k WordPiece vocabulary), paid only when there is a step to skip.
    steps = _flat_steps(json.loads(tokenizer.normalizer.__getstate__()))
    python: list[Callable[[str], str]] = []
    moved = 0
    for step in steps:
        twin = _python_steps(step)
        if twin is None:
            break
        python += twin
        moved += 1
    kept = [rust for rust in map(_rust_step, steps[moved:]) if rust is not None]
    if moved == 0 and kept == steps:
        return None
    config = json.loads(tokenizer.to_str())
    normalizer = (None if not kept else kept[0] if len(kept) == 1
                  else {"type": "Sequence", "normalizers": kept})
    contents = {token["content"] for token in config["added_tokens"]}
    for python_step in python:
        contents |= {python_step(content) for content in contents if content.isascii()}
    added = (re.compile("|".join(map(re.escape, sorted(contents))), re.IGNORECASE)
             if python and contents else None)
    return AsciiTwin(Tokenizer.from_str(json.dumps({**config, "normalizer": normalizer})),
                     tuple(python), added)


class PlainTokenizer:
    """Texts to encodings without special tokens: ASCII ones through the tokenizer's AsciiTwin,
    the others through the tokenizer itself, order kept. For a query's 50 passages, on amx's 2
    cores: 2.1 against 3.4 ms short, 3.8 against 5.9 mixed (research/engine_overhead.py)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._twin = ascii_twin(tokenizer)

    def encode(self, texts: Sequence[str], *, offsets: bool = False) -> list[Encoding]:
        """One encoding per text (with character offsets when `offsets`; without, the tokenizer's
        faster call)."""
        if self._twin is None:
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
