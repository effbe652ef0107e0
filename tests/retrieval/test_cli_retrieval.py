"""`onnxrank index`, `query` and `eval` through the console entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from retrieval_fixtures import CORPUS

from onnxrank.cli import main


@pytest.fixture()
def models_dir(tmp_path: Path, bow_embedder_dir: Path, bow_reranker_dir: Path) -> Path:
    directory = tmp_path / "models"
    directory.mkdir()
    (directory / "minilm-embedder").symlink_to(bow_embedder_dir)
    (directory / "minilm-standin").symlink_to(bow_reranker_dir)
    return directory


def test_index_then_query_with_rerank(
    tmp_path: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for record in CORPUS:
        (docs / f"{record['id']}.md").write_text(f"# {record['title']}\n\n{record['text']}\n")
    index = tmp_path / "indexes" / "docs"
    assert (
        main(
            [
                "index",
                "--source",
                str(docs),
                "--index",
                str(index),
                "--models-dir",
                str(models_dir),
                "--no-progress",
            ]
        )
        == 0
    )
    assert "6 added, 0 updated, 0 unchanged, 0 removed; 6 documents, 6 chunks" in capsys.readouterr().out

    assert (
        main(
            [
                "query",
                "heat conduction",
                "--index",
                str(index),
                "--mode",
                "hybrid",
                "--rerank",
                "--model",
                "minilm-standin",
                "--models-dir",
                str(models_dir),
                "--k",
                "6",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "note: reranker 'bow-reranker' is not relevance-trained" in out
    assert "heat.md#0" in out and "rerank" in out

    assert (
        main(
            [
                "query",
                "heat conduction",
                "--index",
                str(index),
                "--mode",
                "lexical",
                "--k",
                "2",
                "--filter",
                '{"suffix": ".md"}',
                "--json",
                "--models-dir",
                str(models_dir),
            ]
        )
        == 0
    )
    payload = json.loads(capsys.readouterr().out)
    assert payload["query"] == "heat conduction" and payload["mode"] == "lexical"
    assert payload["filters"] == {"suffix": ".md"}
    assert payload["results"][0]["source"] == "heat.md"
    assert payload["results"][0]["lexical_rank"] == 1


def test_query_fallback_when_the_rerank_model_is_missing(
    index_dir: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "query",
        "heat",
        "--index",
        str(index_dir),
        "--rerank",
        "--model",
        "absent",
        "--models-dir",
        str(models_dir),
        "--json",
    ]
    assert main(argv) == 2
    assert "no exported model named 'absent'" in capsys.readouterr().err
    assert main([*argv, "--on-error", "fallback"]) == 0
    captured = capsys.readouterr()
    payload = json.loads(captured.out)
    assert payload["results"] and not any(hit["reranked"] for hit in payload["results"])
    assert "rerank model failed to load" in captured.err


def test_bad_filter_and_missing_index(
    tmp_path: Path, index_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["query", "heat", "--index", str(index_dir), "--filter", "[1]"]) == 2
    assert "--filter must be a JSON object, got '[1]'" in capsys.readouterr().err
    assert main(["query", "heat", "--index", str(tmp_path / "none")]) == 2
    assert f"no index at {tmp_path / 'none'} (missing index.sqlite)" in capsys.readouterr().err


def test_eval_builds_the_index_and_writes_reports(
    tmp_path: Path, models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from retrieval_fixtures import write_dataset

    dataset = write_dataset(tmp_path / "tiny")
    out = tmp_path / "report"
    assert (
        main(
            [
                "eval",
                "--dataset",
                str(dataset),
                "--index",
                str(tmp_path / "i"),
                "--models-dir",
                str(models_dir),
                "--out",
                str(out),
                "--max-queries",
                "1",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "tiny: 1 queries, embedder bow-embedder, reranker bow-reranker (top 50)" in printed
    assert "not a relevance model" in printed
    report = json.loads((out / "eval.json").read_text())
    assert [result["mode"] for result in report["results"]] == [
        "vector",
        "lexical",
        "hybrid",
        "hybrid+rerank",
    ]
    assert "| hybrid+rerank |" in (out / "eval.md").read_text()
