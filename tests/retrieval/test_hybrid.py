"""HybridRetriever: modes, hit explanations, filters before truncation, reranking and fallback."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from retrieval_fixtures import bow_rerank_logit

import onnxrank.engine.deadline as engine_deadline_module
from onnxrank import Reranker
from onnxrank.engine.embedder import Embedder
from onnxrank.rerankers import BackendUnavailableError, LocalReranker, NoReranker
from onnxrank.retrieval import Hit, HybridRetriever, LoadTimings
from onnxrank.retrieval.dense import exact_search


@pytest.fixture()
def retriever(index_dir: Path, bow_embedder: Embedder) -> HybridRetriever:
    opened = HybridRetriever.open(index_dir, embedder=bow_embedder)
    yield opened
    opened.close()


@pytest.fixture(scope="module")
def bow_reranker(bow_reranker_dir: Path) -> Reranker:
    return Reranker.from_dir(bow_reranker_dir, device="cpu", threads=1)


def test_hits_are_frozen(retriever: HybridRetriever) -> None:
    hit = retriever.search("heat", k=1)[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        hit.final_rank = 2  # type: ignore[misc]


def test_vector_mode_equals_exact_cosine_search(retriever: HybridRetriever, bow_embedder: Embedder) -> None:
    query = "heat transfer in hypersonic flow"
    hits = retriever.search(query, k=6, mode="vector")
    exact = exact_search(retriever.store, bow_embedder.embed([query])[0], depth=6)
    assert [hit.dense_rank for hit in hits] == [1, 2, 3, 4, 5, 6]
    assert [hit.dense_score for hit in hits] == pytest.approx([score for _, score in exact], abs=1e-5)
    assert all(hit.lexical_rank is None and hit.rerank_score is None for hit in hits)


def test_hybrid_is_rrf_of_both_lists(retriever: HybridRetriever) -> None:
    query = "heat flow"
    lexical = {hit.chunk_id: hit.lexical_rank for hit in retriever.search(query, k=10, mode="lexical")}
    dense = {hit.chunk_id: hit.dense_rank for hit in retriever.search(query, k=10, mode="vector")}
    hybrid = retriever.search(query, k=10, mode="hybrid")
    oracle = {
        chunk_id: sum(1 / (60 + ranks[chunk_id]) for ranks in (lexical, dense) if chunk_id in ranks)
        for chunk_id in set(lexical) | set(dense)
    }
    assert {hit.chunk_id for hit in hybrid} == set(oracle)
    for hit in hybrid:
        assert (hit.lexical_rank, hit.dense_rank) == (
            lexical.get(hit.chunk_id),
            dense.get(hit.chunk_id),
        )
        assert hit.fused_score == pytest.approx(oracle[hit.chunk_id], abs=1e-12)
    assert [hit.fused_score for hit in hybrid] == sorted(oracle.values(), reverse=True)
    assert [hit.final_rank for hit in hybrid] == list(range(1, len(hybrid) + 1))


def test_filters_apply_on_both_sides_before_truncation(retriever: HybridRetriever) -> None:
    # "compiler" is the best match for this query; with k=1 a post-filter would return nothing.
    for mode in ("lexical", "vector", "hybrid"):
        hits = retriever.search(
            "compilers languages construction heat", k=1, mode=mode, filters={"topic": "thermal"}
        )
        assert len(hits) == 1 and hits[0].metadata["topic"] == "thermal", mode
    hits = retriever.search("flow", k=10, mode="vector", filters={"year": {"gte": 1965}})
    assert {hit.source for hit in hits} == {"ablation", "compiler", "sharing"}
    assert retriever.search("flow", k=10, filters={"topic": "none"}) == []


def oracle_scores(reranker: Reranker, query: str, passages: list[str]) -> list[float]:
    """Sigmoid of the fixture model's formula, computed from the token ids in numpy."""
    scores = []
    for passage in passages:
        encoding = reranker.tokenizer.encode(query, passage)
        query_ids = [token for token, kind in zip(encoding.ids, encoding.type_ids) if kind == 0]
        document_ids = [token for token, kind in zip(encoding.ids, encoding.type_ids) if kind == 1]
        scores.append(1 / (1 + math.exp(-bow_rerank_logit(query_ids, document_ids))))
    return scores


