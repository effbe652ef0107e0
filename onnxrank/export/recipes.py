"""Scoring recipes of decoder-only rerankers that the export knows: the built-in recipes, recipe
files, and the lookup of a recipe's answer tokens in a tokenizer.

The recipe type itself (PromptRecipe, its template check) is the manifest's contract and lives in
the engine (onnxrank.engine.recipe); the export writes it into the manifest's ``prompt`` entry.

Only the standard library is imported here besides the engine's recipe type.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from onnxrank.engine.recipe import PromptRecipe, check_template
from onnxrank.errors import ExportError

QWEN3_SYSTEM = ('Judge whether the Document meets the requirements based on the Query and the '
                'Instruct provided. Note that the answer can only be "yes" or "no".')
# Qwen/Qwen3-Reranker-*'s model card: one user turn, tokenized whole; p(yes) over yes/no.
QWEN3_RERANKER = PromptRecipe(
    name="qwen3-reranker",
    prefix=f"<|im_start|>system\n{QWEN3_SYSTEM}<|im_end|>\n<|im_start|>user\n",
    template=("<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",),
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    default_instruction="Given a web search query, retrieve relevant passages that answer the query",
    yes_token="yes",
    no_token="no",
    model_ids=("Qwen/Qwen3-Reranker-",),
)
# FlagEmbedding's LLM reranker (examples/inference/reranker/README.md, get_inputs; the library's
# decoder_only/base.py): [bos] + tok("A: {query}") (cut to 3/4 of max_length) + tok("\n") +
# tok("B: {passage}") + tok("\n") + tok(prompt), each tokenized apart; score = the raw logit of
# "Yes" at the last token. Its `prompt` argument is our instruction.
BGE_GEMMA_PROMPT = ("Given a query A and a passage B, determine whether the passage contains an "
                    "answer to the query by providing a prediction of either 'Yes' or 'No'.")
BGE_RERANKER_V2_GEMMA = PromptRecipe(
    name="bge-reranker-v2-gemma",
    prefix="<bos>",
    template=("A: {query}", "\n", "B: {document}", "\n", "{instruction}"),
    suffix="",
    default_instruction=BGE_GEMMA_PROMPT,
    yes_token="Yes",
    score="yes_logit",
    query_share=0.75,
    model_ids=("BAAI/bge-reranker-v2-gemma",),
)
# mxbai-rerank's MxbaiRerankV2 (mxbai_rerank/mxbai_rerank_v2.py): chat prefix + tok(["instruction:
# {instruction}\n"]"query: {query}") (cut to 3/4 of max_length) + tok("\n") + tok("document:
# {document}") + tok("\n") + tok(task_prompt) + chat suffix; score = logit("1") - logit("0"),
# reported raw (predict(normalize=False)). No instruction line unless one is given.
MXBAI_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
MXBAI_TASK = ("You are a search relevance expert who evaluates how well documents match search "
              "queries. For each query-document pair, carefully analyze the semantic relationship "
              "between them, then provide your binary relevance judgment (0 for not relevant, 1 "
              "for relevant).\nRelevance:")
MXBAI_RERANK_V2 = PromptRecipe(
    name="mxbai-rerank-v2",
    prefix=f"<|im_start|>system\n{MXBAI_SYSTEM}<|im_end|>\n<|im_start|>user\n",
    template=("{instruction}query: {query}", "\n", "document: {document}", "\n", MXBAI_TASK),
    suffix="<|im_end|>\n<|im_start|>assistant\n",
    default_instruction="",
    yes_token="1",
    no_token="0",
    score="logit_difference",
    instruction_format="instruction: {instruction}\n",
    query_share=0.75,
    model_ids=("mixedbread-ai/mxbai-rerank-base-v2", "mixedbread-ai/mxbai-rerank-large-v2"),
)
BUILTIN_RECIPES: dict[str, PromptRecipe] = {
    recipe.name: recipe for recipe in (QWEN3_RERANKER, BGE_RERANKER_V2_GEMMA, MXBAI_RERANK_V2)}

def resolve_recipe(recipe: str | None, *, model: str) -> PromptRecipe | None:
    """The recipe an export uses.

    1. `recipe` names a built-in recipe: that one.
    2. `recipe` ends in ``.json``: the recipe in that file (PromptRecipe fields).
    3. No `recipe`, and `model` is a Hub id a built-in recipe lists: that recipe.
    4. Otherwise None (the model is exported as a cross-encoder).

    Raises:
        ExportError: An unknown recipe name, or a recipe file that is missing or invalid.
    """
    if recipe is None:
        for candidate in BUILTIN_RECIPES.values():
            if any(model.startswith(prefix) for prefix in candidate.model_ids):
                return candidate
        return None
    if recipe in BUILTIN_RECIPES:
        return BUILTIN_RECIPES[recipe]
    if not recipe.endswith(".json"):
        raise ExportError(
            f"--recipe {recipe!r} is neither a built-in recipe ({', '.join(BUILTIN_RECIPES)}) "
            "nor a recipe file (FILE.json)"
        )
    path = Path(recipe).expanduser()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ExportError(f"could not read the recipe file {path}: {err}") from err
    if not isinstance(data, dict):
        raise ExportError(f"recipe file {path} must hold a JSON object of recipe fields")
    try:
        return PromptRecipe.from_dict(data, origin=f"recipe file {path}")
    except (TypeError, ValueError) as err:
        raise ExportError(str(err)) from err


def answer_token_ids(recipe: PromptRecipe, tokenizer: Any) -> tuple[int, ...]:
    """The ids of the answer tokens `recipe`'s score reads (its score kind's answer_tokens, in
    order) in a `tokenizers.Tokenizer`.

    Raises:
        ExportError: An answer word is not exactly one token of the tokenizer, or a slot is
            missing from the template (checked again here for recipes built in code).
    """
    try:
        check_template(recipe.template, f"recipe {recipe.name!r}")
    except ValueError as err:
        raise ExportError(str(err)) from err
    ids = []
    for field_name in recipe.score_kind.answer_tokens:
        word = getattr(recipe, field_name)
        token_id = tokenizer.token_to_id(word)
        encoded = tokenizer.encode(word, add_special_tokens=False).ids
        if token_id is None or encoded != [token_id]:
            raise ExportError(
                f"recipe {recipe.name!r}: {field_name} {word!r} is not a single token of this "
                f"tokenizer (it encodes to {len(encoded)} tokens {encoded}); the score needs the "
                f"logit of one token: pick a recipe whose {field_name} is in the vocabulary "
                "(--recipe NAME or FILE.json)"
            )
        ids.append(token_id)
    return tuple(ids)
