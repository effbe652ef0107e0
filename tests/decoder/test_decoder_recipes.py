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
from onnxrank.export.recipes import QWEN3_RERANKER, answer_token_ids, resolve_recipe


def test_the_builtin_recipe_is_the_model_cards_prompt() -> None:
    text, span = QWEN3_RERANKER.render(instruction=CARD_INSTRUCTION, query="q?", document="a doc")
    assert QWEN3_RERANKER.prefix + text + QWEN3_RERANKER.suffix == (
        f"{CARD_PREFIX}<Instruct>: {CARD_INSTRUCTION}\n<Query>: q?\n<Document>: a doc{CARD_SUFFIX}")
    assert text[span[0]:span[1]] == "a doc"
    assert QWEN3_RERANKER.default_instruction == CARD_INSTRUCTION
    assert (QWEN3_RERANKER.yes_token, QWEN3_RERANKER.no_token) == ("yes", "no")


def test_recipe_choice_by_name_file_and_hub_id(tmp_path: Path) -> None:
    assert resolve_recipe(None, model="Qwen/Qwen3-Reranker-0.6B") is QWEN3_RERANKER
    assert resolve_recipe(None, model="Qwen/Qwen3-Reranker-8B") is QWEN3_RERANKER
    assert resolve_recipe(None, model="cross-encoder/ms-marco-MiniLM-L-6-v2") is None
    assert resolve_recipe("qwen3-reranker", model=str(tmp_path)) is QWEN3_RERANKER
    custom = replace(QWEN3_RERANKER, name="mine", default_instruction="Find passages on aircraft")
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(asdict(custom)))
    assert resolve_recipe(str(path), model=str(tmp_path)) == custom


def test_a_recipe_survives_the_manifest() -> None:
    entry = QWEN3_RERANKER.to_manifest(yes_token_id=7, no_token_id=9)
    assert (entry["yes_token_id"], entry["no_token_id"]) == (7, 9)
    assert PromptRecipe.from_dict(json.loads(json.dumps(entry)), origin="m") == QWEN3_RERANKER


def test_wrong_recipes_are_named_errors(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match=re.escape(
            "--recipe 'qwen9' is neither a built-in recipe (qwen3-reranker) nor a recipe file "
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
            "'yes_token', 'no_token'] are missing; a recipe needs name, prefix, template, suffix, "
            "default_instruction, yes_token, no_token")):
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
