"""Seq2seq rerankers (the t5 family): a tiny random T5ForConditionalGeneration with its own Unigram
vocabulary exported with ``--recipe monot5``, and an MT5ForConditionalGeneration with
``--recipe mt5-mmarco``, through the CLI. fp32 scores like transformers' model run as pygaggle and
the rerankers library run monoT5 (one decoder step, softmax over the two answer tokens); a long
document is cut so "Relevant:" survives, and scores like the reference on the same cut text; the
int8 variants keep the score head fp32 and pass their gate or are recorded as failed; `onnxrank
score`, `query --rerank` and the server run it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from built_once import built_once
from decoder_commands import export_decoder, index_with_reranker
from t5_checkpoint import CASES, MonoT5Reference, built_tiny_checkpoint

from onnxrank.cli import main
from onnxrank.engine.reranker import DecoderReranker, Reranker
from onnxrank.engine.spec import load_model_spec
from onnxrank.export.recipes import BUILTIN_RECIPES, MONOT5, MT5_MMARCO, resolve_recipe
from onnxrank.export.validate import load_validation_pairs
from onnxrank.serve import ServeConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "serve"))
from serve_helpers import running_server  # noqa: E402

pytestmark = pytest.mark.costly(40)

# the int8 variants each export builds: OpenVINO's weight-only int8 once (its path does not
# depend on the model type), onnxruntime's dynamic int8 for both
VARIANTS = {"monot5": "fp32,int8,ov_int8", "mt5-mmarco": "fp32,int8"}
QUERY = "what is known about wing flutter at high speeds"
LONG = " ".join(["Flutter of swept wings was measured at transonic speeds in a tunnel."] * 40)
SUFFIX = " Relevant:"


@pytest.fixture(scope="module", params=list(CASES))
def recipe(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def checkpoint(recipe: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_tiny_checkpoint(tmp_path_factory, recipe)


@pytest.fixture(scope="module")
def model_dir(recipe: str, checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`onnxrank export --model DIR --recipe NAME --variants ...`."""
    return built_once(tmp_path_factory, f"models/{recipe}-tiny", lambda out: export_decoder(
        checkpoint, recipe, out, "--variants", VARIANTS[recipe]))


@pytest.fixture(scope="module")
def reference(recipe: str, checkpoint: Path) -> MonoT5Reference:
    return MonoT5Reference(checkpoint, CASES[recipe][2])


@pytest.fixture(scope="module")
def fp32(model_dir: Path) -> Reranker:
    return Reranker.from_dir(model_dir, device="cpu", backend="onnxruntime", precision="fp32",
                             threads=1)


@pytest.fixture(scope="module")
def fitting(reference: MonoT5Reference, fp32: Reranker) -> tuple[list[tuple[str, str]], np.ndarray]:
    """Validation pairs whose whole text fits max_length (the reference cuts nothing), and the
    reference's scores of them."""
    pairs = [(pair.query, pair.passage) for pair in load_validation_pairs(48)]
    pairs = [pair for pair in pairs if len(reference.token_ids(*pair)) <= fp32.max_length]
    pairs.append(("flutter", ""))
    return pairs, np.asarray(reference.score(pairs))


def test_fp32_scores_like_transformers(recipe: str, fp32: Reranker,
                                       fitting: tuple[list[tuple[str, str]], np.ndarray]) -> None:
    assert isinstance(fp32, DecoderReranker) and not fp32.uses_prefix_graph
    pairs, expected = fitting
    assert len(pairs) >= 16
    scores = fp32.activate(fp32.score(pairs))
    spread = float(np.ptp(expected))
    assert spread > 0.1, f"{recipe}: the random model's scores barely move ({expected})"
    worst = float(np.abs(scores - expected).max())
    assert worst <= 1e-3 * spread, f"{recipe}: max|Δ| {worst} over a spread of {spread}"
    assert list(np.argsort(-scores, kind="stable")) == list(np.argsort(-expected, kind="stable"))
    ranked = fp32.rerank(QUERY, [document for _, document in pairs[:8]], top_k=3)
    assert [hit.score for hit in ranked] == sorted(
        fp32.activate(fp32.score([(QUERY, d) for _, d in pairs[:8]])), reverse=True)[:3]


def test_a_long_document_is_cut_and_relevant_survives(recipe: str, fp32: Reranker,
                                                      reference: MonoT5Reference) -> None:
    assert len(reference.token_ids(QUERY, LONG)) > fp32.max_length
    encoder = type(fp32).row_encoder(fp32.tokenizer, fp32.max_length, BUILTIN_RECIPES[recipe])
    row = encoder.encode([(QUERY, LONG)])[0].ids.tolist()
    assert len(row) == fp32.max_length
    tail = fp32.tokenizer.encode(SUFFIX).ids  # the tokenizer appends </s>
    assert row[-len(tail):] == tail and tail[-1] == reference.tokenizer.eos_token_id
    # the same cut as text: the first window's span (long_documents=truncate scores it)
    (window, *_) = encoder.encode_windows([(QUERY, LONG)], window_tokens=None, overlap_tokens=0)
    assert window.ids.tolist() == row and window.span is not None
    cut = LONG[window.span[0]:window.span[1]]
    assert 0 < len(cut) < len(LONG)
    assert reference.token_ids(QUERY, cut) == row
    score = fp32.activate(fp32.score([(QUERY, LONG)]))[0]
    assert abs(score - reference.score([(QUERY, cut)])[0]) <= 1e-5


