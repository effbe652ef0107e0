"""Deterministic benchmark workloads: real queries, candidate passages cut from real abstracts.

A dataset in the shared format (``corpus.jsonl``, ``queries.jsonl``) is turned into requests of one
query and `candidates` passages whose lengths, counted in the model's own wordpiece tokens, fall in a
regime's range. Passages start at a document's first token and run on into the following documents
(in a seeded order) until the drawn length is reached, then end on a word boundary, so every passage
is real text and a re-tokenisation gives back exactly the counted length.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import numpy as np
from tokenizers import Tokenizer

logger = logging.getLogger(__name__)

DEFAULT_CANDIDATES = 50
DEFAULT_SEED = 20261122

LengthDistribution = Literal["uniform", "log_uniform"]


@dataclass(frozen=True, slots=True)
class Regime:
    """A range of document lengths in wordpiece tokens (document side only, no special tokens).

    Attributes:
        name: Short name used on the command line and in reports.
        min_tokens: Shortest passage.
        max_tokens: Longest passage.
        description: What kind of traffic the regime stands for.
        distribution: How lengths are drawn in the range: "uniform" in tokens, or "log_uniform"
            (uniform in log length: every doubling of length is equally likely).
    """

    name: str
    min_tokens: int
    max_tokens: int
    description: str
    distribution: LengthDistribution = "uniform"

    def __post_init__(self) -> None:
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"regime {self.name!r} needs 1 <= min_tokens <= max_tokens, "
                f"got {self.min_tokens}..{self.max_tokens}"
            )
        if self.distribution not in get_args(LengthDistribution):
            raise ValueError(
                f"regime {self.name!r}: distribution must be "
                f"{' or '.join(map(repr, get_args(LengthDistribution)))}, got {self.distribution!r}"
            )

    def draw_lengths(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """`size` target lengths in [min_tokens, max_tokens], drawn by the regime's distribution."""
        if self.distribution == "uniform":
            return rng.integers(self.min_tokens, self.max_tokens + 1, size=size)
        logs = rng.uniform(math.log(self.min_tokens), math.log(self.max_tokens + 1), size=size)
        return np.minimum(np.exp(logs).astype(np.int64), self.max_tokens)


REGIMES: dict[str, Regime] = {
    "short": Regime("short", 60, 100, "MS MARCO-like passages"),
    "medium": Regime("medium", 200, 256, "paragraph-sized chunks"),
    "long": Regime("long", 400, 512, "400-word RAG chunks (truncated at max_length)"),
    # Real length distributions are skewed: many short texts, few long ones. Log-uniform puts as
    # many candidates in 20-40 tokens as in 256-512 (median about 100), a spread between the shared
    # collections' (medians: Cranfield 173, CACM 26), where uniform in tokens would put the median
    # at 266, longer than either.
    "mixed": Regime(
        "mixed", 20, 512,
        "a wide spread inside each candidate list (titles to full chunks, log-uniform): where "
        "length sorting and token budgets matter",
        distribution="log_uniform",
    ),
}
# The mixed range with lengths uniform in tokens (mixed's definition before 2026-11-22). The
# padding scenario reports it next to mixed: padding to 512 wastes the least here, so it shows
# the smallest gain batching can offer on a wide spread.
MIXED_UNIFORM = Regime(
    "mixed_uniform", 20, 512, "the mixed range, lengths uniform in tokens (median 266)"
)
LONG_DOCUMENTS = Regime(
    "long_documents", 1000, 2000, "whole documents longer than one model window"
)


def parse_regimes(value: str) -> list[Regime]:
    """Regimes from a comma-separated list such as ``"short,mixed"``.

    Raises:
        ValueError: An unknown or empty name.
    """
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in REGIMES]
    if unknown or not names:
        raise ValueError(
            f"unknown regimes {unknown or value!r}; choose from {', '.join(REGIMES)} "
            "(comma-separated)"
        )
    return [REGIMES[name] for name in names]


@dataclass(frozen=True, slots=True)
class Dataset:
    """Texts of a dataset directory in the shared format.

    Attributes:
        name: Directory name.
        path: The directory.
        documents: Document texts (title prepended when the text does not already start with it).
        queries: Query texts.
    """

    name: str
    path: Path
    documents: tuple[str, ...]
    queries: tuple[str, ...]


def _document_text(record: dict[str, str]) -> str:
    title = record.get("title", "").strip()
    text = record.get("text", "").strip()
    # Cranfield repeats the title at the start of the text; CACM often has a title only.
    if not title or text.startswith(title):
        return text
    return f"{title} {text}".strip()


