"""Prompt tokenization for decoder rerankers: one model row per (query, document window), built
from the manifest's recipe (onnxrank.engine.recipe).

A row is ``prefix tokens + template piece tokens + suffix tokens``, as the model cards build it:
the prefix and the suffix are tokenized once, the template's pieces (instruction, query and
document filled in) per pair in one Rust batch call, each piece apart. Only the document is cut:
the prefix, the template's text, the instruction, the query (capped at the recipe's query_share
of what the rest leaves) and the suffix are always kept and count against max_length. The graph scores the
last real token of each row, so rows are right-padded like every other model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Encoding, Tokenizer

from onnxrank.engine.plain_tokens import PlainTokenizer
from onnxrank.engine.recipe import PromptRecipe
from onnxrank.engine.rows import EncodedRow, RowBudget
from onnxrank.types import Pair


@dataclass(frozen=True, slots=True)
class _Parts:
    """A pair's template tokens split around the document: token ids before, of and after it."""

    head: list[int]
    document: list[int]
    document_offsets: list[tuple[int, int]]  # character spans within the document text
    tail: list[int]


class PromptEncoder:
    """Turns (query, document) pairs into decoder-reranker prompt rows, cutting only the document.

    A RowEncoder (onnxrank.engine.rows) like onnxrank.engine.tokenize.PairEncoder, plus the
    instruction: None means the recipe's default.
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int, recipe: PromptRecipe) -> None:
        self._texts = PlainTokenizer(tokenizer)
        self.max_length = max_length
        self.recipe = recipe
        self._prefix = tokenizer.encode(recipe.prefix, add_special_tokens=False).ids
        self._suffix = tokenizer.encode(recipe.suffix, add_special_tokens=False).ids

    def instruction_for(self, instruction: str | None) -> str:
        """The instruction a call uses: its own, else the recipe's default.

        Raises:
            TypeError: `instruction` is not a str or None.
            ValueError: `instruction` is blank.
        """
        # the default as given back by a caller that resolved it already (mxbai's is empty)
        if instruction is None or instruction == self.recipe.default_instruction:
            return self.recipe.default_instruction
        if not isinstance(instruction, str):
            raise TypeError(f"instruction must be a str or None, got {type(instruction).__name__}")
        if not instruction.strip():
            raise ValueError(f"instruction must be a non-empty string or None (the recipe's "
                             f"default), got {instruction!r}")
        return instruction

    def encode(self, pairs: Sequence[Pair], *, instruction: str | None = None) -> list[EncodedRow]:
        """One row per pair; documents are cut so the row fits `max_length`.

        Raises:
            ValueError: The fixed part of a prompt (recipe, instruction, capped query) leaves no
                room for the document.
        """
        rows = []
        for index, parts in enumerate(self._split(pairs, self.instruction_for(instruction))):
            room = self._room(parts)
            rows.append(self._row(parts, parts.document[:room], index, None))
        return rows

    def encode_windows(
        self, pairs: Sequence[Pair], *, window_tokens: int | None, overlap_tokens: int,
        instruction: str | None = None,
    ) -> list[EncodedRow]:
        """Rows for every token window of each document (with its character span).

        Args:
            pairs: (query, document) pairs.
            window_tokens: Document tokens per window; None fills what the prompt leaves free.
            overlap_tokens: Tokens shared by consecutive windows.
            instruction: None = the recipe's default.
        """
        rows = []
        for index, ((_, text), parts) in enumerate(
                zip(pairs, self._split(pairs, self.instruction_for(instruction)))):
            room = self._room(parts)
            window = room if window_tokens is None else min(window_tokens, room)
            if len(parts.document) <= window:
                rows.append(self._row(parts, parts.document, index, (0, len(text))))
                continue
            step = window - min(overlap_tokens, window - 1)
            for start in range(0, len(parts.document), step):
                stop = min(start + window, len(parts.document))
                offsets = parts.document_offsets[start:stop]
                rows.append(self._row(parts, parts.document[start:stop], index,
                                      (offsets[0][0], offsets[-1][1])))
                if stop == len(parts.document):
                    break
        return rows

    def row_budget(self, instruction: str | None = None) -> RowBudget:
        """How a row is shared with `instruction` (None: the recipe's default).

        Raises:
            TypeError, ValueError: As for `instruction_for` and `max_query_tokens`.
        """
        return RowBudget(self.max_length, self.fixed_tokens(instruction),
                         self.max_query_tokens(instruction))

    def max_query_tokens(self, instruction: str | None = None) -> int:
        """Query tokens kept: the recipe's query_share of what the recipe and the instruction
        leave of max_length (the document needs room; a query that long is pasted text, not a
        search query).

        Raises:
            ValueError: The recipe and the instruction alone leave no room.
        """
        fixed = self.fixed_tokens(instruction)
        if self.max_length - fixed < 2:
            raise ValueError(
                f"the prompt's fixed tokens ({fixed} with the recipe {self.recipe.name!r} and the "
                f"instruction) leave no room for the query and the document in "
                f"max_length={self.max_length}; shorten the instruction or raise max_length"
            )
        return int((self.max_length - fixed) * self.recipe.query_share)

    def fixed_tokens(self, instruction: str | None = None) -> int:
        """Tokens of a row that are neither query nor document: the recipe's text and the
        instruction."""
        pieces, _, _ = self.recipe.render(instruction=self.instruction_for(instruction), query="",
                                          document="")
        return len(self._prefix) + len(self._suffix) + sum(map(len, self._texts.ids(pieces)))

    def _split(self, pairs: Sequence[Pair], instruction: str) -> list[_Parts]:
        queries = self._cap_queries([query for query, _ in pairs],
                                    self.max_query_tokens(instruction))
        rendered = [self.recipe.render(instruction=instruction, query=queries[query],
                                       document=document) for query, document in pairs]
        count = len(self.recipe.template)
        encodings = self._texts.encode(
            [piece for pieces, _, _ in rendered for piece in pieces], offsets=True)
        parts = []
        for start, (_, where, span) in zip(range(0, len(encodings), count), rendered):
            own = encodings[start:start + count]
            parts.append(_split_encoding(
                own[where], span, [token for encoding in own[:where] for token in encoding.ids],
                [token for encoding in own[where + 1:] for token in encoding.ids]))
        return parts

    def _cap_queries(self, queries: Sequence[str], limit: int) -> dict[str, str]:
        """Each distinct query, cut to `limit` tokens (as text)."""
        unique = list(dict.fromkeys(queries))
        capped = {}
        for query, encoding in zip(unique, self._texts.encode(
                unique, offsets=True)):
            if len(encoding.ids) > limit:
                capped[query] = query[: encoding.offsets[limit - 1][1]]
            else:
                capped[query] = query
        return capped

    def _room(self, parts: _Parts) -> int:
        room = self.max_length - len(self._prefix) - len(parts.head) - len(parts.tail) \
            - len(self._suffix)
        # the query cap leaves at least one token; merges at the slot edges may take it back
        return max(room, 1)

    def _row(self, parts: _Parts, document: list[int], index: int,
             span: tuple[int, int] | None) -> EncodedRow:
        ids = np.asarray(self._prefix + parts.head + document + parts.tail + self._suffix,
                         dtype=np.int64)
        return EncodedRow(ids=ids, type_ids=np.zeros_like(ids), item_index=index, span=span,
                          head_length=len(self._prefix) + len(parts.head))


def _split_encoding(encoding: Encoding, span: tuple[int, int], before: list[int],
                    after: list[int]) -> _Parts:
    """Split the tokens of the piece holding the document at the document's character span;
    `before` and `after` are the other pieces' tokens.

    A token that overlaps the document belongs to it (byte-level BPE glues the space before the
    document to its first word), so cutting the document's tokens cuts the text the model card's
    right truncation cuts.
    """
    start, stop = span
    head: list[int] = before
    document: list[int] = []
    offsets: list[tuple[int, int]] = []
    tail: list[int] = []
    for token, (begin, end) in zip(encoding.ids, encoding.offsets):
        if end <= start:
            head.append(token)
        elif begin >= stop:
            tail.append(token)
        else:
            document.append(token)
            offsets.append((max(begin, start) - start, min(end, stop) - start))
    return _Parts(head, document, offsets, tail + after)
