"""The prompt recipe of a decoder reranker: part of the manifest contract (ModelSpec.recipe).

A decoder reranker (Qwen3-Reranker and its kind) reads one prompt per pair::

    prefix + template.format(instruction=..., query=..., document=...) + suffix

and scores it by p(yes) = softmax([logit(no), logit(yes)])[1] at the last position. The exported
graph returns logit(yes) - logit(no), whose sigmoid is exactly that probability, so the manifest's
``activation: sigmoid`` holds for these models too. The manifest's ``prompt`` entry is
`PromptRecipe.to_manifest`, parsed once into ``ModelSpec.recipe``; the engine's prompt encoder
(onnxrank.engine.prompt) reads nothing else. The export keeps the built-in recipes and the answer
token lookup (onnxrank.export.recipes).
"""

from __future__ import annotations

import string
from dataclasses import asdict, dataclass, fields
from typing import Any

SLOTS = ("instruction", "query", "document")
# What a recipe's score is: the only definition so far, p(yes) from the two answer logits.
SCORES = ("softmax_yes_no",)


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
