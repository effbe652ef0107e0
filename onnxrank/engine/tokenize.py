"""Pair tokenization with the Rust `tokenizers` library: one model row per (query, document window)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from onnxrank.engine.spec import ModelSpec
from onnxrank.errors import ModelLoadError
from onnxrank.types import Pair

if TYPE_CHECKING:
    from onnxrank.engine.prompt import PromptEncoder


@dataclass(frozen=True, slots=True)
class EncodedRow:
    """One model input row: token ids of `[CLS] query [SEP] document-part [SEP]`."""

    ids: np.ndarray  # int64 [length]
    type_ids: np.ndarray  # int64 [length]
    pair_index: int  # which input pair this row scores
    span: tuple[int, int] | None = None  # character span of the document part (window mode)


@dataclass(frozen=True, slots=True)
class RowBudget:
    """How an encoder shares a row of `max_length` tokens: `fixed_tokens` that are neither query
    nor document (special tokens; a decoder's prompt and instruction), at most `max_query_tokens`
    of the query, and the rest for the document (cut to fit)."""

    max_length: int
    fixed_tokens: int
    max_query_tokens: int


def load_tokenizer(spec: ModelSpec, model_dir: Path) -> Tokenizer:
    """Load tokenizer.json and check it against the model's vocabulary.

    Raises:
        ModelLoadError: The file is missing or unreadable, or its vocabulary does not fit the model.
    """
    path = Path(model_dir) / spec.tokenizer_file
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception on bad files
        raise ModelLoadError(f"could not load tokenizer {spec.tokenizer_file} in {model_dir}: {err}") from err
    tokenizer_vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    # A tokenizer may have fewer ids than the embedding matrix (padding rows), never more.
    if tokenizer_vocab > spec.vocab_size:
        raise ModelLoadError(
            f"tokenizer {path} has {tokenizer_vocab} tokens but the model's vocabulary has "
            f"{spec.vocab_size}: the tokenizer does not belong to this model"
        )
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


class PairEncoder:
    """Turns (query, document) pairs into model rows, truncating the document side first.

    Queries longer than half of `max_length` are cut to that half: the document needs room,
    and a query that long is nearly always pasted text rather than a search query.
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int) -> None:
        self._tokenizer = tokenizer
        self.max_length = max_length
        self.max_query_tokens = max_length // 2
        self._special_tokens = tokenizer.num_special_tokens_to_add(is_pair=True)
        # Whole pairs go through Rust in one call (encode_batch_fast, no offsets): 2,000 Cranfield
        # pairs took 253 ms this way vs 310 ms splicing per pair in Python (docs/engine.md).
        # Truncation settings live on the Tokenizer object, so this copy owns them.
        self._pair_tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self._pair_tokenizer.enable_truncation(max_length, strategy="only_second")

    def _encode_plain(self, texts: Sequence[str]) -> list[Encoding]:
        return self._tokenizer.encode_batch(list(texts), add_special_tokens=False)

    def _cap_queries(self, queries: Sequence[str]) -> dict[str, Encoding]:
        unique = list(dict.fromkeys(queries))
        encodings = self._encode_plain(unique)
        for encoding in encodings:
            if len(encoding.ids) > self.max_query_tokens:
                encoding.truncate(self.max_query_tokens)
        return dict(zip(unique, encodings))

    def instruction_for(self, instruction: str | None) -> None:
        """Cross-encoders take no instruction: None, or ValueError for any other value."""
        if instruction is not None:
            raise ValueError(
                f"instruction={instruction!r:.60} applies only to decoder rerankers (models "
                "exported with --recipe); this model is a cross-encoder: leave instruction unset"
            )

    def row_budget(self, instruction: str | None = None) -> RowBudget:
        """How a row is shared (the instruction is checked as `instruction_for` does)."""
        self.instruction_for(instruction)
        return RowBudget(self.max_length, self._special_tokens, self.max_query_tokens)

    def encode(self, pairs: Sequence[Pair], *, instruction: str | None = None) -> list[EncodedRow]:
        """One row per pair; documents are truncated so the row fits `max_length`."""
        self.instruction_for(instruction)
        query_encodings = self._cap_queries([query for query, _ in pairs])
        capped = {query: _text_of(query, encoding) for query, encoding in query_encodings.items()}
        encodings = self._pair_tokenizer.encode_batch_fast(
            [(capped[query], document) for query, document in pairs]
        )
        return [
            EncodedRow(
                ids=np.asarray(encoding.ids, dtype=np.int64),
                type_ids=np.asarray(encoding.type_ids, dtype=np.int64),
                pair_index=index,
            )
            for index, encoding in enumerate(encodings)
        ]

    def encode_windows(
        self, pairs: Sequence[Pair], *, window_tokens: int | None, overlap_tokens: int,
        instruction: str | None = None,
    ) -> list[EncodedRow]:
        """Rows for every token window of each document (with its character span).

        Args:
            pairs: (query, document) pairs.
            window_tokens: Document tokens per window; None fills what the query leaves free.
            overlap_tokens: Tokens shared by consecutive windows.
            instruction: Must be None (cross-encoders take none).
        """
        self.instruction_for(instruction)
        query_encodings = self._cap_queries([query for query, _ in pairs])
        document_encodings = self._encode_plain([document for _, document in pairs])
        rows = []
        for index, ((query, document_text), document) in enumerate(
            zip(pairs, document_encodings)
        ):
            query_encoding = query_encodings[query]
            room = self.max_length - self._special_tokens - len(query_encoding.ids)
            window = room if window_tokens is None else min(window_tokens, room)
            if len(document.ids) <= window:
                rows.append(self._row(query_encoding, document, index, (0, len(document_text))))
                continue
            document.truncate(window, stride=min(overlap_tokens, window - 1))
            for part in [document, *document.overflowing]:
                offsets = part.offsets
                span = (offsets[0][0], offsets[-1][1]) if offsets else (0, 0)
                rows.append(self._row(query_encoding, part, index, span))
        return rows

    def _row(
        self, query: Encoding, document: Encoding, index: int, span: tuple[int, int] | None
    ) -> EncodedRow:
        # post_process applies the tokenizer's own template ([CLS] q [SEP] d [SEP] for BERT,
        # <s> q </s></s> d </s> for RoBERTa), so any model family gets its exact special tokens.
        merged = self._tokenizer.post_process(query, document, add_special_tokens=True)
        return EncodedRow(
            ids=np.asarray(merged.ids, dtype=np.int64),
            type_ids=np.asarray(merged.type_ids, dtype=np.int64),
            pair_index=index,
            span=span,
        )


def make_encoder(tokenizer: Tokenizer, max_length: int,
                 prompt: dict[str, Any] | None = None) -> PairEncoder | PromptEncoder:
    """The row encoder a manifest asks for: a decoder reranker's PromptEncoder when it records a
    prompt recipe (ModelSpec.prompt), else the cross-encoder PairEncoder.

    Raises:
        ValueError: The prompt entry is not a valid recipe.
    """
    if prompt is None:
        return PairEncoder(tokenizer, max_length)
    from onnxrank.engine.prompt import PromptEncoder  # it builds on EncodedRow from this module
    from onnxrank.export.recipes import PromptRecipe

    return PromptEncoder(tokenizer, max_length,
                         PromptRecipe.from_dict(prompt, origin="the manifest's prompt recipe"))


def _text_of(query: str, encoding: Encoding) -> str:
    """The query text that `encoding` (possibly truncated) covers."""
    if not encoding.overflowing:
        return query
    return query[: encoding.offsets[-1][1]] if encoding.offsets else ""
