"""Pair tokenization with the Rust `tokenizers` library: one model row per (query, document window)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from onnxrank.engine.plain_tokens import PlainTokenizer
from onnxrank.engine.rows import EncodedRow, RowBudget, refuse_instruction
from onnxrank.engine.spec import ModelSpec
from onnxrank.errors import ModelLoadError
from onnxrank.types import Pair


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


@dataclass(frozen=True, slots=True)
class PairTemplate:
    """The tokenizer's pair layout `prefix query middle document suffix` (special tokens and their
    token types around the two texts), read once from its own post-processor so that each row is
    spliced from token ids without the tokenizer: `[CLS] q [SEP] d [SEP]` for BERT,
    `<s> q </s></s> d </s>` for RoBERTa, nothing around the texts for a bare byte-level BPE."""

    prefix: tuple[list[int], list[int]]  # (ids, type ids)
    middle: tuple[list[int], list[int]]
    suffix: tuple[list[int], list[int]]
    query_type_id: int
    document_type_id: int

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> PairTemplate:
        """Read the layout by post-processing two probe encodings.

        Raises:
            ModelLoadError: The post-processor does not keep the two texts' tokens whole and in
                order (no tokenizers post-processor does that; this guards the splice).
        """
        probes = [tokenizer.encode(text, add_special_tokens=False) for text in ("query", "document")]
        query, document = (probe.ids for probe in probes)
        merged = tokenizer.post_process(probes[0], probes[1], add_special_tokens=True)
        unusable = ModelLoadError(
            "the tokenizer's post-processor does not place a pair as `specials query specials "
            f"document specials` (probe ids {merged.ids}); onnxrank cannot build its rows"
        )
        # positions of the probe texts' own tokens (every other token is the post-processor's)
        plain = [position for position, special in enumerate(merged.special_tokens_mask)
                 if not special]
        if not query or not document or len(plain) != len(query) + len(document):
            raise unusable
        query_start, document_start = plain[0], plain[len(query)]
        query_end, document_end = query_start + len(query), document_start + len(document)
        each_text_whole = plain == [*range(query_start, query_end),
                                    *range(document_start, document_end)]
        in_order = [merged.ids[position] for position in plain] == query + document
        if not (each_text_whole and in_order):
            raise unusable

        def piece(start: int, stop: int) -> tuple[list[int], list[int]]:
            return merged.ids[start:stop], merged.type_ids[start:stop]

        return cls(prefix=piece(0, query_start), middle=piece(query_end, document_start),
                   suffix=piece(document_end, len(merged.ids)),
                   query_type_id=merged.type_ids[query_start],
                   document_type_id=merged.type_ids[document_start])

    @property
    def special_tokens(self) -> int:
        return len(self.prefix[0]) + len(self.middle[0]) + len(self.suffix[0])

    def row(self, query: list[int], document: list[int], index: int,
            span: tuple[int, int] | None = None) -> EncodedRow:
        """The row of `query` and `document` ids (both already cut to fit)."""
        ids = self.prefix[0] + query + self.middle[0] + document + self.suffix[0]
        type_ids = (self.prefix[1] + [self.query_type_id] * len(query) + self.middle[1]
                    + [self.document_type_id] * len(document) + self.suffix[1])
        return EncodedRow(ids=np.asarray(ids, dtype=np.int64),
                          type_ids=np.asarray(type_ids, dtype=np.int64), item_index=index,
                          span=span)


class PairEncoder:
    """Turns (query, document) pairs into model rows, truncating the document side first.

    Queries longer than half of `max_length` are cut to that half: the document needs room,
    and a query that long is nearly always pasted text rather than a search query.
    """

    def __init__(self, tokenizer: Tokenizer, max_length: int) -> None:
        self.max_length = max_length
        self.max_query_tokens = max_length // 2
        # Each query is tokenized once and each document alone, then rows are spliced from ids:
        # the tokenizer's pair encoding tokenized the query again with every document (0.85x
        # the time on short passages, docs/engine.md).
        self._template = PairTemplate.of(tokenizer)
        self._texts = PlainTokenizer(tokenizer)

    def _queries_first(self, pairs: Sequence[Pair]) -> tuple[list[str], list[str]]:
        """The distinct queries, and the texts to tokenize in one call: those queries, then the
        documents (a call of its own for the query cost 0.2-0.3 ms more per query of 50 short
        passages on amx: results/bench-runs.md)."""
        queries = list(dict.fromkeys(query for query, _ in pairs))
        return queries, [*queries, *(document for _, document in pairs)]

    def _capped(self, queries: list[str], ids: Iterable[list[int]]) -> dict[str, list[int]]:
        """Each query's ids (the first of `ids`, in order), cut to max_query_tokens."""
        return {query: query_ids[:self.max_query_tokens] for query, query_ids in zip(queries, ids)}

    def instruction_for(self, instruction: str | None) -> None:
        """Cross-encoders take no instruction: None, or ValueError for any other value."""
        refuse_instruction(instruction, "a cross-encoder")

    def row_budget(self, instruction: str | None = None) -> RowBudget:
        """How a row is shared (the instruction is checked as `instruction_for` does)."""
        self.instruction_for(instruction)
        return RowBudget(self.max_length, self._template.special_tokens, self.max_query_tokens)

    def encode(self, pairs: Sequence[Pair], *, instruction: str | None = None) -> list[EncodedRow]:
        """One row per pair; documents are truncated so the row fits `max_length` (the
        tokenizer's own `only_second` truncation of the pair, after the query cap)."""
        self.instruction_for(instruction)
        queries, texts = self._queries_first(pairs)
        ids = self._texts.ids(texts)
        capped = self._capped(queries, ids)
        room = self.max_length - self._template.special_tokens
        rows = []
        for index, ((query, _), document) in enumerate(zip(pairs, ids[len(queries):])):
            query_ids = capped[query]
            rows.append(self._template.row(query_ids, document[:room - len(query_ids)], index))
        return rows

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
        queries, texts = self._queries_first(pairs)
        # offsets give each window's character span
        encodings = self._texts.encode(texts, offsets=True)
        capped = self._capped(queries, (encoding.ids for encoding in encodings))
        rows = []
        for index, ((query, document_text), document) in enumerate(
                zip(pairs, encodings[len(queries):])):
            query_ids = capped[query]
            room = self.max_length - self._template.special_tokens - len(query_ids)
            window = room if window_tokens is None else min(window_tokens, room)
            if len(document.ids) <= window:
                rows.append(self._template.row(query_ids, document.ids, index,
                                               (0, len(document_text))))
                continue
            document.truncate(window, stride=min(overlap_tokens, window - 1))
            for part in [document, *document.overflowing]:
                offsets = part.offsets
                span = (offsets[0][0], offsets[-1][1]) if offsets else (0, 0)
                rows.append(self._template.row(query_ids, part.ids, index, span))
        return rows
