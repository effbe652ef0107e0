"""The prompt recipe of a decoder reranker: part of the manifest contract (ModelSpec.recipe).

A decoder reranker (Qwen3-Reranker, bge-reranker-v2-gemma, mxbai-rerank-v2) reads one prompt per
pair::

    prefix + template pieces (instruction, query, document filled in) + suffix

Each template piece is tokenized on its own and the token ids are joined, as the model cards do
(Qwen3's user turn is one piece; FlagEmbedding and mxbai-rerank tokenize the query part, the
separator and the document part apart). The score is read at the last token; what it is comes
from the recipe's score kind (SCORES): the graph returns one number per row, and the manifest's
activation turns it into what the model card reports. The manifest's ``prompt`` entry is
`PromptRecipe.to_manifest`, parsed once into ``ModelSpec.recipe``; the engine's prompt encoder
(onnxrank.engine.prompt) reads nothing else. The export keeps the built-in recipes and the answer
token lookup (onnxrank.export.recipes).
"""

from __future__ import annotations

import string
from dataclasses import MISSING, asdict, dataclass, fields
from typing import Any, Literal

SLOTS = ("instruction", "query", "document")


@dataclass(frozen=True, slots=True)
class ScoreKind:
    """What a recipe's score is, from the logits of its answer tokens at the last real token.

    Attributes:
        answer_tokens: The recipe fields naming the answer tokens this score reads, in order.
        weights: The graph's output is sum(weight * logit(token)) over `answer_tokens`: one row of
            the vocabulary projection, built from those tokens' rows (onnxrank.export's decoder
            graph), kept in fp32.
        activation: The manifest's activation on that output: what the model card reports.
        graph_output: How the manifest describes the graph's output.
    """

    answer_tokens: tuple[str, ...]
    weights: tuple[float, ...]
    activation: Literal["sigmoid", "none"]
    graph_output: str


SCORES: dict[str, ScoreKind] = {
    # Qwen3-Reranker: p(yes) = softmax([logit(no), logit(yes)])[1] = sigmoid(yes - no)
    "softmax_yes_no": ScoreKind(
        ("yes_token", "no_token"), (1.0, -1.0), "sigmoid",
        "logits[:, 0] = logit(yes) - logit(no) at the last real token; sigmoid of it = p(yes)"),
    # bge-reranker-v2-gemma (FlagEmbedding): the raw logit of "Yes"
    "yes_logit": ScoreKind(
        ("yes_token",), (1.0,), "none",
        "logits[:, 0] = logit(yes) at the last real token (the raw score)"),
    # mxbai-rerank-v2: logit("1") - logit("0"), reported raw
    "logit_difference": ScoreKind(
        ("yes_token", "no_token"), (1.0, -1.0), "none",
        "logits[:, 0] = logit(yes) - logit(no) at the last real token (the raw score)"),
    # monoT5 / InRanker / mT5 mMARCO (a seq2seq family's graph): p(true) = softmax([logit(true),
    # logit(false)])[0] at the first decoder step, as the rerankers library reports it (pygaggle
    # reports its log, the same ranking)
    "seq2seq_softmax": ScoreKind(
        ("yes_token", "no_token"), (1.0, -1.0), "sigmoid",
        "logits[:, 0] = logit(true) - logit(false) at the first decoder step; sigmoid of it = "
        "p(true)"),
    # a sentence-transformers CrossEncoder whose LogitScore reads one token, under its default
    # Sigmoid activation (onnxrank.export.recipes.sentence_transformers_recipe)
    "yes_logit_sigmoid": ScoreKind(
        ("yes_token",), (1.0,), "sigmoid",
        "logits[:, 0] = logit(yes) at the last real token; sigmoid of it is the score"),
}


