"""The `none` backend: the retrieval order, unscored (for A/B runs and for switching reranking off)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from onnxrank.rerankers.base import check_rerank_arguments, retrieval_order

if TYPE_CHECKING:
    from onnxrank.engine.ranking import RankedDocument


class NoReranker:
    """Returns the documents in input order, flagged ``reranked=False``, without a warning."""

    name = "none"

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_k: int | None = None,
        deadline_ms: float | None = None,
    ) -> list[RankedDocument]:
        """The input order.

        Raises:
            ValueError, TypeError: Bad arguments.
        """
        documents = check_rerank_arguments(query, documents, top_k, deadline_ms)
        return list(retrieval_order(documents, top_k=top_k, backend=self.name))
