"""`onnxrank index`, `query` and `eval` through the console entry point: every flag has a test
that fails when the flag stops reaching the library."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from retrieval_fixtures import CORPUS, loads_come_first, write_dataset, write_jsonl

from onnxrank.cli import build_parser, main
from onnxrank.cli.retrieval_cmd import fusion_config
from onnxrank.retrieval.eval import DEFAULT_EVAL_RERANK_TOP_N, EVAL_CHUNK_WORDS
from onnxrank.retrieval.fusion import FusionConfig
from onnxrank.retrieval.indexer import DEFAULT_CHUNK_WORDS


@pytest.fixture()
def models_dir(tmp_path: Path, bow_embedder_dir: Path, bow_reranker_dir: Path) -> Path:
    directory = tmp_path / "models"
    directory.mkdir()
    (directory / "minilm-embedder").symlink_to(bow_embedder_dir)
    (directory / "minilm-standin").symlink_to(bow_reranker_dir)
    return directory


@pytest.fixture()
def docs(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    folder.mkdir()
    for record in CORPUS:
        (folder / f"{record['id']}.md").write_text(f"# {record['title']}\n\n{record['text']}\n")
    return folder


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def chunk_rows(index: Path) -> list[tuple[str, int, int]]:
    with sqlite3.connect(index / "index.sqlite") as connection:
        return list(connection.execute("SELECT doc_id, start_word, end_word FROM chunks ORDER BY label"))


def manifest(index: Path) -> dict:
    return json.loads((index / "manifest.json").read_text())


# --- index ------------------------------------------------------------------------------------


def test_index_then_query_with_rerank(
    tmp_path: Path, docs: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = tmp_path / "indexes" / "docs"
    argv = ["index", "--source", str(docs), "--index", str(index), "--models-dir", str(models_dir)]
    assert main([*argv, "--no-progress"]) == 0
    assert "6 added, 0 updated, 0 unchanged, 0 removed; 6 documents, 6 chunks" in capsys.readouterr().out

    query = ["query", "heat conduction", "--index", str(index), "--models-dir", str(models_dir)]
    assert main([*query, "--rerank", "--model", "minilm-standin", "--k", "6"]) == 0
    out = capsys.readouterr().out
    assert "note: reranker 'bow-reranker' is not relevance-trained" in out
    assert "heat.md#0" in out and "rerank" in out

    payload = run_json([*query, "--mode", "lexical", "--k", "2", "--filter", '{"suffix": ".md"}'], capsys)
    assert payload["query"] == "heat conduction" and payload["mode"] == "lexical"
    assert payload["filters"] == {"suffix": ".md"}
    assert payload["results"][0]["source"] == "heat.md"
    assert payload["results"][0]["lexical_rank"] == 1
    assert payload["rerank"] is False and payload["reranker"] is None


def test_index_precision_reaches_the_embedder(
    tmp_path: Path, docs: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["index", "--source", str(docs), "--models-dir", str(models_dir), "--no-progress"]
    # The fixture embedder ships fp32 only: asking for int8 must reach the loader and fail there.
    assert main([*argv, "--index", str(tmp_path / "a"), "--precision", "int8"]) == 2
    assert "int8" in capsys.readouterr().err
    assert main([*argv, "--index", str(tmp_path / "b"), "--precision", "fp32"]) == 0
    assert manifest(tmp_path / "b")["embedder"]["variant"] == "fp32"


def test_index_chunking_flags(tmp_path: Path, models_dir: Path) -> None:
    words = [f"word{i}" for i in range(30)]
    source = write_jsonl(tmp_path / "long.jsonl", [{"id": "long", "title": "", "text": " ".join(words)}])
    index = tmp_path / "i"
    argv = ["index", "--source", str(source), "--index", str(index), "--models-dir", str(models_dir)]
    assert main([*argv, "--chunk-words", "10", "--overlap-words", "3", "--no-progress"]) == 0
    assert (manifest(index)["chunk_words"], manifest(index)["overlap_words"]) == (10, 3)
    starts = [start for _, start, _ in chunk_rows(index)]
    assert starts[:3] == [0, 7, 14]  # a new chunk every chunk_words - overlap_words words
    assert all(end - start <= 10 for _, start, end in chunk_rows(index))


def test_index_hnsw_flags(tmp_path: Path, docs: Path, models_dir: Path) -> None:
    index = tmp_path / "i"
    argv = ["index", "--source", str(docs), "--index", str(index), "--models-dir", str(models_dir)]
    hnsw = ["--hnsw-m", "8", "--ef-construction", "40", "--ef-search", "77"]
    assert main([*argv, *hnsw, "--no-progress"]) == 0
    assert manifest(index)["hnsw"] == {"M": 8, "ef_construction": 40, "ef_search": 77}
    sidecar = json.loads((index / "dense.json").read_text())
    assert (sidecar["M"], sidecar["ef_construction"], sidecar["ef_search"]) == (8, 40, 77)


def test_index_reconcile_flags(
    tmp_path: Path, docs: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    index = tmp_path / "i"
    argv = ["index", "--source", str(docs), "--index", str(index), "--models-dir", str(models_dir),
            "--no-progress"]
    assert main(argv) == 0
    (docs / "heat.md").unlink()
    assert main([*argv, "--no-reconcile"]) == 0  # folders reconcile by default; this keeps heat
    assert "0 removed; 6 documents" in capsys.readouterr().out.splitlines()[-1]
    assert main([*argv, "--reconcile"]) == 0
    assert "1 removed; 5 documents" in capsys.readouterr().out.splitlines()[-1]
    source = write_jsonl(tmp_path / "c.jsonl", CORPUS)
    jsonl = ["index", "--source", str(source), "--index", str(tmp_path / "j"), "--models-dir",
             str(models_dir), "--no-progress"]
    assert main(jsonl) == 0
    write_jsonl(source, CORPUS[1:])
    assert main(jsonl) == 0  # JSONL sources do not reconcile by default
    assert "0 removed; 6 documents" in capsys.readouterr().out.splitlines()[-1]
    assert main([*jsonl, "--reconcile"]) == 0
    assert "1 removed; 5 documents" in capsys.readouterr().out.splitlines()[-1]


def test_chunk_words_twins_are_scoped_by_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONNXRANK_INDEX_CHUNK_WORDS", "123")
    parser = build_parser()
    index = parser.parse_args(["index", "--source", "s", "--index", "i"])
    evaluate = parser.parse_args(["eval", "--dataset", "d", "--index", "i"])
    assert (index.chunk_words, evaluate.chunk_words) == (123, EVAL_CHUNK_WORDS)
    monkeypatch.setenv("ONNXRANK_EVAL_CHUNK_WORDS", "456")
    monkeypatch.delenv("ONNXRANK_INDEX_CHUNK_WORDS")
    parser = build_parser()
    assert parser.parse_args(["index", "--source", "s", "--index", "i"]).chunk_words == DEFAULT_CHUNK_WORDS
    assert parser.parse_args(["eval", "--dataset", "d", "--index", "i"]).chunk_words == 456


def test_defaults_come_from_the_library() -> None:
    parser = build_parser()
    query = parser.parse_args(["query", "q", "--index", "i"])
    evaluate = parser.parse_args(["eval", "--dataset", "d", "--index", "i"])
    assert fusion_config(query) == FusionConfig()  # unset flags leave the library's defaults
    assert evaluate.rrf_k == FusionConfig().rrf_k
    assert query.rerank_top_n is None  # the library's max(5 * k, 50)
    assert evaluate.rerank_top_n == DEFAULT_EVAL_RERANK_TOP_N


# --- query ------------------------------------------------------------------------------------


def query_argv(index_dir: Path, models_dir: Path, text: str = "heat flow") -> list[str]:
    return ["query", text, "--index", str(index_dir), "--models-dir", str(models_dir)]


def test_query_depth_limits_each_side(
    index_dir: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = query_argv(index_dir, models_dir)
    assert len(run_json([*argv, "--k", "6", "--mode", "vector"], capsys)["results"]) == 6
    payload = run_json([*argv, "--k", "6", "--depth", "2", "--mode", "vector"], capsys)
    assert [hit["dense_rank"] for hit in payload["results"]] == [1, 2]
    payload = run_json([*argv, "--k", "6", "--depth", "1"], capsys)
    assert len(payload["results"]) <= 2
    for hit in payload["results"]:
        assert (hit["lexical_rank"] or 1) == 1 and (hit["dense_rank"] or 1) == 1


def test_query_rrf_k_sets_the_fusion_offset(
    index_dir: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = run_json([*query_argv(index_dir, models_dir), "--k", "6", "--rrf-k", "5"], capsys)
    for hit in payload["results"]:
        expected = sum(1 / (5 + rank) for rank in (hit["lexical_rank"], hit["dense_rank"]) if rank)
        assert hit["fused_score"] == pytest.approx(expected, abs=1e-12)
    assert payload["fusion"] == {"fusion": "rrf", "rrf_k": 5, "fusion_weight": FusionConfig().fusion_weight}


def zscores_or_lowest(scores: dict[str, float]) -> tuple[dict[str, float], float]:
    """Per-query z-scores (population std) of one side, and the value a missing chunk gets."""
    values = np.array(list(scores.values()))
    normalized = (values - values.mean()) / values.std()
    return dict(zip(scores, normalized)), float(normalized.min())


def test_query_convex_fusion_flags_reach_the_library(
    index_dir: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*query_argv(index_dir, models_dir), "--k", "6"]
    lexical_hits = run_json([*argv, "--mode", "lexical"], capsys)["results"]
    dense_hits = run_json([*argv, "--mode", "vector"], capsys)["results"]
    lexical = {hit["chunk_id"]: hit["lexical_score"] for hit in lexical_hits}
    dense = {hit["chunk_id"]: hit["dense_score"] for hit in dense_hits}
    assert len(lexical) >= 3 and len(dense) == 6
    lexical_z, lexical_missing = zscores_or_lowest(lexical)
    dense_z, dense_missing = zscores_or_lowest(dense)
    payload = run_json([*argv, "--fusion", "convex", "--fusion-weight", "0.3"], capsys)
    assert payload["fusion"] == {"fusion": "convex", "rrf_k": FusionConfig().rrf_k, "fusion_weight": 0.3}
    for hit in payload["results"]:
        expected_lexical = lexical_z.get(hit["chunk_id"], lexical_missing)
        expected_dense = dense_z.get(hit["chunk_id"], dense_missing)
        assert hit["lexical_normalized"] == pytest.approx(expected_lexical, abs=1e-6)
        assert hit["dense_normalized"] == pytest.approx(expected_dense, abs=1e-6)
        assert hit["fused_score"] == pytest.approx(0.7 * expected_lexical + 0.3 * expected_dense, abs=1e-6)
    scores = [hit["fused_score"] for hit in payload["results"]]
    assert scores == sorted(scores, reverse=True)
    assert main([*argv, "--fusion", "convex", "--fusion-weight", "2"]) == 2
    assert "fusion_weight must be a number from 0 to 1, got 2.0" in capsys.readouterr().err


def test_fusion_twins_are_scoped_by_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONNXRANK_QUERY_FUSION", "convex")
    monkeypatch.setenv("ONNXRANK_QUERY_FUSION_WEIGHT", "0.25")
    parser = build_parser()
    query = parser.parse_args(["query", "q", "--index", "i"])
    assert fusion_config(query) == FusionConfig(fusion="convex", fusion_weight=0.25)
    diagnose = parser.parse_args(["diagnose", "--index", "i", "--queries", "q", "--out", "o"])
    assert fusion_config(diagnose) == FusionConfig()
    monkeypatch.setenv("ONNXRANK_QUERY_FUSION", "max")
    with pytest.raises(ValueError, match=re.escape(
        "environment variable ONNXRANK_QUERY_FUSION='max' must be one of rrf, convex"
    )):
        build_parser()


def test_query_loads_models_before_the_timed_stages(
    index_dir: Path, models_dir: Path, load_events: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    payload = run_json([*query_argv(index_dir, models_dir), "--rerank", "--k", "3"], capsys)
    # the lazy loads inside the retriever and the backend are forced before the search starts
    assert load_events == ["load embedder", "load reranker", "lexical stage", "dense stage", "rerank stage"]
    assert set(payload["load_ms"]) == {"embedder_ms", "dense_index_ms", "reranker_ms", "total_ms"}
    assert set(payload["timings_ms"]) == {"lexical_ms", "dense_ms", "fusion_ms", "rerank_ms"}
    load_events.clear()
    assert main([*query_argv(index_dir, models_dir), "--mode", "lexical"]) == 0
    assert load_events == ["lexical stage"]  # nothing to load for a lexical search without reranking
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2].startswith("(") and ", lexical; lexical " in lines[-2]
    assert lines[-1].startswith("(model load ") and "not in the stage times (embedder 0.0 ms" in lines[-1]


def test_query_rerank_top_n(index_dir: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    payload = run_json([*query_argv(index_dir, models_dir), "--k", "6", "--rerank", "--rerank-top-n", "2"],
                       capsys)
    assert [hit["reranked"] for hit in payload["results"]] == [True, True, False, False, False, False]
    assert payload["reranker"] == "local" and payload["reranker_model"] == "bow-reranker"


def test_query_deadline_reaches_the_reranker(
    index_dir: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*query_argv(index_dir, models_dir), "--k", "4", "--rerank"]
    assert all(hit["reranked"] for hit in run_json(argv, capsys)["results"])
    # A budget of one nanosecond is spent before the first batch: nothing is scored.
    payload = run_json([*argv, "--deadline-ms", "0.000001"], capsys)
    assert not any(hit["reranked"] for hit in payload["results"])
    assert "candidates were reranked within the deadline (1e-06 ms)" in payload["notes"][-1]


def test_query_vector_mode(index_dir: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = query_argv(index_dir, models_dir, "heat conduction slabs")
    payload = run_json([*argv, "--mode", "vector"], capsys)
    assert payload["mode"] == "vector"
    assert all(hit["lexical_rank"] is None and hit["dense_rank"] for hit in payload["results"])
    assert payload["results"][0]["source"] == "heat"


def test_query_missing_rerank_model_falls_back_or_fails(
    index_dir: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*query_argv(index_dir, models_dir, "heat"), "--rerank", "--model", "absent", "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    payload = json.loads(captured.out)
    assert payload["results"] and not any(hit["reranked"] for hit in payload["results"])
    assert "the local reranker did not score any candidate" in payload["notes"][-1]
    assert main([*argv, "--on-error", "raise"]) == 2
    assert "local reranker: the model could not be loaded (no exported model named 'absent'" in (
        capsys.readouterr().err
    )


def test_query_compress(index_dir: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [*query_argv(index_dir, models_dir, "heat transfer"), "--k", "3", "--compress",
            "--segment-tokens", "8", "--max-segments", "1"]
    payload = run_json([*argv, "--rerank"], capsys)
    for hit in payload["results"]:
        compression = hit["compression"]
        assert compression["method"] == "model" and len(compression["segments"]) == 1
        for segment in compression["segments"]:
            assert hit["text"][segment["start"]:segment["end"]] == segment["text"]
    keywords = run_json([*argv, "--compress-method", "keywords"], capsys)
    assert {hit["compression"]["method"] for hit in keywords["results"]} == {"keywords"}
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "(keywords: kept" in table and "[" in table


def test_bad_filter_and_missing_index(
    tmp_path: Path, index_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["query", "heat", "--index", str(index_dir), "--filter", "[1]"]) == 2
    assert "--filter must be a JSON object, got '[1]'" in capsys.readouterr().err
    assert main(["query", "heat", "--index", str(tmp_path / "none")]) == 2
    assert f"no index at {tmp_path / 'none'} (missing index.sqlite)" in capsys.readouterr().err


# --- eval -------------------------------------------------------------------------------------


def eval_argv(tmp_path: Path, models_dir: Path) -> list[str]:
    dataset = tmp_path / "tiny"
    if not dataset.exists():
        write_dataset(dataset)
    return ["eval", "--dataset", str(dataset), "--index", str(tmp_path / "i"), "--models-dir",
            str(models_dir), "--out", str(tmp_path / "report")]


def test_eval_builds_the_index_and_writes_reports(
    tmp_path: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*eval_argv(tmp_path, models_dir), "--max-queries", "1"]) == 0
    printed = capsys.readouterr().out
    top_n = DEFAULT_EVAL_RERANK_TOP_N
    assert f"tiny: 1 queries, embedder bow-embedder, reranker bow-reranker (top {top_n})" in printed
    assert "not a relevance model" in printed
    report = json.loads((tmp_path / "report" / "eval.json").read_text())
    modes = [result["mode"] for result in report["results"]]
    # the hybrid modes once per fusion, side by side
    assert modes == ["vector", "lexical", "hybrid", "hybrid", "hybrid+rerank", "hybrid+rerank"]
    assert report["reranker_backend"] == "local"
    assert "| hybrid+rerank |" in (tmp_path / "report" / "eval.md").read_text()
    assert manifest(tmp_path / "i")["chunk_words"] == EVAL_CHUNK_WORDS


def test_eval_modes_and_k(tmp_path: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = eval_argv(tmp_path, models_dir)
    assert main([*argv, "--modes", "lexical,hybrid", "--k", "3", "--fusions", "rrf"]) == 0
    report = json.loads((tmp_path / "report" / "eval.json").read_text())
    assert [result["mode"] for result in report["results"]] == ["lexical", "hybrid"]
    assert report["k"] == 3 and "ndcg@3" in report["results"][0]["metrics"]
    assert report["reranker"] is None
    capsys.readouterr()
    assert main([*argv, "--modes", "lexical,fuzzy"]) == 2
    assert "--modes has unknown modes ['fuzzy']; allowed: vector, lexical, hybrid, hybrid+rerank" in (
        capsys.readouterr().err
    )


def test_eval_with_the_none_backend_equals_hybrid(tmp_path: Path, models_dir: Path) -> None:
    argv = eval_argv(tmp_path, models_dir)
    assert main([*argv, "--modes", "hybrid,hybrid+rerank", "--reranker", "none"]) == 0
    report = json.loads((tmp_path / "report" / "eval.json").read_text())
    rrf, convex, rrf_reranked, convex_reranked = (result["metrics"] for result in report["results"])
    assert (rrf, convex) == (rrf_reranked, convex_reranked)
    assert report["reranker_backend"] == "none"


def test_eval_reports_each_fusion_side_by_side(
    tmp_path: Path, models_dir: Path, load_events: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*eval_argv(tmp_path, models_dir), "--modes", "lexical,hybrid,hybrid+rerank"]
    assert main([*argv, "--fusions", "convex,rrf", "--fusion-weights", "0.3,0.7", "--rrf-k", "10"]) == 0
    report = json.loads((tmp_path / "report" / "eval.json").read_text())
    rows = [(result["mode"], result["fusion"]) for result in report["results"]]
    convex = [{"fusion": "convex", "rrf_k": 10, "fusion_weight": weight} for weight in (0.3, 0.7)]
    rrf = {"fusion": "rrf", "rrf_k": 10, "fusion_weight": FusionConfig().fusion_weight}
    assert rows == [("lexical", None), *[(mode, fusion) for mode in ("hybrid", "hybrid+rerank")
                                         for fusion in (*convex, rrf)]]
    markdown = (tmp_path / "report" / "eval.md").read_text()
    assert "| hybrid | convex w=0.3 |" in markdown and "| hybrid+rerank | rrf k=10 |" in markdown
    assert "| mode | fusion | nDCG@10 |" in markdown
    # models load once, before any timed stage (the index build's embedder load comes first)
    assert load_events.count("load reranker") == 1 and loads_come_first(load_events)
    assert set(report["load_ms"]) == {"embedder_ms", "dense_index_ms", "reranker_ms"}
    assert "(model load " in capsys.readouterr().out


def test_eval_fusion_flag_errors(
    tmp_path: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*eval_argv(tmp_path, models_dir), "--modes", "hybrid"]
    assert main([*argv, "--fusions", "rrf,max"]) == 2
    assert "--fusions has unknown fusions ['max']; allowed: rrf, convex" in capsys.readouterr().err
    assert main([*argv, "--fusion-weights", "0.3,high"]) == 2
    assert "--fusion-weights must be comma-separated numbers from 0 to 1, got '0.3,high'" in (
        capsys.readouterr().err
    )
    assert main([*argv, "--fusion-weights", "1.5"]) == 2
    assert "fusion_weight must be a number from 0 to 1, got 1.5" in capsys.readouterr().err