@dataclass(frozen=True, slots=True)
class PromptRecipe:
    """How a decoder reranker reads a pair and what its score is.

    Attributes:
        name: Recipe name (``--recipe NAME``).
        prefix: Text before the template: the system turn and the user turn's opening.
        template: The pieces between prefix and suffix, each tokenized on its own; together they
            hold ``{instruction}``, ``{query}`` and ``{document}`` once each (``str.format``
            syntax: literal braces are doubled). A recipe file may give one string.
        suffix: Text after the template up to where the answer starts (the assistant turn's
            opening).
        default_instruction: The instruction when the caller gives none; empty leaves the
            ``{instruction}`` slot empty.
        yes_token: The answer token meaning relevant; must be one token of the tokenizer.
        no_token: The answer token meaning not relevant (score kinds that read two tokens).
        score: The score kind, a key of SCORES.
        instruction_format: What a non-empty instruction puts in its slot (``{instruction}``
            in it once; mxbai-rerank writes its own line).
        query_share: The query's cap, as a share of what the prompt's fixed tokens leave.
        model_ids: Hub id prefixes this recipe is chosen for automatically.
    """

    name: str
    prefix: str
    template: tuple[str, ...]
    suffix: str
    default_instruction: str
    yes_token: str
    no_token: str = ""
    score: str = "softmax_yes_no"
    instruction_format: str = "{instruction}"
    query_share: float = 0.5
    model_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_template(self.template, f"recipe {self.name!r}")
        if self.score not in SCORES:
            raise ValueError(f"recipe {self.name!r}: score must be one of "
                             f"{', '.join(SCORES)}, got {self.score!r}")
        for name in SCORES[self.score].answer_tokens:
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"recipe {self.name!r}: {name} must be a non-empty string "
                                 f"(score {self.score!r} reads it), got {getattr(self, name)!r}")
        if not isinstance(self.default_instruction, str):
            raise ValueError(f"recipe {self.name!r}: default_instruction must be a string, got "
                             f"{self.default_instruction!r}")
        format_slots = [slot for _, slot, _, _ in string.Formatter().parse(self.instruction_format)
                        if slot is not None]
        if format_slots != ["instruction"]:
            raise ValueError(f"recipe {self.name!r}: instruction_format must contain "
                             f"{{instruction}} once and no other slot, got "
                             f"{self.instruction_format!r}")
        if not 0 < self.query_share < 1:
            raise ValueError(f"recipe {self.name!r}: query_share must be between 0 and 1, got "
                             f"{self.query_share!r}")

    @property
    def score_kind(self) -> ScoreKind:
        """The recipe's entry of SCORES."""
        return SCORES[self.score]

    def to_manifest(self, *, answer_token_ids: tuple[int, ...]) -> dict[str, Any]:
        """The manifest's ``prompt`` entry: the recipe plus its answer tokens' ids (in the order
        of its score kind's answer_tokens)."""
        entry = asdict(self)
        entry["template"] = list(self.template)
        entry["model_ids"] = list(self.model_ids)
        for name, token_id in zip(self.score_kind.answer_tokens, answer_token_ids):
            entry[f"{name}_id"] = token_id
        entry["graph_output"] = self.score_kind.graph_output
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
        required = [spec.name for spec in fields(cls) if spec.default is MISSING]
        missing = [name for name in required if name not in data]
        if missing:
            raise ValueError(f"{origin}: recipe fields {missing} are missing; a recipe needs "
                             f"{', '.join(required)}")
        values = {name: data[name] for name in known if name in data}
        template = values["template"]
        values["template"] = (template,) if isinstance(template, str) else tuple(template)
        values["model_ids"] = tuple(values.get("model_ids", ()))
        check_template(values["template"], origin)  # its errors name the file
        return cls(**values)

    def render(self, *, instruction: str, query: str,
               document: str) -> tuple[list[str], int, tuple[int, int]]:
        """The template's pieces for one pair, the index of the piece holding the document, and
        the document's character span in that piece."""
        values = {"instruction": self.instruction_format.format(instruction=instruction)
                  if instruction else "", "query": query, "document": document}
        pieces: list[str] = []
        where, span = 0, (0, 0)
        for index, piece in enumerate(self.template):
            parts: list[str] = []
            length = 0
            for literal, slot, _, _ in string.Formatter().parse(piece):
                parts.append(literal)
                length += len(literal)
                if slot is None:
                    continue
                if slot == "document":
                    where, span = index, (length, length + len(document))
                parts.append(values[slot])
                length += len(values[slot])
            pieces.append("".join(parts))
        return pieces, where, span

    def text(self, *, instruction: str, query: str, document: str) -> str:
        """The whole prompt of one pair as text (what a reader sees; rows are tokenized piece by
        piece)."""
        pieces, _, _ = self.render(instruction=instruction, query=query, document=document)
        return self.prefix + "".join(pieces) + self.suffix


def check_template(template: tuple[str, ...], origin: str) -> None:
    """ValueError unless the pieces of `template` hold each of {instruction}, {query},
    {document} exactly once and no other field."""
    if isinstance(template, str) or not template or not all(
            isinstance(piece, str) for piece in template):
        raise ValueError(f"{origin}: template must be a non-empty list of strings (pieces "
                         f"tokenized apart), got {template!r}")
    try:
        slots = [slot for piece in template
                 for _, slot, _, _ in string.Formatter().parse(piece) if slot is not None]
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
