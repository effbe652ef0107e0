"""sentence-transformers 6 decoder rerankers (a CrossEncoder of ``Transformer(text-generation)`` +
``LogitScore``, saved by sentence-transformers itself): `onnxrank export --model DIR` reads the
recipe from the checkpoint's own files (answer token ids, activation, prompts, chat template),
its rows are the token ids sentence-transformers feeds the model, and its scores equal
``CrossEncoder.predict`` on the same checkpoint within the fp32 gate; what a recipe cannot say is
refused before any export work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from decoder_commands import MAX_LENGTH, uncapped_pairs
from st_checkpoints import (
    NO_SYSTEM_TEMPLATE,
    OPTIONAL_INSTRUCTION_TEMPLATE,
    STRUCTURED_TEMPLATE,
    build_st_reranker,
)
from tokenizers import Tokenizer

from onnxrank.engine.prompt import PromptEncoder
from onnxrank.engine.recipe import PromptRecipe
from onnxrank.engine.reranker import Reranker
from onnxrank.engine.spec import load_model_spec
from onnxrank.errors import ExportError
from onnxrank.export.recipes import resolve_recipe

torch = pytest.importorskip("torch")
sentence_transformers = pytest.importorskip("sentence_transformers")

pytestmark = pytest.mark.costly(20)

QWEN3_DEFAULT = "Given a web search query, retrieve relevant passages that answer the query"
INSTRUCTION = "Find reports on aircraft structures"
# the fp32 variant's gate: max |onnx - reference| <= 1e-4 x the reference scores' spread
FP32_GATE = 1e-4


def fitting_pairs(tokenizer: Tokenizer, recipe: PromptRecipe) -> list[tuple[str, str]]:
    """Validation pairs whose rows fit the export's max_length (sentence-transformers and the
    engine cut over-long rows differently: the engine caps a long query), plus braces and an
    empty document."""
    pairs = [(query, passage[:120]) for query, passage in uncapped_pairs(tokenizer, recipe, 32)]
    return pairs + [("wing {flutter}", "a {{b}} c"), ("flutter", "")]


def st_rows(model: Any, pairs: list[tuple[str, str]], instruction: str | None) -> list[list[int]]:
    """The token ids sentence-transformers feeds the causal LM for each pair alone (the prompt as
    CrossEncoder.predict resolves it: the given one, else the default prompt's)."""
    prompt = model._resolve_prompt(instruction, None)
    return [model[0].preprocess([pair], prompt=prompt)["input_ids"][0].tolist() for pair in pairs]


def st_scores(model: Any, pairs: list[tuple[str, str]], *, raw: bool,
              instruction: str | None = None) -> np.ndarray:
    """CrossEncoder.predict one pair at a time: sentence-transformers pads a batch on the left
    without position ids, which moves a short row's positions, so the reference is each row
    alone (as the engine's right-padded rows are)."""
    options = {"activation_fn": torch.nn.Identity()} if raw else {}
    return np.asarray([model.predict([pair], batch_size=1, prompt=instruction, **options)[0]
                       for pair in pairs])


@pytest.fixture(scope="session")
def cross_encoder(st_checkpoint: Path) -> Any:
    return sentence_transformers.CrossEncoder(str(st_checkpoint), device="cpu")


def test_the_checkpoint_is_what_sentence_transformers_saves(st_checkpoint: Path) -> None:
    modules = json.loads((st_checkpoint / "modules.json").read_text("utf-8"))
    assert [module["type"].rsplit(".", 1)[-1] for module in modules] == ["Transformer", "LogitScore"]
    config = json.loads((st_checkpoint / "sentence_bert_config.json").read_text("utf-8"))
    assert config["transformer_task"] == "text-generation" and "message" in config["modality_config"]
    assert (st_checkpoint / "chat_template.jinja").is_file()


def test_the_recipe_is_read_from_the_checkpoint_files(st_checkpoint: Path) -> None:
    tokenizer = Tokenizer.from_file(str(st_checkpoint / "tokenizer.json"))
    logit_score = json.loads((st_checkpoint / "1_LogitScore" / "config.json").read_text("utf-8"))
    recipe = resolve_recipe(None, model=str(st_checkpoint))
    assert recipe is not None and recipe.name == f"sentence-transformers ({st_checkpoint.name})"
    assert (tokenizer.token_to_id(recipe.yes_token), tokenizer.token_to_id(recipe.no_token)) == (
        logit_score["true_token_id"], logit_score["false_token_id"])
    # LogitScore's yes - no under the CrossEncoder's default Sigmoid: p(yes) over the two
    assert recipe.score == "softmax_yes_no" and recipe.score_kind.activation == "sigmoid"
    assert recipe.default_instruction == QWEN3_DEFAULT  # what the template writes without one
    assert recipe.prefix == recipe.suffix == "" and len(recipe.template) == 1  # tokenized whole
    assert recipe.text(instruction=INSTRUCTION, query="q?", document="a doc").endswith(
        f"<Instruct>: {INSTRUCTION}\n<Query>: q?\n<Document>: a doc<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n")
    # an explicit recipe still wins
    assert resolve_recipe("qwen3-reranker", model=str(st_checkpoint)).name == "qwen3-reranker"


def test_rows_are_the_token_ids_sentence_transformers_feeds(st_checkpoint: Path,
                                                            cross_encoder: Any) -> None:
    recipe = resolve_recipe(None, model=str(st_checkpoint))
    tokenizer = Tokenizer.from_file(str(st_checkpoint / "tokenizer.json"))
    encoder = PromptEncoder(tokenizer, MAX_LENGTH, recipe)
    pairs = fitting_pairs(tokenizer, recipe)
    for instruction in (None, INSTRUCTION):
        rows = [row.ids.tolist() for row in encoder.encode(pairs, instruction=instruction)]
        assert rows == st_rows(cross_encoder, pairs, instruction)
        assert max(len(row) for row in rows) < MAX_LENGTH  # nothing was cut


def test_the_export_passed_its_gates_with_the_checkpoint_recipe(st_checkpoint: Path,
                                                                st_model_dir: Path) -> None:
    spec = load_model_spec(st_model_dir)
    assert spec.recipe == resolve_recipe(None, model=str(st_checkpoint))
    assert spec.activation == "sigmoid"
    # every variant met its thresholds (a variant that misses is in failed_variants instead)
    assert set(spec.variants) == {"fp32", "int8", "fp16", "ov_int8"}, spec.failed_variants
    assert set(spec.failed_variants) == {"opt"}  # no fusions for decoders: not applicable
    assert all(variant.fidelity["validated"] is True for variant in spec.variants.values())
    fp32 = spec.variants["fp32"].fidelity
    assert fp32["max_abs_diff"] <= FP32_GATE * fp32["reference_std"]
    graph = spec.prefix_graphs["fp32"].fidelity
    assert graph["passed"] is True and graph["max_abs_diff"] <= graph["max_abs_diff_limit"]
    assert graph["prefix_tokens"][0] > 0  # the system turn and query run once per query


@pytest.mark.parametrize("prefix_reuse", [True, False], ids=["prefix graph", "whole rows"])
def test_scores_equal_cross_encoder_predict_within_the_fp32_gate(
        st_model_dir: Path, cross_encoder: Any, prefix_reuse: bool) -> None:
    reranker = Reranker.from_dir(st_model_dir, device="cpu", backend="onnxruntime",
                                 precision="fp32", threads=1, prefix_reuse=prefix_reuse)
    assert reranker.uses_prefix_graph == prefix_reuse
    assert reranker.spec.recipe is not None
    pairs = fitting_pairs(reranker.tokenizer, reranker.spec.recipe)
    raw = st_scores(cross_encoder, pairs, raw=True)
    logits = reranker.score(pairs)
    assert np.abs(logits - raw).max() <= FP32_GATE * raw.std()
    expected = st_scores(cross_encoder, pairs, raw=False)  # the CrossEncoder's Sigmoid
    assert np.abs(reranker.activate(logits) - expected).max() <= FP32_GATE * expected.std()
    # an instruction is the CrossEncoder's prompt (its system message)
    short = pairs[:8]
    custom = st_scores(cross_encoder, short, raw=True, instruction=INSTRUCTION)
    assert np.abs(reranker.score(short, instruction=INSTRUCTION) - custom).max() \
        <= FP32_GATE * raw.std()
    assert not np.allclose(custom, raw[:8])


@pytest.mark.parametrize(("case", "options", "score", "default", "instruction_format"), [
    ("default-prompt", {"prompts": {"rerank": INSTRUCTION}, "default_prompt_name": "rerank"},
     "softmax_yes_no", INSTRUCTION, "{instruction}"),
    ("optional-instruction", {"chat_template": OPTIONAL_INSTRUCTION_TEMPLATE},
     "softmax_yes_no", "", "Instruction: {instruction}\n"),
    ("structured-messages", {"chat_template": STRUCTURED_TEMPLATE}, "softmax_yes_no", "",
     "<|im_start|>system\n{instruction}<|im_end|>\n"),
    ("text-pairs", {"chat_template": None}, "softmax_yes_no", "", "{instruction}"),
    ("raw-difference", {"activation": "identity"}, "logit_difference", QWEN3_DEFAULT,
     "{instruction}"),
    ("yes-only-raw", {"false_token": None, "activation": "identity"}, "yes_logit",
     QWEN3_DEFAULT, "{instruction}"),
    ("yes-only-sigmoid", {"false_token": None}, "yes_logit_sigmoid", QWEN3_DEFAULT,
     "{instruction}"),
])
def test_each_checkpoint_kind_gets_the_recipe_of_its_files(
        decoder_checkpoint: Path, tmp_path: Path, case: str, options: dict[str, Any], score: str,
        default: str, instruction_format: str) -> None:
    if options.get("activation") == "identity":
        options = {**options, "activation": torch.nn.Identity()}
    directory = build_st_reranker(decoder_checkpoint, tmp_path / case, **options)
    recipe = resolve_recipe(None, model=str(directory))
    assert (recipe.score, recipe.default_instruction, recipe.instruction_format) == (
        score, default, instruction_format)
    model = sentence_transformers.CrossEncoder(str(directory), device="cpu")
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    encoder = PromptEncoder(tokenizer, MAX_LENGTH, recipe)
    fitting = fitting_pairs(tokenizer, recipe)
    pairs = fitting[:6] + fitting[-2:]
    for instruction in (None, INSTRUCTION):
        rows = [row.ids.tolist() for row in encoder.encode(pairs, instruction=instruction)]
        assert rows == st_rows(model, pairs, instruction), f"{case}, instruction {instruction}"


def test_what_no_recipe_can_say_is_refused_before_any_export_work(
        decoder_checkpoint: Path, st_checkpoint: Path, tmp_path: Path) -> None:
    ignores_system = build_st_reranker(decoder_checkpoint, tmp_path / "no-system",
                                       chat_template=NO_SYSTEM_TEMPLATE)
    with pytest.raises(ExportError, match="does not carry the system message"):
        resolve_recipe(None, model=str(ignores_system))
    tanh = build_st_reranker(decoder_checkpoint, tmp_path / "tanh", activation=torch.nn.Tanh())
    with pytest.raises(ExportError, match="activation_fn 'torch.nn.modules.activation.Tanh'"):
        resolve_recipe(None, model=str(tanh))
    stacked = tmp_path / "stacked"
    stacked.mkdir()
    modules = json.loads((st_checkpoint / "modules.json").read_text("utf-8"))
    modules.append({"idx": 2, "name": "2", "path": "2_Dense",
                    "type": "sentence_transformers.base.modules.dense.Dense"})
    (stacked / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    with pytest.raises(ExportError, match=r"stacks the modules \['Transformer', 'LogitScore', "
                                          r"'Dense'\]"):
        resolve_recipe(None, model=str(stacked))
    # a sentence-transformers cross-encoder without LogitScore is no decoder: no recipe
    classifier = tmp_path / "classifier"
    classifier.mkdir()
    (classifier / "modules.json").write_text(json.dumps(modules[:1]), encoding="utf-8")
    assert resolve_recipe(None, model=str(classifier)) is None
