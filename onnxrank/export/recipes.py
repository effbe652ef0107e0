"""Scoring recipes of decoder-only rerankers: the prompt around a (query, document) pair and the
two answer tokens whose logits make the score.

A decoder reranker (Qwen3-Reranker and its kind) reads one prompt per pair::

    prefix + template.format(instruction=..., query=..., document=...) + suffix

and scores it by p(yes) = softmax([logit(no), logit(yes)])[1] at the last position. The exported
graph returns logit(yes) - logit(no), whose sigmoid is exactly that probability, so the manifest's
``activation: sigmoid`` holds for these models too. The manifest's ``prompt`` entry is
`PromptRecipe.to_manifest`; the engine reads nothing else (onnxrank.engine.prompt).

Only the standard library is imported here: the engine reads recipes from manifests without the
export extra.
"""

from __future__ import annotations

import json
import string
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from onnxrank.errors import ExportError

SLOTS = ("instruction", "query", "document")
# What a recipe's score is: the only definition so far, p(yes) from the two answer logits.
SCORES = ("softmax_yes_no",)
QWEN3_SYSTEM = ('Judge whether the Document meets the requirements based on the Query and the '
                'Instruct provided. Note that the answer can only be "yes" or "no".')


@dataclass(frozen=True, slots=True)
class PromptRecipe:
    """How a decoder reranker reads a pair and what its score is.

    Attributes:
        name: Recipe name (``--recipe NAME``).
        prefix: Text before the user turn: the system turn and the user turn's opening.
        template: The user turn, with ``{instruction}``, ``{query}`` and ``{document}`` once each
            (``str.format`` syntax: literal braces are doubled).
        suffix: Text after the user turn up to where the answer starts (the assistant turn's
            opening, with Qwen3's empty think block).
        default_instruction: The instruction when the caller gives none.
        yes_token: The answer token meaning relevant; must be one token of the tokenizer.
        no_token: The answer token meaning not relevant; must be one token too.
        score: ``softmax_yes_no``: p(yes) = softmax([logit(no), logit(yes)])[1] at the last token.
        model_ids: Hub id prefixes this recipe is chosen for automatically.
    """

    name: str
    prefix: str
    template: str
    suffix: str
    default_instruction: str
    yes_token: str
    no_token: str
    score: str = "softmax_yes_no"
    model_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_template(self.template, f"recipe {self.name!r}")
        if self.score not in SCORES:
            raise ValueError(f"recipe {self.name!r}: score must be one of "
                             f"{', '.join(SCORES)}, got {self.score!r}")
        for name in ("yes_token", "no_token", "default_instruction"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"recipe {self.name!r}: {name} must be a non-empty string, "
                                 f"got {getattr(self, name)!r}")

    def to_manifest(self, *, yes_token_id: int, no_token_id: int) -> dict[str, Any]:
        """The manifest's ``prompt`` entry: the recipe plus its answer tokens' ids."""
        entry = asdict(self)
        entry["model_ids"] = list(self.model_ids)
        entry.update({"yes_token_id": yes_token_id, "no_token_id": no_token_id,
                      "graph_output": "logits[:, 0] = logit(yes) - logit(no) at the last real "
                                      "token; sigmoid of it = p(yes)"})
        return entry

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, origin: str) -> PromptRecipe:
        """A recipe from a JSON object (a recipe file, or a manifest's ``prompt`` entry).

        Raises:
            ValueError: A required field is missing, a field is unknown, or a value is invalid.
        """
        known = {spec.name for spec in fields(cls)}
        derived = {"yes_token_id", "no_token_id", "graph_output"}
        unknown = sorted(set(data) - known - derived)
        if unknown:
            raise ValueError(f"{origin}: unknown recipe fields {unknown}; allowed: "
                             f"{', '.join(sorted(known))}")
        required = [spec.name for spec in fields(cls) if spec.name not in ("score", "model_ids")]
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"{origin}: recipe fields {missing} are missing; a recipe needs "
                             f"{', '.join(required)}")
        values = {name: data[name] for name in known if name in data}
        values["model_ids"] = tuple(values.get("model_ids", ()))
        check_template(str(values["template"]), origin)  # its errors name the file
        return cls(**values)

    def render(self, *, instruction: str, query: str, document: str) -> tuple[str, tuple[int, int]]:
        """The user turn for one pair and the character span of the document in it."""
        parts: list[str] = []
        span = (0, 0)
        length = 0
        values = {"instruction": instruction, "query": query, "document": document}
        for literal, slot, _, _ in string.Formatter().parse(self.template):
            parts.append(literal)
            length += len(literal)
            if slot is None:
                continue
            if slot == "document":
                span = (length, length + len(document))
            parts.append(values[slot])
            length += len(values[slot])
        return "".join(parts), span


def check_template(template: str, origin: str) -> None:
    """ValueError unless `template` has each of {instruction}, {query}, {document} exactly once
    and no other field."""
    try:
        slots = [slot for _, slot, _, _ in string.Formatter().parse(template) if slot is not None]
    except ValueError as err:
        raise ValueError(f"{origin}: template is not valid str.format text ({err}); "
                         "double literal braces") from err
    for slot in SLOTS:
        if slots.count(slot) != 1:
            raise ValueError(
                f"{origin}: template must contain {{{slot}}} exactly once, found it "
                f"{slots.count(slot)} times; slots: {', '.join('{' + s + '}' for s in SLOTS)}"
            )
    others = sorted(set(str(slot) for slot in slots) - set(SLOTS))
    if others:
        raise ValueError(f"{origin}: template has unknown slots {others}; allowed: "
                         f"{', '.join('{' + s + '}' for s in SLOTS)}")


QWEN3_RERANKER = PromptRecipe(
    name="qwen3-reranker",
    prefix=f"<|im_start|>system\n{QWEN3_SYSTEM}<|im_end|>\n<|im_start|>user\n",
    template="<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    default_instruction="Given a web search query, retrieve relevant passages that answer the query",
    yes_token="yes",
    no_token="no",
    model_ids=("Qwen/Qwen3-Reranker-",),
)
BUILTIN_RECIPES: dict[str, PromptRecipe] = {QWEN3_RERANKER.name: QWEN3_RERANKER}


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


def answer_token_ids(recipe: PromptRecipe, tokenizer: Any) -> tuple[int, int]:
    """The (yes, no) token ids of `recipe` in a `tokenizers.Tokenizer`.

    Raises:
        ExportError: An answer word is not exactly one token of the tokenizer, or a slot is
            missing from the template (checked again here for recipes built in code).
    """
    try:
        check_template(recipe.template, f"recipe {recipe.name!r}")
    except ValueError as err:
        raise ExportError(str(err)) from err
    ids = []
    for field_name in ("yes_token", "no_token"):
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
    return ids[0], ids[1]
