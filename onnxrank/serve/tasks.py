"""The two tasks a Batcher runs: rerank runs (pairs -> logits) and embedding runs (texts -> vectors).

Each task is a thin adapter from one engine call to `TaskRun`; the computation stays in the
engine (``Reranker.score_detailed``, ``Embedder.embed_detailed``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxrank.engine.embedder import Embedder
from onnxrank.engine.reranker import Reranker
from onnxrank.serve.batcher import BatchTask, TaskRun
from onnxrank.serve.metrics import ServerMetrics
from onnxrank.types import Pair

WARM_UP_PAIRS: list[Pair] = [("warm up the engine", "one short document to score at start")]
WARM_UP_TEXTS = ["warm up the engine with one short text"]


class RerankTask:
    """Scores (query, document) pairs: raw logits, one per pair."""

    name = "rerank"
    warm_up_items: Sequence[Any] = WARM_UP_PAIRS

    def __init__(self, reranker: Reranker) -> None:
        self.reranker = reranker

    def run(self, items: Sequence[Any], options: str | None) -> TaskRun:
        """One ``score_detailed`` call over the pairs of every merged request; `options` is the
        decoder reranker's instruction (None: the model's default)."""
        run = self.reranker.score_detailed(items, instruction=options)
        return TaskRun(values=np.asarray(run.scores), token_counts=np.asarray(run.token_counts),
                       tokenize_ms=float(run.tokenize_ms), inference_ms=float(run.inference_ms),
                       batches=list(run.batches))

    def items_counter(self, metrics: ServerMetrics) -> Any:
        """Pairs scored."""
        return metrics.pairs_scored


class EmbeddingTask:
    """Embeds texts: one L2-normalised float32 vector per text, exactly ``Embedder.embed``'s.

    A run's token counts (for ``usage`` and the batch metrics) are the ones the embedder's own
    tokenization produced (``Embedder.embed_detailed``). `count_tokens` is for the checks made
    before a request is queued (TEI's ``truncate: false`` and ``--max-tokens``).
    """

    name = "embedding"
    warm_up_items: Sequence[Any] = WARM_UP_TEXTS

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder

    def count_tokens(self, texts: Sequence[str], *, truncate: bool = True) -> list[int]:
        """Tokens per text, special tokens included (capped at max_length when `truncate`), as
        the embedder's own row encoder counts them."""
        return self.embedder.count_tokens(texts, truncate=truncate)

    def run(self, items: Sequence[Any], options: str | None) -> TaskRun:
        """One ``embed_detailed`` call over the texts of every merged request (no options)."""
        run = self.embedder.embed_detailed(items)
        return TaskRun(values=run.vectors, token_counts=run.token_counts,
                       tokenize_ms=run.tokenize_ms, inference_ms=run.inference_ms,
                       batches=run.batches)

    def items_counter(self, metrics: ServerMetrics) -> Any:
        """Texts embedded."""
        return metrics.texts_embedded


def task_for(engine: Reranker | Embedder) -> BatchTask:
    """The task of a loaded engine, from its kind: a Reranker's (cross-encoder or decoder) scores
    pairs, an Embedder's embeds texts."""
    if isinstance(engine, Reranker):
        return RerankTask(engine)
    return EmbeddingTask(engine)
