"""Reciprocal rank fusion against hand values and a brute-force oracle."""

from __future__ import annotations

import re

import numpy as np
import pytest

from onnxrank.retrieval.fusion import fuse


def test_hand_computed_example() -> None:
    fused = fuse([[1, 2, 3], [3, 1]], rrf_k=60)
    expected = {1: 1 / 61 + 1 / 62, 2: 1 / 62, 3: 1 / 63 + 1 / 61}
    assert [item for item, _ in fused] == [1, 3, 2]
    for item, score in fused:
        assert score == pytest.approx(expected[item], abs=1e-12)


def test_agreement_beats_a_single_first_place() -> None:
    assert [item for item, _ in fuse([[9, 5], [7, 8, 5]])][0] == 5


@pytest.mark.parametrize("seed", range(20))
def test_matches_brute_force_oracle(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lists = [list(rng.permutation(30)[: rng.integers(0, 30)]) for _ in range(rng.integers(1, 4))]
    lists = [[int(item) for item in ranked] for ranked in lists]
    rrf_k = int(rng.integers(1, 100))
    oracle: dict[int, float] = {}
    for ranked in lists:
        for position, item in enumerate(ranked):
            oracle[item] = oracle.get(item, 0.0) + 1.0 / (rrf_k + position + 1)
    fused = fuse(lists, rrf_k=rrf_k)
    assert {item for item, _ in fused} == set(oracle)
    scores = [score for _, score in fused]
    assert scores == sorted(scores, reverse=True)
    for item, score in fused:
        assert score == pytest.approx(oracle[item], abs=1e-12)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match=re.escape("rrf_k must be >= 1, got 0")):
        fuse([[1]], rrf_k=0)
    with pytest.raises(ValueError, match=re.escape("each ranked list must hold an id at most once")):
        fuse([[1, 1]])
    assert fuse([]) == []