def load_dataset(path: str | Path) -> Dataset:
    """Read ``corpus.jsonl`` and ``queries.jsonl`` from a dataset directory; empty texts are dropped.

    Raises:
        FileNotFoundError: A file is missing (the message names file and directory).
        ValueError: A line is not JSON, or the dataset has no documents or no queries.
    """
    directory = Path(path)
    texts: dict[str, list[str]] = {}
    for file_name, reader in (("corpus.jsonl", _document_text), ("queries.jsonl", None)):
        file_path = directory / file_name
        if not file_path.is_file():
            raise FileNotFoundError(
                f"could not find {file_name} in {directory}; a dataset directory holds "
                "corpus.jsonl and queries.jsonl (see onnxrank/bench/suite/data/README.md)"
            )
        collected = []
        with open(file_path, encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as err:
                    raise ValueError(f"{file_path} line {number} is not JSON: {err}") from err
                text = reader(record) if reader else str(record.get("text", "")).strip()
                if text:
                    collected.append(text)
        if not collected:
            raise ValueError(f"{file_path} holds no non-empty texts")
        texts[file_name] = collected
    return Dataset(
        name=directory.name,
        path=directory,
        documents=tuple(texts["corpus.jsonl"]),
        queries=tuple(texts["queries.jsonl"]),
    )


@dataclass(frozen=True, slots=True)
class Request:
    """One rerank call: a query and its candidates, with each candidate's length in tokens."""

    query: str
    documents: tuple[str, ...]
    token_counts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Workload:
    """Requests of one regime, built deterministically from a dataset and a seed."""

    regime: Regime
    dataset: str
    seed: int
    requests: tuple[Request, ...]

    @property
    def pairs(self) -> int:
        """Number of (query, document) pairs over all requests."""
        return sum(len(request.documents) for request in self.requests)

    def describe(self) -> dict[str, object]:
        """JSON-ready facts about the workload for reports."""
        counts = np.array([n for request in self.requests for n in request.token_counts])
        return {
            "regime": self.regime.name,
            "token_range": [self.regime.min_tokens, self.regime.max_tokens],
            "distribution": self.regime.distribution,
            "dataset": self.dataset,
            "seed": self.seed,
            "queries": len(self.requests),
            "pairs": self.pairs,
            "document_tokens": {
                "min": int(counts.min()), "median": float(np.median(counts)),
                "max": int(counts.max()),
            } if counts.size else {},
        }


class PassageSource:
    """All documents of a dataset concatenated (seeded order) and tokenised once.

    Args:
        dataset: Where the text comes from.
        tokenizer: The model's tokenizer (``tokenizer.json``), without truncation or padding.
        seed: Seeds the document order.
    """

    def __init__(self, dataset: Dataset, tokenizer: Tokenizer, *, seed: int = DEFAULT_SEED) -> None:
        self.dataset = dataset
        self.seed = seed
        order = np.random.default_rng(seed).permutation(len(dataset.documents))
        parts = [dataset.documents[index] for index in order]
        self.text = " ".join(parts)
        encoding = tokenizer.encode(self.text, add_special_tokens=False)
        self._starts = np.array([start for start, _ in encoding.offsets], dtype=np.int64)
        self._ends = np.array([end for _, end in encoding.offsets], dtype=np.int64)
        word_ids = np.array(
            [-1 if word is None else word for word in encoding.word_ids], dtype=np.int64
        )
        # A token starts a word when its word id differs from the previous token's.
        self._word_start = np.ones(len(word_ids), dtype=bool)
        self._word_start[1:] = word_ids[1:] != word_ids[:-1]
        document_starts, position = [], 0
        for part in parts:
            document_starts.append(position)
            position += len(part) + 1
        token_of_char = np.searchsorted(self._starts, document_starts)
        self._document_tokens = np.unique(token_of_char[token_of_char < len(self._starts)])
        self.tokens = len(self._starts)

    def passage(self, first_token: int, target_tokens: int, min_tokens: int) -> tuple[str, int]:
        """Text of about `target_tokens` tokens from `first_token`, ending on a word boundary.

        Returns:
            The passage and its exact token count (between `min_tokens` and `target_tokens`).
        """
        stop = min(first_token + target_tokens, self.tokens)
        # Step back until the token after the passage starts a new word (no split words).
        while stop < self.tokens and stop - first_token > min_tokens and not self._word_start[stop]:
            stop -= 1
        text = self.text[self._starts[first_token]:self._ends[stop - 1]]
        return text, stop - first_token

    def document_starts(self, max_tokens: int) -> np.ndarray:
        """First tokens of documents that leave room for `max_tokens` tokens before the end."""
        starts = self._document_tokens[self._document_tokens + max_tokens <= self.tokens]
        if starts.size == 0:
            raise ValueError(
                f"dataset {self.dataset.name!r} has {self.tokens} tokens in all, too few for "
                f"passages of {max_tokens} tokens; use a larger --dataset"
            )
        return starts


def build_workload(
    source: PassageSource,
    regime: Regime,
    *,
    queries: int,
    candidates: int = DEFAULT_CANDIDATES,
    seed: int = DEFAULT_SEED,
) -> Workload:
    """Requests of `candidates` passages each, lengths drawn by the regime's distribution.

    Queries are the dataset's, drawn without replacement (repeating only once all were used).

    Raises:
        ValueError: queries or candidates < 1, or a dataset too small for the regime.
    """
    if queries < 1 or candidates < 1:
        raise ValueError(f"queries and candidates must be >= 1, got {queries} and {candidates}")
    # One generator per (seed, regime) so that adding a regime never changes another's texts
    # (uniform regimes keep the seeds they had before distributions existed).
    entropy = [seed, regime.min_tokens, regime.max_tokens]
    if regime.distribution == "log_uniform":
        entropy.append(1)
    rng = np.random.default_rng(entropy)
    starts = source.document_starts(regime.max_tokens)
    query_order = np.concatenate(
        [rng.permutation(len(source.dataset.queries)) for _ in range(
            -(-queries // len(source.dataset.queries)))]
    )[:queries]
    requests = []
    for query_index in query_order:
        first_tokens = rng.choice(starts, size=candidates, replace=candidates > len(starts))
        targets = regime.draw_lengths(rng, candidates)
        documents, counts = [], []
        for first_token, target in zip(first_tokens, targets):
            text, count = source.passage(int(first_token), int(target), regime.min_tokens)
            documents.append(text)
            counts.append(count)
        requests.append(Request(
            query=source.dataset.queries[int(query_index)],
            documents=tuple(documents),
            token_counts=tuple(counts),
        ))
    logger.info("built %d %s requests of %d candidates from %s", queries, regime.name,
                candidates, source.dataset.name)
    return Workload(regime=regime, dataset=source.dataset.name, seed=seed,
                    requests=tuple(requests))