def test_the_manifest_and_the_int8_variants(
        recipe: str, model_dir: Path, fp32: Reranker, reference: MonoT5Reference,
        fitting: tuple[list[tuple[str, str]], np.ndarray]) -> None:
    spec = load_model_spec(model_dir)
    assert spec.recipe == BUILTIN_RECIPES[recipe] and spec.prompt is not None
    assert spec.activation == "sigmoid" and spec.pad_token_id == reference.tokenizer.pad_token_id
    vocabulary = fp32.tokenizer.get_vocab()
    assert (spec.prompt["yes_token_id"], spec.prompt["no_token_id"]) == tuple(
        vocabulary[token] for token in CASES[recipe][2])
    assert spec.prefix_graphs == {} and not (model_dir / "model_prefix.onnx").exists()
    assert (spec.family or {}).get("name") == "t5"
    # each int8 variant is built (its score head kept fp32) or recorded with its reason
    wanted = set(VARIANTS[recipe].split(","))
    assert wanted == set(spec.variants) | set(spec.failed_variants)
    for name, failed in spec.failed_variants.items():
        assert failed.get("reason") or failed.get("attempts"), f"{recipe}: {name} {failed}"
    if "int8" in spec.variants:
        assert "/score_head/MatMul" in (spec.variants["int8"].quantization or {})["nodes_kept_fp32"]
    pairs, expected = fitting
    for variant, backend in (("int8", "onnxruntime"), ("ov_int8", "openvino")):
        if variant not in spec.variants:
            continue
        reranker = Reranker.from_dir(model_dir, device="cpu", threads=1, backend=backend,
                                     precision="int8")
        scores = reranker.activate(reranker.score(pairs))
        spearman = float(np.corrcoef(np.argsort(np.argsort(scores)),
                                     np.argsort(np.argsort(expected)))[0, 1])
        assert spearman >= 0.9, f"{recipe} {variant}: Spearman {spearman:.4f} vs transformers"


@pytest.mark.parametrize("recipe", ["monot5"], indirect=True)  # the commands ask no recipe
def test_score_query_and_serve_run_it(recipe: str, model_dir: Path, fp32: Reranker,
                                      tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    documents = ["The flutter of aircraft wings at transonic speeds was studied in a wind tunnel.",
                 "Boundary layer transition on a flat plate.", "wings", ""]
    expected = fp32.activate(fp32.score([(QUERY, document) for document in documents]))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"id": i, "query": QUERY, "document": d}) + "\n"
                             for i, d in enumerate(documents)))
    output = tmp_path / "scores.jsonl"
    options = ["--device", "cpu", "--backend", "onnxruntime", "--precision", "fp32"]
    assert main(["score", "--input", str(pairs), "--output", str(output), "--model",
                 str(model_dir), "--no-progress", *options]) == 0
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    np.testing.assert_allclose(fp32.activate(np.asarray([row["score"] for row in rows],
                                                        dtype=np.float32)), expected, atol=1e-5)

    with running_server(fp32, ServeConfig(port=0)) as server:
        body = server.client.post("/v1/rerank", json={"query": QUERY,
                                                      "documents": documents}).json()
    assert [item["index"] for item in body["results"]] == list(np.argsort(-expected, kind="stable"))
    np.testing.assert_allclose([item["relevance_score"] for item in body["results"]],
                               np.sort(expected)[::-1], atol=1e-6, rtol=0)

    index, models = index_with_reranker(tmp_path, model_dir, "monot5-tiny")
    capsys.readouterr()
    assert main(["query", "heat conduction", "--index", str(index), "--models-dir", str(models),
                 "--rerank", "--model", "monot5-tiny", "--k", "3", "--json", *options]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    assert len(results) == 3 and all(hit["reranked"] for hit in results)
    scores = [hit["rerank_score"] for hit in results]
    assert scores == sorted(scores, reverse=True)


def test_hub_ids_choose_their_recipe() -> None:
    assert resolve_recipe(None, model="castorini/monot5-base-msmarco-10k") is MONOT5
    assert resolve_recipe(None, model="unicamp-dl/InRanker-small") is MONOT5
    assert resolve_recipe(None, model="unicamp-dl/mt5-base-mmarco-v2") is MT5_MMARCO
    # pygaggle's 13B mT5 reads "▁true" against "▁": no built-in recipe says that
    assert resolve_recipe(None, model="unicamp-dl/mt5-13b-mmarco-100k") is None


@pytest.mark.parametrize("recipe", ["monot5"], indirect=True)
def test_a_t5_without_a_recipe_is_a_named_error(recipe: str, checkpoint: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--model", str(checkpoint), "--out", str(tmp_path / "out"),
                 "--quiet"]) != 0
    assert (f"{checkpoint} is a t5 model (t5, T5ForConditionalGeneration): it scores pairs "
            "through a prompt recipe; pass --recipe NAME") in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
