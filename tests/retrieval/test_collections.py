"""Full collections (slow): lexical mode against the datasets' plain-BM25 reference points."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onnxrank.engine.embedder import Embedder
from onnxrank.retrieval import HybridRetriever, build_index
from onnxrank.retrieval.eval import evaluate, load_dataset

DATA = Path("/work/shared/data")
# nDCG@10 of plain FTS5 BM25 (query words OR-ed), from each dataset's README.
REFERENCE_NDCG = {"cranfield": 0.540, "cacm": 0.461}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REFERENCE_NDCG))
def test_lexical_mode_reaches_the_reference(name: str, tmp_path: Path, bow_embedder: Embedder) -> None:
    if not (DATA / name).is_dir():
        pytest.skip(f"dataset {DATA / name} is not available")
    dataset = load_dataset(DATA / name)
    build_index(dataset.corpus_path, tmp_path / name, bow_embedder, chunk_words=1000)
    retriever = HybridRetriever.open(tmp_path / name)
    try:
        report = evaluate(retriever, dataset, modes=["lexical"])
    finally:
        retriever.close()
    ndcg = report.results[0].metrics["ndcg@10"]
    assert ndcg >= REFERENCE_NDCG[name], f"{name} lexical nDCG@10 {ndcg:.3f} < {REFERENCE_NDCG[name]}"


MODELS = Path(__file__).parents[2] / "models"


@pytest.mark.slow
def test_readme_flow_with_the_full_size_models(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from onnxrank.cli import main

    if not all((MODELS / name / "manifest.json").is_file() for name in ("minilm-embedder", "minilm-standin")):
        pytest.skip(f"models/minilm-embedder and models/minilm-standin are not exported in {MODELS}")
    docs = Path(__file__).parents[2] / "docs"
    index = tmp_path / "docs-index"
    assert main(["index", "--source", str(docs), "--index", str(index), "--models-dir", str(MODELS)]) == 0
    assert "(embedder minilm-embedder, int8)" in capsys.readouterr().out
    argv = [
        "query",
        "how are int8 models validated",
        "--index",
        str(index),
        "--mode",
        "hybrid",
        "--rerank",
        "--model",
        "minilm-standin",
        "--models-dir",
        str(MODELS),
        "--k",
        "3",
    ]
    assert main([*argv, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert len(payload["results"]) == 3 and all(hit["reranked"] for hit in payload["results"])
    assert payload["notes"][0].startswith("note: reranker 'minilm-standin' is not relevance-trained")
