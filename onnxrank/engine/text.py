"""Single-text rows for embedding models: `[CLS] text [SEP]` (the tokenizer's own single template),
cut at max_length as the tokenizer's right truncation cuts them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tokenizers import Encoding, Tokenizer

from onnxrank.engine.plain_tokens import PlainTokenizer
from onnxrank.engine.rows import EncodedRow, RowBudget, refuse_instruction


class TextEncoder:
    """Turns texts into model rows, special tokens included, each cut to `max_length` tokens.

    Texts are tokenized without special tokens, cut to what the special tokens leave, then
    post-processed: the ids the tokenizer's own ``enable_truncation(max_length)`` gives, without
    a second, truncating copy of the tokenizer (a shared tokenizer's settings must not change
    while threads encode with it).
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int) -> None:
        self._tokenizer = tokenizer
        self._texts = PlainTokenizer(tokenizer)
        self.max_length = max_length
        self._special_tokens = tokenizer.num_special_tokens_to_add(is_pair=False)

    def instruction_for(self, instruction: str | None) -> None:
        """Single texts take no instruction: None, or ValueError for any other value."""
        refuse_instruction(instruction, "an embedding model")

    def row_budget(self, instruction: str | None = None) -> RowBudget:
        """How a row is shared: the special tokens, no query, the rest for the text."""
        self.instruction_for(instruction)
        return RowBudget(self.max_length, self._special_tokens, 0)

    def count_tokens(self, texts: Sequence[str], *, truncate: bool = True) -> list[int]:
        """Tokens per text, special tokens included (capped at max_length when `truncate`)."""
        room = self.max_length - self._special_tokens
        lengths = [len(ids) for ids in self._texts.ids(texts)]
        if truncate:
            return [min(length, room) + self._special_tokens for length in lengths]
        return [length + self._special_tokens for length in lengths]

    def encode(self, texts: Sequence[str], *, instruction: str | None = None) -> list[EncodedRow]:
        """One row per text, cut at the end to fit `max_length`."""
        self.instruction_for(instruction)
        room = self.max_length - self._special_tokens
        rows = []
        for index, encoding in enumerate(
                self._texts.encode(texts)):
            if len(encoding.ids) > room:
                encoding.truncate(room)
            rows.append(self._row(encoding, index, None))
        return rows

    def encode_windows(self, texts: Sequence[str], *, window_tokens: int | None,
                       overlap_tokens: int, instruction: str | None = None) -> list[EncodedRow]:
        """Rows for every token window of each text (with its character span).

        Args:
            texts: Texts to encode.
            window_tokens: Text tokens per window; None fills what the special tokens leave.
            overlap_tokens: Tokens shared by consecutive windows.
            instruction: Must be None (single texts take none).
        """
        self.instruction_for(instruction)
        room = self.max_length - self._special_tokens
        window = room if window_tokens is None else min(window_tokens, room)
        rows = []
        for index, (text, encoding) in enumerate(zip(texts, self._texts.encode(texts, offsets=True))):
            if len(encoding.ids) <= window:
                rows.append(self._row(encoding, index, (0, len(text))))
                continue
            encoding.truncate(window, stride=min(overlap_tokens, window - 1))
            for part in [encoding, *encoding.overflowing]:
                offsets = part.offsets
                rows.append(self._row(part, index,
                                      (offsets[0][0], offsets[-1][1]) if offsets else (0, 0)))
        return rows

    def _row(self, encoding: Encoding, index: int, span: tuple[int, int] | None) -> EncodedRow:
        with_specials = self._tokenizer.post_process(encoding, add_special_tokens=True)
        return EncodedRow(np.asarray(with_specials.ids, dtype=np.int64),
                          np.asarray(with_specials.type_ids, dtype=np.int64), index, span)
