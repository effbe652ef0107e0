"""Fusion (rrf and convex) against hand values, edge cases and a brute-force oracle."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from onnxrank.retrieval.fusion import FusedCandidate, FusionConfig, fuse, zscores

RRF = FusionConfig(fusion="rrf")
CONVEX = FusionConfig(fusion="convex", fusion_weight=0.5)
TIE_TOLERANCE = 1e-9


def labels(fused: list[FusedCandidate]) -> list[int]:
    return [candidate.label for candidate in fused]


def oracle(
    lexical: list[tuple[int, float]] | None, dense: list[tuple[int, float]] | None, config: FusionConfig
) -> dict[int, tuple[float, int]]:
    """label -> (fused score, best single rank), straight from the definitions, one label at a time."""
    sides = [side for side in (lexical, dense) if side is not None]
    weights = [1.0] * len(sides)
    if config.fusion == "convex" and len(sides) == 2:
        weights = [1.0 - config.fusion_weight, config.fusion_weight]
    result = {}
    for label in {label for side in sides for label, _ in side}:
        score = 0.0
        ranks = []
        for weight, side in zip(weights, sides):
            ids = [item for item, _ in side]
            if label in ids:
                ranks.append(ids.index(label) + 1)
            if config.fusion == "rrf":
                term = 1.0 / (config.rrf_k + ids.index(label) + 1) if label in ids else 0.0
            elif not ids:  # the side returned nothing
                term = 0.0
            else:
                values = np.array([value for _, value in side], dtype=np.float64)
                if values.max() == values.min():
                    normalized = np.zeros(len(values))
                else:
                    normalized = (values - values.mean()) / values.std()
                term = normalized[ids.index(label)] if label in ids else normalized.min()
            score += weight * term
        result[label] = (float(score), min(ranks))
    return result


def assert_matches_oracle(fused: list[FusedCandidate], expected: dict[int, tuple[float, int]]) -> None:
    assert sorted(labels(fused)) == sorted(expected)
    for candidate in fused:
        assert candidate.score == pytest.approx(expected[candidate.label][0], abs=1e-9), candidate
    for first, second in zip(fused, fused[1:]):
        (score_a, rank_a), (score_b, rank_b) = expected[first.label], expected[second.label]
        assert score_a >= score_b - TIE_TOLERANCE, (first, second)
        if abs(score_a - score_b) <= TIE_TOLERANCE:  # a tie: best single rank, then label
            assert (rank_a, first.label) < (rank_b, second.label), (first, second)


def random_side(rng: np.random.Generator, tied: bool) -> list[tuple[int, float]]:
    """Up to 30 distinct labels of 40, best first; `tied` draws scores from 3 values."""
    chosen = rng.permutation(40)[: rng.integers(0, 31)]
    values = rng.integers(0, 3, len(chosen)).astype(float) if tied else rng.normal(0, 5, len(chosen))
    return sorted(((int(label), float(value)) for label, value in zip(chosen, values)), key=lambda x: -x[1])


@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force_oracle(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tied = bool(seed % 2)
    lexical = random_side(rng, tied)
    dense = random_side(rng, tied) if seed % 5 else None  # every fifth case: one side only
    config = (
        FusionConfig(fusion="rrf", rrf_k=int(rng.integers(1, 100)))
        if seed % 3 == 0
        else FusionConfig(fusion="convex", fusion_weight=float(rng.choice([0.0, 0.3, 0.5, 0.7, 1.0])))
    )
    assert_matches_oracle(fuse(lexical, dense, config), oracle(lexical, dense, config))


def test_rrf_hand_computed_example() -> None:
    fused = fuse([(1, 9.0), (2, 8.0), (3, 7.0)], [(3, 0.9), (1, 0.8)], RRF)
    expected = {1: 1 / 61 + 1 / 62, 2: 1 / 62, 3: 1 / 63 + 1 / 61}
    assert labels(fused) == [1, 3, 2]
    for candidate in fused:
        assert candidate.score == pytest.approx(expected[candidate.label], abs=1e-12)
    assert (fused[2].lexical_normalized, fused[2].dense_normalized) == (1 / 62, 0.0)


def test_rrf_agreement_beats_a_single_first_place() -> None:
    assert labels(fuse([(9, 2.0), (5, 1.0)], [(7, 0.9), (8, 0.8), (5, 0.7)], RRF))[0] == 5


def test_convex_hand_computed_example() -> None:
    # lexical z: mean 2, std 1 -> [1, -1]; dense z: mean 0.5, std sqrt(0.32 / 3) -> [c, 0, -c]
    c = 0.4 / math.sqrt(0.32 / 3)
    fused = fuse([(1, 3.0), (2, 1.0)], [(2, 0.9), (3, 0.5), (4, 0.1)], CONVEX)
    expected = {
        1: (1.0, -c),  # not in the dense list: the dense side's lowest z-score
        2: (-1.0, c),
        3: (-1.0, 0.0),  # not in the lexical list: the lexical side's lowest z-score
        4: (-1.0, -c),
    }
    assert labels(fused) == [2, 1, 3, 4]
    for candidate in fused:
        lexical, dense = expected[candidate.label]
        assert candidate.lexical_normalized == pytest.approx(lexical, abs=1e-12)
        assert candidate.dense_normalized == pytest.approx(dense, abs=1e-12)
        assert candidate.score == pytest.approx(0.5 * lexical + 0.5 * dense, abs=1e-12)


def test_convex_weight_moves_the_order_between_the_sides() -> None:
    lexical = [(1, 12.0), (2, 11.0), (3, 4.0)]
    dense = [(3, 0.9), (2, 0.5), (1, 0.45)]
    assert labels(fuse(lexical, dense, FusionConfig(fusion="convex", fusion_weight=0.0))) == [1, 2, 3]
    assert labels(fuse(lexical, dense, FusionConfig(fusion="convex", fusion_weight=1.0))) == [3, 2, 1]


def test_a_side_with_no_hits_adds_nothing() -> None:
    lexical = [(4, 5.0), (2, 3.0), (9, 1.0)]
    for config in (RRF, CONVEX):
        fused = fuse(lexical, [], config)
        assert labels(fused) == [4, 2, 9]
        assert {candidate.dense_normalized for candidate in fused} == {0.0}
        assert fuse([], [], config) == []


def test_one_side_only_is_that_sides_order_unweighted() -> None:
    dense = [(7, 0.9), (3, 0.2), (5, 0.1)]
    for weight in (0.0, 1.0):
        fused = fuse(None, dense, FusionConfig(fusion="convex", fusion_weight=weight))
        assert labels(fused) == [7, 3, 5]
        assert [candidate.score for candidate in fused] == zscores([0.9, 0.2, 0.1])
        assert {candidate.lexical_normalized for candidate in fused} == {None}


def test_equal_scores_carry_no_information() -> None:
    assert zscores([2.5, 2.5, 2.5]) == [0.0, 0.0, 0.0]
    assert zscores([0.1] * 7) == [0.0] * 7  # equal up to the rounding of their mean
    assert zscores([3.0]) == [0.0]
    assert zscores([]) == []
    # The lexical side is flat, so the dense side alone decides, whatever the weight.
    fused = fuse([(1, 2.0), (2, 2.0), (3, 2.0)], [(3, 0.8), (1, 0.4), (2, 0.1)], CONVEX)
    assert labels(fused) == [3, 1, 2]


def test_ties_break_by_best_rank_then_label() -> None:
    # Each label is first in one list only: equal rrf scores and best ranks, so labels decide.
    assert labels(fuse([(8, 1.0)], [(3, 0.5)], RRF)) == [3, 8]
    # Both sides flat: every convex score is 0; best single rank first, then label.
    fused = fuse([(5, 1.0), (6, 1.0)], [(9, 0.3), (6, 0.3), (2, 0.3)], CONVEX)
    assert {candidate.score for candidate in fused} == {0.0}
    assert labels(fused) == [5, 9, 6, 2]  # best ranks 1, 1, 2, 3


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match=re.escape("fusion must be one of rrf, convex, got 'max'")):
        FusionConfig(fusion="max")
    with pytest.raises(ValueError, match=re.escape("rrf_k must be an int >= 1, got 0")):
        FusionConfig(rrf_k=0)
    with pytest.raises(ValueError, match=re.escape("fusion_weight must be a number from 0 to 1, got 1.5")):
        FusionConfig(fusion="convex", fusion_weight=1.5)
    with pytest.raises(ValueError, match=re.escape("the dense list must hold each label at most once")):
        fuse([(1, 1.0)], [(2, 0.5), (2, 0.4)])


def test_labels_name_the_settings() -> None:
    assert (RRF.label, FusionConfig(fusion="convex", fusion_weight=0.3).label) == ("rrf k=60", "convex w=0.3")