def test_rerank_orders_by_the_reranker(retriever: HybridRetriever, bow_reranker: Reranker) -> None:
    query = "heat flow"
    fused = retriever.search(query, k=6, mode="hybrid")
    reranked = retriever.search(query, k=3, mode="hybrid", rerank=True, reranker=bow_reranker, rerank_top_n=6)
    oracle = oracle_scores(bow_reranker, query, [f"{hit.title} {hit.text}" for hit in fused])
    expected = sorted(range(6), key=lambda index: (-oracle[index], index))[:3]
    assert [hit.chunk_id for hit in reranked] == [fused[index].chunk_id for index in expected]
    assert [hit.rerank_score for hit in reranked] == pytest.approx([oracle[i] for i in expected], abs=1e-6)
    assert all(hit.reranked and hit.reranker == "local" for hit in reranked)
    # Candidates beyond rerank_top_n follow in fused order, unreranked.
    tail = retriever.search(query, k=6, rerank=True, reranker=bow_reranker, rerank_top_n=2)
    assert [hit.reranked for hit in tail] == [True, True, False, False, False, False]
    assert [hit.chunk_id for hit in tail[2:]] == [hit.chunk_id for hit in fused[2:6]]


def test_rerank_needs_a_reranker(retriever: HybridRetriever) -> None:
    with pytest.raises(
        ValueError,
        match=re.escape(
            "rerank=True needs a reranker: a backend (onnxrank.rerankers.make_reranker), a "
            "Reranker, or a backend name (local, cohere, llm, none)"
        ),
    ):
        retriever.search("heat flow", rerank=True)
    with pytest.raises(TypeError, match=re.escape("got int")):
        retriever.search("heat flow", rerank=True, reranker=3)  # type: ignore[arg-type]


