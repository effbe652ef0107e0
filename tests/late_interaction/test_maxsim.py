"""MaxSim against a brute-force loop over seeded random vectors."""

from __future__ import annotations

import re

import numpy as np
import pytest

from onnxrank.engine.maxsim import maxsim, maxsim_many


def brute_force(query: np.ndarray, document: np.ndarray) -> float:
    return sum(max(float(np.dot(row, other)) for other in document) for row in query)


@pytest.mark.parametrize("seed", range(6))
def test_maxsim_is_the_sum_of_row_maxima(seed: int) -> None:
    rng = np.random.default_rng(seed)
    dim = int(rng.integers(2, 9))
    query = rng.standard_normal((int(rng.integers(1, 7)), dim)).astype(np.float32)
    documents = [rng.standard_normal((int(rng.integers(1, 12)), dim)).astype(np.float32)
                 for _ in range(4)]
    expected = [brute_force(query, document) for document in documents]
    assert maxsim(query, documents[0]) == pytest.approx(expected[0], abs=1e-5)
    np.testing.assert_allclose(maxsim_many(query, documents), expected, atol=1e-5, rtol=0)
    assert maxsim_many(query, documents).dtype == np.float32


def test_a_document_without_rows_scores_zero() -> None:
    assert maxsim(np.ones((3, 4), np.float32), np.zeros((0, 4), np.float32)) == 0.0


def test_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match=re.escape(
            "query and document vectors differ in dim: 4 against 5")):
        maxsim(np.ones((3, 4), np.float32), np.ones((2, 5), np.float32))
    with pytest.raises(ValueError, match=re.escape(
            "maxsim needs 2-D [rows, dim] arrays, got query shape (4,)")):
        maxsim(np.ones(4, np.float32), np.ones((2, 4), np.float32))
