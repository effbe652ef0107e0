"""Late-interaction rows: the manifest's settings and the encoder that turns queries and
documents into token rows the way PyLate and sentence-transformers' MultiVectorEncoder do.

A row is the tokenizer's own single template (``[CLS] text [SEP]``) with the query or document
marker id inserted at position 1, cut so the whole row, marker included, fits `query_length` or
`document_length`. Queries with expansion are run padded to `query_length` with the expansion id
([MASK]); those positions are attended only with `attend_to_expansion_tokens` and always kept in
the score. A document's rows whose id is in the skiplist (punctuation, looked up in the
vocabulary by exact token) are dropped after the model runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tokenizers import Tokenizer

from onnxrank.engine.plain_tokens import PlainTokenizer
from onnxrank.engine.rows import EncodedRow, RowBudget, refuse_instruction
from onnxrank.types import Pair


@dataclass(frozen=True, slots=True)
class LateInteractionSettings:
    """The manifest's ``late_interaction`` field: how rows are made and which rows count.

    Attributes:
        query_prefix_id: Marker id inserted at position 1 of a query row ([unused0], "[Q] ").
        document_prefix_id: Marker id inserted at position 1 of a document row.
        query_length: Tokens of a query row, marker included (32 in ColBERT).
        document_length: Tokens of a document row at most, marker included (180 to 8192).
        query_expansion: Queries are padded to query_length with `expansion_token_id` and those
            rows count in MaxSim (PyLate's do_query_expansion; off for some ModernBERT models).
        attend_to_expansion_tokens: The expansion positions are attended by the transformer.
        expansion_token_id: The id queries are expanded with ([MASK]).
        skiplist_ids: Document token ids whose rows are dropped (punctuation).
        dim: Size of a token vector (the last projection's output).
    """

    query_prefix_id: int
    document_prefix_id: int
    query_length: int
    document_length: int
    query_expansion: bool
    attend_to_expansion_tokens: bool
    expansion_token_id: int
    skiplist_ids: tuple[int, ...]
    dim: int

    def __post_init__(self) -> None:
        for name in ("query_length", "document_length"):
            if getattr(self, name) < 4:
                raise ValueError(f"{name} must be >= 4 (special tokens, marker and text), got "
                                 f"{getattr(self, name)}")
        if self.dim < 1:
            raise ValueError(f"dim must be >= 1, got {self.dim}")

    def to_manifest(self) -> dict[str, Any]:
        """JSON-ready dict (the manifest's ``late_interaction``)."""
        data = asdict(self)
        data["skiplist_ids"] = list(self.skiplist_ids)
        return data

    @classmethod
    def from_manifest(cls, data: Mapping[str, Any]) -> LateInteractionSettings:
        """Parse the manifest's ``late_interaction`` field.

        Raises:
            ValueError: A field is missing, unknown or out of range.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"late_interaction must be an object, got {type(data).__name__}")
        expected = set(cls.__dataclass_fields__)
        if set(data) != expected:
            raise ValueError(
                f"late_interaction needs exactly the fields {', '.join(sorted(expected))}; "
                f"missing {sorted(expected - set(data))}, unknown {sorted(set(data) - expected)}")
        try:
            fields = {**data, "skiplist_ids": tuple(int(value) for value in data["skiplist_ids"])}
            return cls(**fields)
        except TypeError as err:
            raise ValueError(f"malformed late_interaction settings: {err}") from err


class LateInteractionEncoder:
    """Query and document rows of a late-interaction model; as a RowEncoder of (query, document)
    pairs, its rows are the pairs' document rows (what a pair costs to run)."""

    def __init__(self, tokenizer: Tokenizer, settings: LateInteractionSettings) -> None:
        self._tokenizer = tokenizer
        self._texts = PlainTokenizer(tokenizer)
        self.settings = settings
        self.max_length = settings.document_length
        # the template's special tokens and the marker
        self._fixed = tokenizer.num_special_tokens_to_add(is_pair=False) + 1
        self._skiplist = np.asarray(settings.skiplist_ids, dtype=np.int64)

    def instruction_for(self, instruction: str | None) -> None:
        """Late-interaction models take no instruction: None, or ValueError for any other."""
        refuse_instruction(instruction, "a late-interaction model")

    def row_budget(self, instruction: str | None = None) -> RowBudget:
        """A document row: the special tokens and the marker, the rest for the document."""
        self.instruction_for(instruction)
        return RowBudget(self.max_length, self._fixed, 0)

    def encode(self, items: Sequence[Pair], *, instruction: str | None = None) -> list[EncodedRow]:
        """The document row of each (query, document) pair."""
        self.instruction_for(instruction)
        return self.encode_documents([document for _, document in items])

    def encode_windows(self, items: Sequence[Pair], *, window_tokens: int | None,
                       overlap_tokens: int, instruction: str | None = None) -> list[EncodedRow]:
        """Not supported: MaxSim already reads every token of a document up to document_length."""
        raise ValueError("long_documents='max_chunk' does not apply to late-interaction models: "
                         "use long_documents='truncate'")

    def encode_queries(self, queries: Sequence[str]) -> list[EncodedRow]:
        """Query rows; with attended expansion, filled to query_length with the expansion id
        (unattended expansion is the padding the run adds: `query_pad_id`)."""
        rows = self._rows(queries, self.settings.query_prefix_id, self.settings.query_length)
        if not (self.settings.query_expansion and self.settings.attend_to_expansion_tokens):
            return rows
        length = self.settings.query_length
        return [EncodedRow(
            np.concatenate([row.ids, np.full(length - len(row.ids),
                                             self.settings.expansion_token_id, np.int64)]),
            np.concatenate([row.type_ids, np.zeros(length - len(row.ids), np.int64)]),
            row.item_index) for row in rows]

    def encode_documents(self, documents: Sequence[str]) -> list[EncodedRow]:
        """Document rows, cut to document_length (the marker costs one token)."""
        return self._rows(documents, self.settings.document_prefix_id,
                          self.settings.document_length)

    def query_keep(self, row: EncodedRow) -> NDArray[np.bool_]:
        """Which output positions of a query row count in MaxSim: every real one, and with query
        expansion every position up to query_length."""
        length = self.settings.query_length if self.settings.query_expansion else len(row.ids)
        return np.ones(length, dtype=bool)

    def document_keep(self, row: EncodedRow) -> NDArray[np.bool_]:
        """Which output positions of a document row count in MaxSim: all but the skiplisted ids."""
        return ~np.isin(row.ids, self._skiplist)

    def _rows(self, texts: Sequence[str], marker: int, length: int) -> list[EncodedRow]:
        room = length - self._fixed
        rows = []
        for index, encoding in enumerate(
                self._texts.encode(texts)):
            if len(encoding.ids) > room:
                encoding.truncate(room)
            full = self._tokenizer.post_process(encoding, add_special_tokens=True)
            ids, type_ids = list(full.ids), list(full.type_ids)
            rows.append(EncodedRow(np.asarray(ids[:1] + [marker] + ids[1:], dtype=np.int64),
                                   np.asarray(type_ids[:1] + [0] + type_ids[1:], dtype=np.int64),
                                   index))
        return rows
