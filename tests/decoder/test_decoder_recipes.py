"""Scoring recipes: the built-in Qwen3-Reranker recipe, recipe files, and the errors a wrong
recipe gets before any export work."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from decoder_reference import CARD_INSTRUCTION, CARD_PREFIX, CARD_SUFFIX
from tokenizers import Tokenizer

from onnxrank.engine.recipe import PromptRecipe
from onnxrank.errors import ExportError
from onnxrank.export.recipes import (
    BGE_RERANKER_V2_GEMMA,
    MXBAI_RERANK_V2,
    QWEN3_RERANKER,
    answer_token_ids,
    resolve_recipe,
)


def test_the_builtin_recipe_is_the_model_cards_prompt() -> None:
    (text,), where, span = QWEN3_RERANKER.render(instruction=CARD_INSTRUCTION, query="q?",
                                                 document="a doc")
    assert QWEN3_RERANKER.text(instruction=CARD_INSTRUCTION, query="q?", document="a doc") == (
        f"{CARD_PREFIX}<Instruct>: {CARD_INSTRUCTION}\n<Query>: q?\n<Document>: a doc{CARD_SUFFIX}")
    assert where == 0 and text[span[0]:span[1]] == "a doc"
    assert QWEN3_RERANKER.default_instruction == CARD_INSTRUCTION
    assert (QWEN3_RERANKER.yes_token, QWEN3_RERANKER.no_token) == ("yes", "no")


def test_recipe_choice_by_name_file_and_hub_id(tmp_path: Path) -> None:
    assert resolve_recipe(None, model="Qwen/Qwen3-Reranker-0.6B") is QWEN3_RERANKER
    assert resolve_recipe(None, model="Qwen/Qwen3-Reranker-8B") is QWEN3_RERANKER
    assert resolve_recipe(None, model="cross-encoder/ms-marco-MiniLM-L-6-v2") is None
    assert resolve_recipe(None, model="BAAI/bge-reranker-v2-gemma") is BGE_RERANKER_V2_GEMMA
    assert resolve_recipe(None, model="mixedbread-ai/mxbai-rerank-large-v2") is MXBAI_RERANK_V2
    assert resolve_recipe(None, model="mixedbread-ai/mxbai-rerank-large-v1") is None  # DeBERTa
    assert resolve_recipe("qwen3-reranker", model=str(tmp_path)) is QWEN3_RERANKER
    custom = replace(QWEN3_RERANKER, name="mine", default_instruction="Find passages on aircraft")
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(asdict(custom)))
    assert resolve_recipe(str(path), model=str(tmp_path)) == custom


def test_a_recipe_survives_the_manifest() -> None:
    entry = QWEN3_RERANKER.to_manifest(answer_token_ids=(7, 9))
    assert (entry["yes_token_id"], entry["no_token_id"]) == (7, 9)
    assert PromptRecipe.from_dict(json.loads(json.dumps(entry)), origin="m") == QWEN3_RERANKER
    # a manifest written before template pieces holds the template as one string
    entry["template"] = entry["template"][0]
    assert PromptRecipe.from_dict(entry, origin="m") == QWEN3_RERANKER
    for recipe in (BGE_RERANKER_V2_GEMMA, MXBAI_RERANK_V2):
        ids = tuple(range(len(recipe.score_kind.answer_tokens)))
        assert PromptRecipe.from_dict(json.loads(json.dumps(recipe.to_manifest(
            answer_token_ids=ids))), origin="m") == recipe


def test_wrong_recipes_are_named_errors(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=re.escape(
            "--recipe 'qwen9' is neither a built-in recipe (qwen3-reranker, "
            "bge-reranker-v2-gemma, mxbai-rerank-v2, monot5, mt5-mmarco) nor a recipe file "
            "(FILE.json)")):
        resolve_recipe("qwen9", model="x")
    no_slot = tmp_path / "no_slot.json"
    no_slot.write_text(json.dumps({**asdict(QWEN3_RERANKER),
                                   "template": "<Query>: {query}\n<Instruct>: {instruction}"}))
    with pytest.raises(ExportError, match=re.escape(
            f"recipe file {no_slot}: template must contain {{document}} exactly once, found it 0 "
            "times; slots: {instruction}, {query}, {document}")):
        resolve_recipe(str(no_slot), model="x")
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"name": "m", "template": QWEN3_RERANKER.template}))
    with pytest.raises(ExportError, match=re.escape(
            f"recipe file {missing}: recipe fields ['prefix', 'suffix', 'default_instruction', "
            "'yes_token'] are missing; a recipe needs name, prefix, template, suffix, "
            "default_instruction, yes_token")):
        resolve_recipe(str(missing), model="x")
    with pytest.raises(ExportError, match=re.escape(
            f"could not read the recipe file {tmp_path / 'absent.json'}")):
        resolve_recipe(str(tmp_path / "absent.json"), model="x")


def test_answer_tokens_must_be_single_tokens(decoder_checkpoint: Path) -> None:
    tokenizer = Tokenizer.from_file(str(decoder_checkpoint / "tokenizer.json"))
    yes, no = answer_token_ids(QWEN3_RERANKER, tokenizer)
    assert (tokenizer.id_to_token(yes), tokenizer.id_to_token(no)) == ("yes", "no")
    split = tokenizer.encode("maybe", add_special_tokens=False).ids
    assert len(split) > 1
    with pytest.raises(ExportError, match=re.escape(
            f"recipe 'qwen3-reranker': yes_token 'maybe' is not a single token of this tokenizer "
            f"(it encodes to {len(split)} tokens {split}); the score needs the logit of one token: "
            "pick a recipe whose yes_token is in the vocabulary (--recipe NAME or FILE.json)")):
        answer_token_ids(replace(QWEN3_RERANKER, yes_token="maybe"), tokenizer)


def test_the_builtin_recipes_are_their_cards_prompts() -> None:
    from decoder_reference import BGE_PROMPT, MXBAI_SYSTEM_PREFIX, MXBAI_TASK

    assert BGE_RERANKER_V2_GEMMA.text(
        instruction=BGE_PROMPT, query="q?", document="a doc") == f"<bos>A: q?\nB: a doc\n{BGE_PROMPT}"
    assert MXBAI_RERANK_V2.text(instruction="", query="q?", document="a doc") == (
        f"{MXBAI_SYSTEM_PREFIX}query: q?\ndocument: a doc\n{MXBAI_TASK}"
        "<|im_end|>\n<|im_start|>assistant\n")
    assert MXBAI_RERANK_V2.text(instruction="Find", query="q", document="d").startswith(
        f"{MXBAI_SYSTEM_PREFIX}instruction: Find\nquery: q\ndocument: d\n")
    assert [(recipe.score, recipe.score_kind.activation) for recipe in (
        QWEN3_RERANKER, BGE_RERANKER_V2_GEMMA, MXBAI_RERANK_V2)] == [
        ("softmax_yes_no", "sigmoid"), ("yes_logit", "none"), ("logit_difference", "none")]


def test_a_score_kind_names_the_answer_tokens_it_needs() -> None:
    with pytest.raises(ValueError, match=re.escape(
            "recipe 'two': no_token must be a non-empty string (score 'logit_difference' reads "
            "it), got ''")):
        replace(MXBAI_RERANK_V2, name="two", no_token="")
    with pytest.raises(ValueError, match=re.escape(
            "recipe 'x': score must be one of softmax_yes_no, yes_logit, logit_difference, "
            "seq2seq_softmax, yes_logit_sigmoid, got 'p_yes'")):
        replace(QWEN3_RERANKER, name="x", score="p_yes")
    assert replace(BGE_RERANKER_V2_GEMMA, no_token="").no_token == ""  # one token is enough
