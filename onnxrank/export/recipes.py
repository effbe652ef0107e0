"""Scoring recipes of decoder-only rerankers that the export knows: the built-in recipes, recipe
files, and the lookup of a recipe's answer tokens in a tokenizer.

The recipe type itself (PromptRecipe, its template check) is the manifest's contract and lives in
the engine (onnxrank.engine.recipe); the export writes it into the manifest's ``prompt`` entry.

A sentence-transformers 6 CrossEncoder over a causal LM (modules.json: ``Transformer`` with
``transformer_task="text-generation"``, then ``LogitScore``) carries its own recipe: the answer
token ids (1_LogitScore/config.json), the activation and prompts
(config_sentence_transformers.json) and the chat template its pairs are rendered with
(`sentence_transformers_recipe`).

Only the standard library is imported here besides the engine's recipe type (transformers, for
rendering a sentence-transformers checkpoint's chat template, when one is read).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from onnxrank.engine.recipe import PromptRecipe, check_template
from onnxrank.errors import ExportError
from onnxrank.export.st_checkpoint import ST_IDENTITY, ST_SIGMOID, stored_activation_fn

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
# castorini's monoT5 (pygaggle's MonoT5, the rerankers library's T5Ranker) and InRanker: one
# text "Query: {q} Document: {d} Relevant:" tokenized whole, the tokenizer's </s> after it; the
# score is softmax over "▁true" / "▁false" at the first decoder step. Those cut the text's end
# (the suffix with it); the engine cuts the document and keeps the suffix.
MONOT5 = PromptRecipe(
    name="monot5",
    prefix="",
    template=("{instruction}Query: {query} Document: {document} Relevant:",),
    suffix="</s>",
    default_instruction="",
    yes_token="▁true",
    no_token="▁false",
    score="seq2seq_softmax",
    model_ids=("castorini/monot5-", "unicamp-dl/InRanker-"),
)
# unicamp-dl's mT5 base mMARCO rerankers (mt5-base-mmarco-v1/-v2, mt5-base-en-msmarco,
# mt5-base-en-pt-msmarco-*): monoT5's prompt, answered "▁yes" / "▁no" (pygaggle's and the
# rerankers library's token table; their 3B and 13B mT5 read "▁true" against "▁" instead, which
# no built-in recipe claims)
MT5_MMARCO = PromptRecipe(
    name="mt5-mmarco",
    prefix="",
    template=MONOT5.template,
    suffix="</s>",
    default_instruction="",
    yes_token="▁yes",
    no_token="▁no",
    score="seq2seq_softmax",
    model_ids=("unicamp-dl/mt5-base-mmarco-", "unicamp-dl/mt5-base-en-msmarco",
               "unicamp-dl/mt5-base-en-pt-msmarco-"),
)
BUILTIN_RECIPES: dict[str, PromptRecipe] = {
    recipe.name: recipe for recipe in (QWEN3_RERANKER, BGE_RERANKER_V2_GEMMA, MXBAI_RERANK_V2,
                                       MONOT5, MT5_MMARCO)}

def resolve_recipe(recipe: str | None, *, model: str) -> PromptRecipe | None:
    """The recipe an export uses.

    1. `recipe` names a built-in recipe: that one.
    2. `recipe` ends in ``.json``: the recipe in that file (PromptRecipe fields).
    3. No `recipe`, and `model` is a Hub id a built-in recipe lists: that recipe.
    4. No `recipe`, and `model` is a sentence-transformers CrossEncoder directory scored by a
       ``LogitScore`` module: the recipe its own files say (`sentence_transformers_recipe`).
    5. Otherwise None (the model is exported as a cross-encoder).

    Raises:
        ExportError: An unknown recipe name, a recipe file that is missing or invalid, or a
            sentence-transformers decoder whose scoring no recipe can express.
    """
    if recipe is None:
        for candidate in BUILTIN_RECIPES.values():
            if any(model.startswith(prefix) for prefix in candidate.model_ids):
                return candidate
        if Path(model).is_dir():
            return sentence_transformers_recipe(Path(model))
        return None
    if recipe in BUILTIN_RECIPES:
        return BUILTIN_RECIPES[recipe]
    if not recipe.endswith(".json"):
        raise ExportError(
            f"--recipe {recipe!r} is neither a built-in recipe ({', '.join(BUILTIN_RECIPES)}) "
            "nor a recipe file (FILE.json)"
        )
    path = Path(recipe).expanduser()
    data = _json_file(path, dict, label="the recipe file ")
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


# sentence-transformers 6 (sentence_transformers.cross_encoder): the activations its CrossEncoder
# config names (config_sentence_transformers.json "activation_fn"), and which score kind a
# LogitScore module is under each, by whether it reads a false token
ST_SCORES: dict[tuple[bool, str], str] = {
    (True, ST_SIGMOID): "softmax_yes_no",  # sigmoid(yes - no) = p(yes) over the two
    (True, ST_IDENTITY): "logit_difference",
    (False, ST_IDENTITY): "yes_logit",
    (False, ST_SIGMOID): "yes_logit_sigmoid",
}
# what the recipe's slots are while a chat template is rendered (no template writes these)
_SENTINELS = {slot: f"<<onnxrank:{slot}>>" for slot in ("instruction", "query", "document")}
# apply_chat_template arguments that size the tokenization, not the rendered text, and the
# sentence-transformers flag that only restores a truncated suffix
_NOT_RENDERING = frozenset({"padding", "truncation", "max_length", "return_tensors", "restore_suffix"})


def sentence_transformers_recipe(directory: Path) -> PromptRecipe | None:
    """The recipe of a sentence-transformers 6 CrossEncoder scored by a ``LogitScore`` module, read
    from its files; None when `directory` holds no such model (no modules.json, or no LogitScore
    in it).

    What sentence-transformers computes there (``CrossEncoder.predict``): a pair becomes the
    messages ``[{"role": "query", ...}, {"role": "document", ...}]``, preceded by
    ``{"role": "system", "content": prompt}`` when a prompt is given or configured (its
    ``default_prompt_name``); the tokenizer's chat template renders them (with the module's
    ``processing_kwargs["chat_template"]``) and the text is tokenized whole; LogitScore reads
    ``logit[true_token_id]`` (minus ``logit[false_token_id]`` if set) at the last token, and the
    CrossEncoder's activation_fn (Sigmoid by default) makes the score. A tokenizer without a chat
    template tokenizes the pair as ``tokenizer(prompt + query, document)`` instead.

    The recipe says the same: its template is the rendered chat template with the three slots
    (one piece, so it is tokenized whole as sentence-transformers does; its prefix and suffix
    are empty), the instruction is the system message (its default the default prompt, else
    what the template writes without one), the answer tokens are LogitScore's ids, and the score
    kind is the one of ST_SCORES. What differs is only how an over-long row is cut: the engine
    cuts the document and keeps the template's end (sentence-transformers cuts the rendered
    text's end and then restores its suffix).

    Raises:
        ExportError: The module stack is not Transformer(text-generation) + LogitScore, the
            activation is neither Sigmoid nor Identity, an answer token id has no single-token
            text, or the chat template drops a slot or transforms its content (then a recipe
            file, --recipe FILE.json, can say the prompt).
    """
    modules_path = directory / "modules.json"
    if not modules_path.is_file():
        return None
    modules = [module if isinstance(module, dict) else {} for module in
               _json_file(modules_path, list)]
    types = [str(module.get("type", "")).rsplit(".", 1)[-1] for module in modules]
    if "LogitScore" not in types:
        return None
    where = f"the sentence-transformers model in {directory}"
    if types != ["Transformer", "LogitScore"] or modules[0].get("path", "") not in ("", "."):
        raise ExportError(
            f"{where} stacks the modules {types} (paths "
            f"{[module.get('path') for module in modules]}); onnxrank exports a LogitScore "
            "reranker whose modules are exactly Transformer (its files in the model directory) "
            "then LogitScore; pass --recipe NAME or --recipe FILE.json to export its causal LM")
    transformer = _json_file(directory / "sentence_bert_config.json", dict, missing={})
    task = transformer.get("transformer_task", "text-generation")
    if task != "text-generation":
        raise ExportError(f"{where}: its LogitScore reads a Transformer whose transformer_task is "
                          f"{task!r}; onnxrank exports the text-generation (causal LM) kind")
    score_config = _json_file(directory / str(modules[1].get("path") or "1_LogitScore") /
                              "config.json", dict)
    if score_config.get("module_input_name", "causal_logits") != "causal_logits":
        raise ExportError(f"{where}: its LogitScore reads {score_config['module_input_name']!r}, "
                          "not the causal LM's logits (causal_logits)")
    true_id, false_id = score_config.get("true_token_id"), score_config.get("false_token_id")
    if not isinstance(true_id, int) or not (false_id is None or isinstance(false_id, int)):
        raise ExportError(f"{where}: 1_LogitScore/config.json needs an integer true_token_id "
                          f"(and false_token_id or null), got {true_id!r}, {false_id!r}")
    cross_encoder = _json_file(directory / "config_sentence_transformers.json", dict, missing={})
    # one output: sentence-transformers' default is Sigmoid
    activation = stored_activation_fn(str(directory), local=True) or ST_SIGMOID
    score = ST_SCORES.get((false_id is not None, activation))
    if score is None:
        raise ExportError(
            f"{where}: its activation_fn {activation!r} is not one a recipe expresses "
            f"({ST_SIGMOID} or {ST_IDENTITY}); pass --recipe FILE.json to say the score")
    prompts = cross_encoder.get("prompts") or {}
    default_prompt = prompts.get(cross_encoder.get("default_prompt_name") or "") or ""

    from onnxrank._optional import require

    transformers = require("transformers", extra="export")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    if not tokenizer.is_fast:
        raise ExportError(f"{where} has no fast (Rust) tokenizer (tokenizer.json)")
    backend = tokenizer.backend_tokenizer
    yes_token = _answer_token(backend, true_id, "true_token_id", where)
    no_token = "" if false_id is None else _answer_token(backend, false_id, "false_token_id", where)
    modality = transformer.get("modality_config") or {}
    uses_chat = getattr(tokenizer, "chat_template", None) is not None and (
        not modality or "message" in modality)
    if uses_chat:
        options = {key: value for key, value in
                   ((transformer.get("processing_kwargs") or {}).get("chat_template") or {}).items()
                   if key not in _NOT_RENDERING}
        structured = (modality.get("message") or {}).get("format") == "structured"
        prefix, template, suffix, instruction_format, default_instruction = _chat_template_recipe(
            tokenizer, options, structured, default_prompt, where)
    else:
        prefix, template, suffix = _pair_recipe(backend, where)
        instruction_format, default_instruction = "{instruction}", default_prompt
    try:
        return PromptRecipe(
            name=f"sentence-transformers ({directory.name})", prefix=prefix, template=template,
            suffix=suffix, default_instruction=default_instruction, score=score,
            instruction_format=instruction_format, yes_token=yes_token, no_token=no_token)
    except ValueError as err:
        raise ExportError(f"{where}: {err}") from err


def _json_file(path: Path, kind: type, *, missing: Any = None, label: str = "") -> Any:
    """`path`'s JSON value, which must be a `kind`; `missing` when the file is absent and it is
    given; `label` names the file in errors ("the recipe file ")."""
    if not path.is_file() and missing is not None:
        return missing
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ExportError(f"could not read {label}{path}: {err}") from err
    if not isinstance(data, kind):
        raise ExportError(f"{label}{path} must hold a JSON {kind.__name__}, got {type(data).__name__}")
    return data


def _answer_token(tokenizer: Any, token_id: int, field_name: str, where: str) -> str:
    """The vocabulary string of `token_id`, which must encode back to that one token."""
    token = tokenizer.id_to_token(token_id)
    if token is None or tokenizer.encode(token, add_special_tokens=False).ids != [token_id]:
        raise ExportError(
            f"{where}: LogitScore's {field_name} {token_id} ({token!r}) is not a token whose text "
            "encodes to itself alone; a recipe names its answer tokens by text: pass --recipe "
            "FILE.json with yes_token/no_token words that are single tokens")
    return token


def _escape(text: str) -> str:
    """`text` as literal str.format text."""
    return text.replace("{", "{{").replace("}", "}}")


def _chat_template_recipe(tokenizer: Any, options: dict[str, Any], structured: bool,
                          default_prompt: str, where: str) -> tuple[str, tuple[str, ...], str, str, str]:
    """(prefix, template, suffix, instruction_format, default_instruction) of a chat template,
    found by rendering it with the slots' sentinels, with and without a system message."""

    def render(system: bool) -> str:
        roles = (("system", "instruction"),) if system else ()
        messages = [{"role": role, "content": _SENTINELS[slot]}
                    for role, slot in (*roles, ("query", "query"), ("document", "document"))]
        if structured:
            messages = [{**message, "content": [{"type": "text", "text": message["content"]}]}
                        for message in messages]
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, **options)
        except Exception as err:  # noqa: BLE001 - a template may raise anything
            raise ExportError(f"{where}: its chat template could not render a pair "
                              f"({type(err).__name__}: {err})") from err
        return str(text)

    unmapped = ("its chat template does not carry the {} verbatim (it is dropped, repeated or "
                "transformed), so no recipe can say its prompt; pass --recipe FILE.json")
    with_system, without = render(True), render(False)
    for slot in ("query", "document"):
        if with_system.count(_SENTINELS[slot]) != 1 or without.count(_SENTINELS[slot]) != 1:
            raise ExportError(f"{where}: {unmapped.format(slot)}")
    if with_system.count(_SENTINELS["instruction"]) != 1:
        raise ExportError(f"{where}: {unmapped.format('system message (the instruction)')}")
    # the two renders differ only where the instruction goes: around it, the same text
    start = 0
    while start < min(len(with_system), len(without)) and with_system[start] == without[start]:
        start += 1
    end = 0
    while end < min(len(with_system), len(without)) - start \
            and with_system[-1 - end] == without[-1 - end]:
        end += 1
    if start + end == len(without):
        # an insertion (the template writes nothing without a system message) is ambiguous up
        # to where it starts: put it as early as it goes, outside the other slots, so the
        # instruction format reads as the template wrote it (same text either way)
        taken = {index for slot in ("query", "document")
                 for index in range(with_system.index(_SENTINELS[slot]),
                                    with_system.index(_SENTINELS[slot]) + len(_SENTINELS[slot]))}
        while start > 0 and start - 1 not in taken \
                and with_system[start - 1] == with_system[len(with_system) - end - 1] \
                and _SENTINELS["instruction"] in with_system[start - 1:len(with_system) - end - 1]:
            start, end = start - 1, end + 1
    region = with_system[start:len(with_system) - end]
    absent = without[start:len(without) - end]
    before, _, after = region.partition(_SENTINELS["instruction"])
    if any(_SENTINELS[slot] in before + after for slot in ("query", "document")) \
            or _SENTINELS["instruction"] not in region:
        raise ExportError(f"{where}: {unmapped.format('system message (the instruction)')}")
    if default_prompt:
        default = default_prompt
    elif not absent:
        default = ""
    elif absent.startswith(before) and absent.endswith(after) \
            and len(absent) > len(before) + len(after):
        default = absent[len(before):len(absent) - len(after)]
    else:
        raise ExportError(f"{where}: its chat template writes {absent!r} without a system message "
                          f"and {region!r} with one; no instruction format says both: pass "
                          "--recipe FILE.json")
    text = with_system[:start] + _SENTINELS["instruction"] + with_system[len(with_system) - end:]
    slots = {sentinel: "{" + slot + "}" for slot, sentinel in _SENTINELS.items()}
    template = "".join(slots.get(part, _escape(part)) for part in re.split(
        "(" + "|".join(re.escape(sentinel) for sentinel in slots) + ")", text))
    return "", (template,), "", _escape(before) + "{instruction}" + _escape(after), default


def _pair_recipe(tokenizer: Any, where: str) -> tuple[str, tuple[str, ...], str]:
    """(prefix, template, suffix) of a tokenizer that encodes the pair itself: the tokens its
    post-processor adds before, between and after (query, document), as text."""
    encoding = tokenizer.encode(_SENTINELS["query"], _SENTINELS["document"], add_special_tokens=True)
    parts: list[list[int]] = [[], [], []]
    place = 0
    for token_id, sequence in zip(encoding.ids, encoding.sequence_ids):
        if sequence is None:
            parts[place].append(token_id)
        else:
            place = max(place, sequence + 1)
    prefix, separator, suffix = ("".join(tokenizer.id_to_token(token) for token in part)
                                 for part in parts)
    for text, part in zip((prefix, separator, suffix), parts):
        if tokenizer.encode(text, add_special_tokens=False).ids != part:
            raise ExportError(f"{where}: its tokenizer adds the tokens {part} to a pair, which "
                              "do not read back from their text; pass --recipe FILE.json")
    template = ("{instruction}{query}", *((_escape(separator),) if separator else ()),
                "{document}")
    return prefix, template, suffix
