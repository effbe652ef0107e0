"""MaxSim, the late-interaction score (pure functions, no model).

A query's score against a document is the sum over the query's token vectors of the largest dot
product with any of the document's token vectors (ColBERT; PyLate's and sentence-transformers'
``maxsim``). Both sides are the kept rows only: a query's real and expansion rows, a document's
rows without its skiplisted ones (onnxrank.engine.late_interaction). Each document is scored on
its own rows, so a score never depends on the other documents of a list (padding documents to
one length with zero vectors and no mask, as ``pylate.rank.rerank`` does, would).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray


def maxsim(query: NDArray[np.float32], document: NDArray[np.float32]) -> float:
    """Sum over the query rows of the largest dot product with a document row.

    Args:
        query: [q_rows, dim] token vectors (normalised, masked rows already removed).
        document: [d_rows, dim] token vectors, as `query`.

    Returns:
        The score; 0.0 for a document without rows (nothing in it matches).

    Raises:
        ValueError: Either array is not 2-D, or their dims differ.
    """
    if query.ndim != 2 or document.ndim != 2:
        raise ValueError(f"maxsim needs 2-D [rows, dim] arrays, got query shape {query.shape} "
                         f"and document shape {document.shape}")
    if query.shape[1] != document.shape[1]:
        raise ValueError(f"query and document vectors differ in dim: {query.shape[1]} against "
                         f"{document.shape[1]}")
    if len(document) == 0 or len(query) == 0:
        return 0.0
    return float((query @ document.T).max(axis=1).sum(dtype=np.float64))


def maxsim_many(query: NDArray[np.float32],
                documents: Sequence[NDArray[np.float32]]) -> NDArray[np.float32]:
    """`maxsim` of one query against each document, in input order (float32 [len(documents)]).

    Raises:
        ValueError: As for maxsim.
    """
    return np.asarray([maxsim(query, document) for document in documents], dtype=np.float32)
