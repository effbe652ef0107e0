"""Every built-in recipe on a tiny random checkpoint of its architecture (Qwen3, Gemma, Qwen2),
exported through the CLI: fp32 equals the model card's PyTorch formula, a long document is cut
while the query and the suffix survive, the manifest records the score kind, the score head stays
fp32 in the int8 variants, and the default variant's scores keep their spread and ranking."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from decoder_commands import uncapped_pairs

from onnxrank.engine.recipe import SCORES
from onnxrank.engine.reranker import Reranker
from onnxrank.engine.spec import load_model_spec
from onnxrank.export.recipes import BUILTIN_RECIPES

pytestmark = pytest.mark.costly(60)

QUERY = "what is known about wing flutter at high speeds"
LONG = " ".join(["Flutter of swept wings was measured at transonic speeds in a tunnel."] * 40)
INSTRUCTION = "Find reports on aircraft structures"


def _spearman(left: np.ndarray, right: np.ndarray) -> float:
    ranks = [np.argsort(np.argsort(values, kind="stable"), kind="stable") for values in (left, right)]
    return float(np.corrcoef(*ranks)[0, 1])


def test_fp32_equals_the_model_cards_formula(recipe_name: str, recipe_fp32: Reranker,
                                             recipe_card: Any) -> None:
    recipe = BUILTIN_RECIPES[recipe_name]
    pairs = uncapped_pairs(recipe_fp32.tokenizer, recipe, 16)
    pairs += [("wing flutter", LONG), ("flutter", "")]
    expected = recipe_card.score(pairs)
    scores = recipe_fp32.activate(recipe_fp32.score(pairs))
    assert np.abs(scores - expected).max() <= 1e-4, f"{recipe_name}: {scores} vs {expected}"
    # short documents: FlagEmbedding's max_length leaves its prompt out, so a custom prompt of
    # another length moves the card's cut (the engine's rows always fit max_length)
    # (and queries the engine keeps whole beside the instruction)
    short = [(query, document[:120]) for query, document in uncapped_pairs(
        recipe_fp32.tokenizer, recipe, instruction=INSTRUCTION)[:4]]
    custom = recipe_fp32.activate(recipe_fp32.score(short, instruction=INSTRUCTION))
    assert np.abs(custom - recipe_card.score(short, INSTRUCTION)).max() <= 1e-4
    assert not np.allclose(custom, recipe_card.score(short))  # the instruction is in the prompt


def test_a_long_document_is_cut_and_the_query_and_suffix_survive(
        recipe_name: str, recipe_fp32: Reranker, recipe_card: Any) -> None:
    recipe = BUILTIN_RECIPES[recipe_name]
    tokenizer = recipe_fp32.tokenizer
    encoder = type(recipe_fp32).row_encoder(tokenizer, recipe_fp32.max_length, recipe)
    row = encoder.encode([(QUERY, LONG)])[0].ids.tolist()
    assert len(row) == recipe_fp32.max_length  # the document was cut to fit
    assert row == recipe_card.token_ids(QUERY, LONG)  # where the card cuts it
    pieces, where, _ = recipe.render(instruction=recipe.default_instruction, query=QUERY,
                                     document=LONG)
    tail = [token for piece in (*pieces[where + 1:], recipe.suffix)
            for token in tokenizer.encode(piece, add_special_tokens=False).ids]
    if recipe_name == "qwen3-reranker":  # one piece: its tail is the suffix alone
        tail = tokenizer.encode(recipe.suffix, add_special_tokens=False).ids
    assert row[-len(tail):] == tail
    text = tokenizer.decode(row, skip_special_tokens=False)
    assert QUERY in text and LONG not in text and LONG[:60] in text
    score = recipe_fp32.activate(recipe_fp32.score([(QUERY, LONG)]))
    assert abs(score[0] - recipe_card.score([(QUERY, LONG)])[0]) <= 1e-4


def test_the_manifest_records_the_score_kind(recipe_name: str, recipe_model_dir: Path) -> None:
    spec = load_model_spec(recipe_model_dir)
    recipe = BUILTIN_RECIPES[recipe_name]
    assert spec.recipe == recipe and spec.prompt is not None
    assert spec.activation == SCORES[recipe.score].activation
    assert spec.prompt["graph_output"] == SCORES[recipe.score].graph_output
    vocabulary = recipe_fp32_vocabulary(recipe_model_dir)
    for field in SCORES[recipe.score].answer_tokens:
        assert spec.prompt[f"{field}_id"] == vocabulary[getattr(recipe, field)]


def recipe_fp32_vocabulary(model_dir: Path) -> dict[str, int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(model_dir / "tokenizer.json")).get_vocab()


def test_the_score_head_stays_fp32_in_the_int8_variants(recipe_name: str,
                                                        recipe_model_dir: Path) -> None:
    spec = load_model_spec(recipe_model_dir)
    records = [variant.quantization for variant in spec.variants.values() if variant.quantization]
    records += [attempt for failed in spec.failed_variants.values()
                for attempt in failed.get("attempts", [failed.get("quantization") or {}])]
    int8 = [record for record in records if record and "nodes_kept_fp32" in record]
    assert int8, f"{recipe_name}: no int8 variant was built"
    assert all("/score_head/MatMul" in record["nodes_kept_fp32"] for record in int8)
    if "ov_int8" in spec.variants:  # the IR's head weight is a plain f32 constant
        import openvino

        model = openvino.Core().read_model(str(recipe_model_dir / "model_ov_int8.xml"))
        head = [op for op in model.get_ordered_ops() if op.get_friendly_name() == "logits"]
        (matmul,) = head
        weight = matmul.input_value(1).get_node()
        assert weight.get_type_name() == "Constant"
        assert weight.get_element_type() == openvino.Type.f32


def test_the_default_variant_keeps_spread_and_ranking(recipe_name: str, recipe_model_dir: Path,
                                                      recipe_card: Any) -> None:
    # the default (the runtime probe's fastest validated variant) and the weight-only int8 one
    rerankers = [Reranker.from_dir(recipe_model_dir, device="cpu", **options)
                 for options in ({}, {"backend": "openvino", "precision": "int8"})]
    # the held-out groups of a 320-pair subset (4 queries, 2 short, 2 mixed: 120 pairs) whose
    # query the engine keeps whole, as the card does (the card scores one at a time)
    pairs = uncapped_pairs(rerankers[0].tokenizer, BUILTIN_RECIPES[recipe_name], 320,
                           part="held_out")
    assert len(pairs) >= 60
    expected = recipe_card.score(pairs)
    for reranker in rerankers:
        scores = reranker.activate(reranker.score(pairs))
        where = f"{recipe_name} {reranker.device_info.backend}/{reranker.device_info.precision}"
        # not collapsed: the spread is the reference's, and distinct pairs keep distinct scores
        ratio = scores.std() / expected.std()
        assert 0.8 <= ratio <= 1.25, f"{where}: spread {scores.std()} vs {expected.std()}"
        assert len(np.unique(np.round(scores, 6))) >= 0.9 * len(np.unique(np.round(expected, 6)))
        spearman = _spearman(scores, expected)
        assert spearman >= 0.9, f"{where}: held-out Spearman {spearman:.4f} vs the model card"
