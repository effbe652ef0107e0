"""The gate reads each regime of each part: a variant that reorders short candidate lists fails
even where the part's pooled numbers pass (onnxrank.export.validate.compare, threshold_failures)."""

from __future__ import annotations

import numpy as np

from onnxrank.export.fidelity import FidelityThresholds, score_metrics
from onnxrank.export.gate import attempt_metrics
from onnxrank.export.tasks import RERANK
from onnxrank.export.validate import (
    HELD_OUT,
    MIXED,
    REGIMES,
    SHORT,
    TUNING,
    ValidationInputs,
    compare,
    threshold_failures,
)

GROUPS_PER_REGIME = 4
CANDIDATES = 30


def _scored() -> tuple[ValidationInputs, np.ndarray, np.ndarray]:
    """Groups of 30 per part and regime; the variant keeps every ranking but, in each tuning short
    group, swaps the reference's 10th and 11th candidates (top-10 overlap 0.9 there)."""
    rng = np.random.default_rng(7)
    groups, parts, regimes = [], [], []
    for part in (TUNING, HELD_OUT):
        for regime in REGIMES:
            for index in range(GROUPS_PER_REGIME):
                groups += [f"{part}:{regime}:{index}"] * CANDIDATES
                parts += [part] * CANDIDATES
                regimes += [regime] * CANDIDATES
    reference = rng.normal(size=(len(groups), 1)).astype(np.float32)
    outputs = reference.copy()
    for start in range(0, len(groups), CANDIDATES):
        if (parts[start], regimes[start]) == (TUNING, SHORT):
            members = start + np.argsort(-reference[start:start + CANDIDATES, 0])
            outputs[[members[9], members[10]]] = outputs[[members[10], members[9]]]
    inputs = ValidationInputs(RERANK, [], groups, parts, regimes, [], 0)
    return inputs, reference, outputs


def test_each_part_reports_each_regime_with_the_metrics_of_its_own_pairs() -> None:
    inputs, reference, outputs = _scored()
    metrics = compare(inputs, reference, outputs)
    for values, part in ((metrics, TUNING), (metrics[HELD_OUT], HELD_OUT)):
        assert set(values["regimes"]) == {SHORT, MIXED}
        for regime, regime_values in values["regimes"].items():
            pairs = [index for index in range(len(inputs.groups))
                     if (inputs.parts[index], inputs.regimes[index]) == (part, regime)]
            assert regime_values == score_metrics(reference[pairs, 0], outputs[pairs, 0],
                                                  [inputs.groups[index] for index in pairs])
    assert metrics["top10_overlap"] == 0.95  # pooled over the tuning part: at the floor
    assert metrics["regimes"][SHORT]["top10_overlap"] == 0.9
    assert metrics["regimes"][MIXED]["top10_overlap"] == 1.0
    assert attempt_metrics(metrics)["regimes"][SHORT]["top10_overlap"] == 0.9


def test_a_floor_missed_in_one_regime_fails_though_the_part_passes_pooled() -> None:
    inputs, reference, outputs = _scored()
    metrics = compare(inputs, reference, outputs)
    assert threshold_failures(RERANK, "ov_int8", metrics, FidelityThresholds()) == [
        "variant ov_int8 (tuning, short pairs): top10_overlap = 0.9, threshold >= 0.95 "
        "(--int8-min-top10-overlap)"]
    assert threshold_failures(RERANK, "ov_int8", metrics,
                              FidelityThresholds(int8_min_top10_overlap=0.9)) == []
    # a part without regimes is judged as a whole
    pooled = {key: value for key, value in metrics.items() if key not in ("regimes", HELD_OUT)}
    assert threshold_failures(RERANK, "ov_int8", pooled, FidelityThresholds()) == []