def test_unloadable_local_model_keeps_the_fused_order_with_one_warning(
    retriever: HybridRetriever, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fused = retriever.search("heat flow", k=4)
    backend = LocalReranker("absent", models_dir=tmp_path)
    with caplog.at_level("WARNING", logger="onnxrank.rerankers"):
        results = [
            retriever.search_detailed("heat flow", k=4, rerank=True, reranker=backend) for _ in range(3)
        ]
    for result in results:
        assert [hit.chunk_id for hit in result.hits] == [hit.chunk_id for hit in fused]
        assert not any(hit.reranked for hit in result.hits)
        assert all(hit.rerank_score is None and hit.reranker is None for hit in result.hits)
        assert result.notes == (
            "note: the local reranker did not score any candidate (see the warning in the log); "
            "hits are in fused order (reranked=false)",
        )
    warnings = [record for record in caplog.records if record.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "local reranker: the model could not be loaded (no exported model named 'absent'" in (
        warnings[0].getMessage()
    )
    strict = LocalReranker("absent", models_dir=tmp_path, on_error="raise")
    with pytest.raises(BackendUnavailableError, match="local reranker: the model could not be loaded"):
        retriever.search("heat flow", k=4, rerank=True, reranker=strict)


def test_bad_arguments(retriever: HybridRetriever) -> None:
    with pytest.raises(ValueError, match=re.escape("query must be a non-empty string, got an empty one")):
        retriever.search("  ")
    with pytest.raises(ValueError, match=re.escape("k must be >= 1, got 0")):
        retriever.search("heat", k=0)
    with pytest.raises(
        ValueError, match=re.escape("mode must be one of vector, lexical, hybrid, got 'fuzzy'")
    ):
        retriever.search("heat", mode="fuzzy")  # type: ignore[arg-type]


def test_lexical_mode_needs_no_embedder(index_dir: Path) -> None:
    retriever = HybridRetriever.open(index_dir)
    try:
        hits = retriever.search("heat conduction slabs", k=2, mode="lexical")
        assert hits[0].source == "heat" and hits[0].lexical_rank == 1
        assert retriever._embedder is None
    finally:
        retriever.close()


def test_the_query_reaches_the_reranker(retriever: HybridRetriever, bow_reranker: Reranker) -> None:
    fused = retriever.search("compilers heat", k=6)
    passages = [f"{hit.title} {hit.text}" for hit in fused]
    # The fixture model's order depends on the query, so a wrong query would change the hits.
    orders = {}
    for query in ("compilers heat", "compilers", "heat conduction"):
        scores = oracle_scores(bow_reranker, query, passages)
        orders[query] = sorted(range(6), key=lambda index, scores=scores: (-scores[index], index))
    assert len({tuple(order) for order in orders.values()}) == 3
    hits = retriever.search("compilers heat", k=6, rerank=True, reranker=bow_reranker, rerank_top_n=6)
    assert [hit.chunk_id for hit in hits] == [fused[index].chunk_id for index in orders["compilers heat"]]


def test_stages_that_did_not_run_take_no_time(retriever: HybridRetriever, bow_reranker: Reranker) -> None:
    result = retriever.search_detailed("heat", k=2, mode="lexical")
    assert (result.timings.dense_ms, result.timings.rerank_ms) == (0.0, 0.0)
    result = retriever.search_detailed("heat", k=2, mode="vector")
    assert (result.timings.lexical_ms, result.timings.rerank_ms) == (0.0, 0.0)
    assert isinstance(result.hits[0], Hit)


def test_payload_is_the_search_as_json(retriever: HybridRetriever, bow_reranker: Reranker) -> None:
    result = retriever.search_detailed(
        "heat flow", k=2, filters={"topic": "thermal"}, rerank=True, reranker=bow_reranker
    )
    payload = json.loads(json.dumps(result.to_dict()))
    assert {key: payload[key] for key in ("query", "k", "mode", "filters", "rerank", "reranker")} == {
        "query": "heat flow", "k": 2, "mode": "hybrid", "filters": {"topic": "thermal"},
        "rerank": True, "reranker": "local",
    }
    assert payload["reranker_model"] == "bow-reranker"
    assert payload["notes"][0].startswith("note: reranker 'bow-reranker' is not relevance-trained")
    assert [record["chunk_id"] for record in payload["results"]] == [hit.chunk_id for hit in result.hits]
    assert payload["results"][0] == {
        **dataclasses.asdict(result.hits[0]), "metadata": result.hits[0].metadata
    }
    assert set(payload["timings_ms"]) == {"lexical_ms", "dense_ms", "fusion_ms", "rerank_ms"}
    unranked = retriever.search_detailed("heat flow", k=2, rerank=True, reranker=NoReranker())
    assert all(record["rerank_score"] is None for record in unranked.to_dict()["results"])


def test_large_filtered_sets_use_the_hnsw_filter(
    tmp_path: Path, bow_embedder: Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    from retrieval_fixtures import write_jsonl

    import onnxrank.retrieval.dense as dense_module
    from onnxrank.retrieval import build_index

    records = [
        {"id": str(i), "title": "", "text": f"word{i} common", "metadata": {"parity": i % 2}}
        for i in range(40)
    ]
    build_index(write_jsonl(tmp_path / "c.jsonl", records), tmp_path / "i", bow_embedder)
    retriever = HybridRetriever.open(tmp_path / "i", embedder=bow_embedder)
    try:
        exact = retriever.search("word3 common", k=5, mode="vector", filters={"parity": 1})
        monkeypatch.setattr(dense_module, "BRUTE_FORCE_MAX_ALLOWED", 0)
        filtered = retriever.search("word3 common", k=5, mode="vector", filters={"parity": 1})
    finally:
        retriever.close()
    assert all(int(hit.source) % 2 == 1 for hit in filtered)
    assert [hit.source for hit in filtered] == [hit.source for hit in exact]
    assert np.allclose([h.dense_score for h in filtered], [h.dense_score for h in exact], atol=1e-5)


def test_moved_embedder_is_found_by_name(tmp_path: Path, bow_embedder_dir: Path) -> None:
    import shutil

    from retrieval_fixtures import CORPUS, write_jsonl

    from onnxrank.retrieval import build_index

    copy = Path(shutil.copytree(bow_embedder_dir, tmp_path / "elsewhere" / "bow-embedder"))
    source = write_jsonl(tmp_path / "c.jsonl", CORPUS)
    build_index(source, tmp_path / "i", Embedder.from_dir(copy, device="cpu", threads=1))
    shutil.rmtree(copy)
    retriever = HybridRetriever.open(tmp_path / "i", models_dir=bow_embedder_dir.parent)
    try:
        assert retriever.search("heat conduction slabs", k=1, mode="vector")[0].source == "heat"
    finally:
        retriever.close()


class FakeClock:
    """Stands in for the engine's `time` module: time moves only while the model runs."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class TimedRunner:
    """Wraps the model runner: each run takes SECONDS_PER_TOKEN per padded input token."""

    SECONDS_PER_TOKEN = 1e-4

    def __init__(self, runner: object, clock: FakeClock) -> None:
        self._runner = runner
        self._clock = clock
        self.rows_run = 0

    @property
    def info(self) -> object:
        return self._runner.info  # type: ignore[attr-defined]

    @property
    def cpu_run_overhead_tokens(self) -> int:
        return int(self._runner.cpu_run_overhead_tokens)  # type: ignore[attr-defined]

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        self._clock.now += self.SECONDS_PER_TOKEN * feeds["input_ids"].size
        self.rows_run += feeds["input_ids"].shape[0]
        return self._runner.run(feeds)  # type: ignore[attr-defined]


def test_rerank_deadline_reranks_exactly_what_fits(
    retriever: HybridRetriever, bow_reranker_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One row per batch, no padding rounding: row i costs exactly len(row i) tokens of fake time.
    reranker = Reranker.from_dir(bow_reranker_dir, device="cpu", threads=1, max_batch_size=1,
                                 pad_to_multiple=1)
    clock = FakeClock()
    runner = TimedRunner(reranker._runner, clock)
    monkeypatch.setattr(reranker, "_runner", runner)
    monkeypatch.setattr(engine_deadline_module, "time", clock)
    query = "heat flow"
    fused = retriever.search(query, k=6)
    passages = [f"{hit.title} {hit.text}" for hit in fused]
    costs = [len(reranker.tokenizer.encode(query, passage).ids) * TimedRunner.SECONDS_PER_TOKEN
             for passage in passages]
    # Budget: the first three rows and half of the fourth.
    deadline_ms = (sum(costs[:3]) + costs[3] / 2) * 1000
    result = retriever.search_detailed(
        query, k=6, rerank=True, reranker=reranker, rerank_top_n=6, rerank_deadline_ms=deadline_ms
    )
    hits = result.hits
    assert runner.rows_run == 3
    oracle = oracle_scores(reranker, query, passages[:3])
    first_three = sorted(range(3), key=lambda index: (-oracle[index], index))
    assert [hit.chunk_id for hit in hits[:3]] == [fused[index].chunk_id for index in first_three]
    assert [hit.rerank_score for hit in hits[:3]] == pytest.approx(
        [oracle[index] for index in first_three], abs=1e-6
    )
    assert [hit.reranked for hit in hits] == [True, True, True, False, False, False]
    assert [hit.chunk_id for hit in hits[3:]] == [hit.chunk_id for hit in fused[3:]]
    assert all(hit.rerank_score is None for hit in hits[3:])
    assert result.notes[-1] == (
        f"note: 3 of 6 candidates were reranked within the deadline ({deadline_ms:g} ms); the rest "
        "keep the fused order (reranked=false)"
    )


def test_concurrent_searches_return_what_single_threaded_ones_do(
    index_dir: Path, bow_reranker: Reranker, monkeypatch: pytest.MonkeyPatch
) -> None:
    searches = [
        ("heat flow", {"mode": "hybrid"}),
        ("wing lift slipstream", {"mode": "vector"}),
        ("operating system paging", {"mode": "lexical"}),
        ("flow", {"mode": "hybrid", "filters": {"topic": "aero"}}),
        ("heat transfer hypersonic", {"mode": "hybrid", "rerank": True, "reranker": bow_reranker}),
        ("compilers languages", {"mode": "vector", "filters": {"year": {"gte": 1965}}}),
    ]

    def payloads(retriever: HybridRetriever) -> list[dict]:
        results = [retriever.search_detailed(query, k=5, **options) for query, options in searches]
        return [{**result.to_dict(), "timings_ms": None} for result in results]

    single = HybridRetriever.open(index_dir)
    try:
        expected = payloads(single)
    finally:
        single.close()

    loads = []
    original = Embedder.from_dir.__func__  # type: ignore[attr-defined]

    def counting_from_dir(cls: type, *args: object, **kwargs: object) -> Embedder:
        loads.append(threading.get_ident())
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(Embedder, "from_dir", classmethod(counting_from_dir))
    # A fresh retriever: the embedder and the HNSW file load lazily inside the racing threads.
    shared = HybridRetriever.open(index_dir)
    barrier = threading.Barrier(8)

    def worker() -> list[list[dict]]:
        barrier.wait(timeout=30)
        return [payloads(shared) for _ in range(5)]

    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            outcomes = [future.result(timeout=120) for future in [pool.submit(worker) for _ in range(8)]]
    finally:
        shared.close()
    assert len(loads) == 1  # the lazy embedder load ran once
    for rounds in outcomes:
        for observed in rounds:
            assert observed == expected


def test_preload_loads_what_the_mode_needs_once(
    index_dir: Path, bow_reranker_dir: Path, load_events: list[str]
) -> None:
    retriever = HybridRetriever.open(index_dir)  # the embedder loads lazily, from the manifest
    backend = LocalReranker(str(bow_reranker_dir))
    try:
        assert retriever.preload(mode="lexical") == LoadTimings()  # nothing to load, nothing timed
        assert load_events == []
        retriever.preload(mode="hybrid", reranker=backend)
        retriever.preload(mode="vector", reranker=backend)
        assert load_events == ["load embedder", "load reranker"]  # once each
        retriever.search("heat", k=2, rerank=True, reranker=backend)
        assert load_events[2:] == ["lexical stage", "dense stage", "rerank stage"]
        with pytest.raises(ValueError, match=re.escape(
            "mode must be one of vector, lexical, hybrid, got 'dense'"
        )):
            retriever.preload(mode="dense")
    finally:
        retriever.close()
