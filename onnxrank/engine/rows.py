"""Model rows and the one protocol every row encoder implements (pair, prompt and single text).

A row encoder turns input items, (query, document) pairs or single texts, into token-id rows of
at most `max_length` tokens; every path that tokenizes for a model goes through one (the engine's
kinds, the runtime probe, export validation, the server's token checks). The implementations:
onnxrank.engine.tokenize.PairEncoder (cross-encoders), onnxrank.engine.prompt.PromptEncoder
(decoder rerankers) and onnxrank.engine.text.TextEncoder (embedding models); the manifest picks
one through onnxrank.engine.kinds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

Item = TypeVar("Item", contravariant=True)


@dataclass(frozen=True, slots=True)
class EncodedRow:
    """One model input row: token ids of `[CLS] query [SEP] document-part [SEP]`, a decoder's
    prompt, or `[CLS] text [SEP]` (each model's own template)."""

    ids: np.ndarray  # int64 [length]
    type_ids: np.ndarray  # int64 [length]
    item_index: int  # which input item (pair or text) this row belongs to
    span: tuple[int, int] | None = None  # character span of the document part (window mode)
    # tokens before the document that every row of the item's query starts with (a decoder's
    # prompt head: recipe prefix, instruction, query); 0 where the encoder marks none
    head_length: int = 0


@dataclass(frozen=True, slots=True)
class RowBudget:
    """How an encoder shares a row of `max_length` tokens: `fixed_tokens` that are neither query
    nor document (special tokens; a decoder's prompt and instruction), at most `max_query_tokens`
    of the query (0 for single texts), and the rest for the document or text (cut to fit)."""

    max_length: int
    fixed_tokens: int
    max_query_tokens: int

    def row_tokens(self, query_tokens: int, document_tokens: int) -> int:
        """Tokens of the row of a query and a document of these lengths before the document is
        cut (the query already capped): above max_length means the document gets cut."""
        return self.fixed_tokens + min(query_tokens, self.max_query_tokens) + document_tokens

    def document_room(self, query_tokens: int) -> int:
        """Document tokens a row keeps beside a query of `query_tokens` tokens (capped)."""
        return self.max_length - self.row_tokens(query_tokens, 0)


class RowEncoder(Protocol[Item]):
    """Turns items into rows of at most `max_length` tokens."""

    max_length: int

    def instruction_for(self, instruction: str | None) -> str | None:
        """The instruction a call runs with (None for encoders that take none).

        Raises:
            TypeError, ValueError: The encoder takes no instruction, or this one is invalid.
        """
        ...

    def row_budget(self, instruction: str | None = None) -> RowBudget:
        """How a row is shared with `instruction`."""
        ...

    def encode(self, items: Sequence[Item], *, instruction: str | None = None) -> list[EncodedRow]:
        """One row per item, cut to fit `max_length`."""
        ...

    def encode_windows(self, items: Sequence[Item], *, window_tokens: int | None,
                       overlap_tokens: int, instruction: str | None = None) -> list[EncodedRow]:
        """Rows for every token window of each item's text (with its character span)."""
        ...


def refuse_instruction(instruction: str | None, model: str) -> None:
    """What encoders of models without an instruction do with one: nothing for None, else
    ValueError naming what `model` is ("a cross-encoder")."""
    if instruction is not None:
        raise ValueError(
            f"instruction={instruction!r:.60} applies only to decoder rerankers (models "
            f"exported with --recipe); this model is {model}: leave instruction unset"
        )
