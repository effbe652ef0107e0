"""What differs between the export's tasks, one object each: rerank and embedding.

The request's task name (``--task``, the registry, the manifest's ``task``) is read once, by
`export_task`; every stage after that asks the ExportTask it returns: which transformers class
loads the checkpoint, which module is traced and what its output is called, the manifest's
activation, num_labels, embedding_dim and notes, the max-length rule, whether the [CLS]-only
rewrite can apply, the PyTorch reference, how validation pairs become rows and which metrics and
thresholds judge a variant, whether a prompt recipe applies and whether the graph has a
classification head (OpenVINO int8 may keep it in fp32). Adding a task is one subclass here and
one entry in EXPORT_TASKS.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from onnxrank._optional import require
from onnxrank.engine.spec import Activation, Task
from onnxrank.errors import ExportError
from onnxrank.export.fidelity import FidelityThresholds, embedding_metrics, score_metrics

if TYPE_CHECKING:
    import torch

    from onnxrank.engine.rows import EncodedRow, RowEncoder
    from onnxrank.export.loaded import LoadedModel

Runner = Callable[[dict[str, np.ndarray]], np.ndarray]
Check = tuple[str, str, float, str]

DEFAULT_MODEL = "cross-encoder/ms-marco-MiniLM-L-6-v2"
DEFAULT_MAX_LENGTH = 512
STANDIN_NOTES = (
    "Offline stand-in: scores are NOT relevance scores. The encoder was never trained for "
    "reranking; the head is a logistic regression fitted on frozen features (see source.standin.head). "
    "Use it to test and benchmark the machinery, not to judge ranking quality. "
)
EMBEDDING_NOTES = ("Embedding model: the graph outputs mean-pooled, L2-normalised embeddings "
                   "(output 'embeddings'); num_labels is unused.")


class RerankReference(Protocol):
    """What a rerank reference is asked of: the checkpoint's family (onnxrank.export.families)."""

    def reference_runner(self, loaded: LoadedModel) -> Runner: ...


class ExportTask(ABC):
    """One task's answers to every question the export asks of it.

    Attributes:
        name: The manifest's ``task``.
        output_name: The graph's output.
        activation: The manifest's activation of the graph's output.
        takes_recipe: Whether a prompt recipe (``--recipe``, decoder rerankers) applies.
        has_head: Whether the graph ends in a classification head (OpenVINO int8's ``fp32_head``
            rungs keep it in fp32).
        cls_only_blocker: Why the [CLS]-only last layer never applies to this task, or None.
    """

    name: Task
    output_name: str
    activation: Activation
    takes_recipe: bool
    has_head: bool
    cls_only_blocker: str | None

    @abstractmethod
    def auto_class(self) -> Any:
        """The transformers Auto class that loads the checkpoint (a family may override it)."""

    @abstractmethod
    def graph_module(self, model: Any, input_names: tuple[str, ...]) -> torch.nn.Module:
        """`model` wrapped to take the graph inputs positionally and return `output_name`."""

    @abstractmethod
    def num_labels(self, config: Any) -> int:
        """The manifest's num_labels (a family may override it)."""

    def embedding_dim(self, config: Any) -> int | None:
        """The manifest's embedding_dim: None unless the graph outputs embeddings."""
        return None

    @abstractmethod
    def notes(self, *, standin: bool) -> str:
        """The manifest's notes (stripped by the caller)."""

    def max_length(self, default: int, loaded: LoadedModel) -> int:
        """The manifest's max_length when --max-length is not given; `default` is the family's."""
        return default

    @abstractmethod
    def check_checkpoint(self, config: Any, directory: Path | None, location: str, *,
                         uses_recipe: bool) -> None:
        """Refuse a checkpoint this task cannot export, before its weights load.

        Raises:
            ExportError: Naming what is wrong and what to pass instead.
        """

    def load_reference(self, location: str, *, local: bool) -> Any:
        """A reference model other than the checkpoint itself (LoadedModel.reference), or None."""
        return None

    @abstractmethod
    def reference_runner(self, loaded: LoadedModel, family: RerankReference) -> Runner:
        """The unpruned PyTorch model as a run(feeds) callable: the reference every variant meets."""

    @abstractmethod
    def validation_rows(self, encoder: RowEncoder[Any], pairs: Sequence[tuple[str, str]]) -> tuple[
            list[EncodedRow], list[tuple[int, int]]]:
        """The validation (query, passage) pairs as model rows, and each pair's (query row,
        passage row) when a row is one text (else empty)."""

    @abstractmethod
    def metrics(self, reference: np.ndarray, outputs: np.ndarray, pairs: list[int],
                groups: list[str], pair_rows: Sequence[tuple[int, int]]) -> dict[str, Any]:
        """Fidelity of `outputs` against `reference` over the pairs at indices `pairs`."""

    @abstractmethod
    def threshold_checks(self, thresholds: FidelityThresholds, variant: str) -> list[Check]:
        """(metric, "<=" or ">=", threshold, attribute name) that judge one variant."""


class RerankTask(ExportTask):
    """A reranker: a sequence-classification head (or a decoder's prompt) whose logits are the scores."""

    name = "rerank"
    output_name = "logits"
    activation = "sigmoid"
    takes_recipe = True
    has_head = True
    cls_only_blocker = None

    def auto_class(self) -> Any:
        return require("transformers", extra="export").AutoModelForSequenceClassification

    def graph_module(self, model: Any, input_names: tuple[str, ...]) -> torch.nn.Module:
        from onnxrank.export.onnx import logits_graph

        return logits_graph(model, input_names)

    def num_labels(self, config: Any) -> int:
        return int(config.num_labels)

    def notes(self, *, standin: bool) -> str:
        return STANDIN_NOTES if standin else ""

    def check_checkpoint(self, config: Any, directory: Path | None, location: str, *,
                         uses_recipe: bool) -> None:
        """A reranker that is no decoder (scored through a recipe) must be a
        ``*ForSequenceClassification`` with one label."""
        if uses_recipe:
            return
        architectures = list(getattr(config, "architectures", None) or [])
        if not any(name.endswith("ForSequenceClassification") for name in architectures):
            raise ExportError(
                f"{location} has no sequence-classification head (architectures: "
                f"{', '.join(architectures) or 'none'}); a reranker must be a cross-encoder "
                "(*ForSequenceClassification with num_labels=1); for an embedding model pass "
                "--task embedding"
            )
        if config.num_labels != 1:
            raise ExportError(
                f"{location} has num_labels={config.num_labels} (labels: "
                f"{', '.join(map(str, config.id2label.values()))}); onnxrank scores each pair with "
                "one relevance logit, so only num_labels=1 cross-encoders can be exported, e.g. "
                f"{DEFAULT_MODEL}"
            )

    def reference_runner(self, loaded: LoadedModel, family: RerankReference) -> Runner:
        return family.reference_runner(loaded)

    def validation_rows(self, encoder: RowEncoder[Any], pairs: Sequence[tuple[str, str]]) -> tuple[
            list[EncodedRow], list[tuple[int, int]]]:
        return encoder.encode(list(pairs)), []

    def metrics(self, reference: np.ndarray, outputs: np.ndarray, pairs: list[int],
                groups: list[str], pair_rows: Sequence[tuple[int, int]]) -> dict[str, Any]:
        return score_metrics(reference[pairs, 0], outputs[pairs, 0], groups)

    def threshold_checks(self, thresholds: FidelityThresholds, variant: str) -> list[Check]:
        return thresholds.score_checks(variant)


class EmbeddingTask(ExportTask):
    """An embedder: the bare encoder, mean-pooled and L2-normalised inside the graph, judged
    against sentence-transformers' own model."""

    name = "embedding"
    output_name = "embeddings"
    activation = "none"
    takes_recipe = False
    has_head = False
    cls_only_blocker = "embedding model: mean pooling reads every row"

    def auto_class(self) -> Any:
        return require("transformers", extra="export").AutoModel

    def graph_module(self, model: Any, input_names: tuple[str, ...]) -> torch.nn.Module:
        from onnxrank.export.onnx import mean_pooled_graph

        return mean_pooled_graph(model, input_names)

    def num_labels(self, config: Any) -> int:
        return 1  # unused: the output is an embedding

    def embedding_dim(self, config: Any) -> int | None:
        return int(config.hidden_size)

    def notes(self, *, standin: bool) -> str:
        return EMBEDDING_NOTES

    def max_length(self, default: int, loaded: LoadedModel) -> int:
        """sentence-transformers' max_seq_length, else the family's limit capped at 512."""
        if loaded.reference is not None and loaded.reference.max_seq_length:
            return int(loaded.reference.max_seq_length)
        return min(default, DEFAULT_MAX_LENGTH)

    def check_checkpoint(self, config: Any, directory: Path | None, location: str, *,
                         uses_recipe: bool) -> None:
        """The graph mean-pools: a sentence-transformers checkpoint that pools otherwise is refused."""
        if directory is None:
            return
        pooling_path = directory / "1_Pooling" / "config.json"
        if not pooling_path.is_file():
            return
        pooling = json.loads(pooling_path.read_text("utf-8"))
        if not pooling.get("pooling_mode_mean_tokens", False):
            modes = sorted(key for key, value in pooling.items()
                           if key.startswith("pooling_mode") and value)
            raise ExportError(
                f"{directory} uses sentence-transformers pooling {modes}; onnxrank embedding graphs "
                "do mean pooling only (pooling_mode_mean_tokens), so this model cannot be exported"
            )

    def load_reference(self, location: str, *, local: bool) -> Any:
        sentence_transformers = require("sentence_transformers", extra="export")
        return sentence_transformers.SentenceTransformer(
            location, device="cpu", local_files_only=local).eval()

    def reference_runner(self, loaded: LoadedModel, family: RerankReference) -> Runner:
        torch = require("torch", extra="export")
        names = loaded.input_names

        def run_embedding(feeds: dict[str, np.ndarray]) -> np.ndarray:
            with torch.inference_mode():
                features = {name: torch.from_numpy(feeds[name]) for name in names}
                embedding = loaded.reference(features)["sentence_embedding"]
                # the graph always normalises; a reference without a Normalize module does not
                return torch.nn.functional.normalize(embedding, p=2.0, dim=1).float().numpy()

        return run_embedding

    def validation_rows(self, encoder: RowEncoder[Any], pairs: Sequence[tuple[str, str]]) -> tuple[
            list[EncodedRow], list[tuple[int, int]]]:
        """Each distinct text once, queries first."""
        texts = list(dict.fromkeys([query for query, _ in pairs] + [passage for _, passage in pairs]))
        position = {text: index for index, text in enumerate(texts)}
        return encoder.encode(texts), [(position[query], position[passage]) for query, passage in pairs]

    def metrics(self, reference: np.ndarray, outputs: np.ndarray, pairs: list[int],
                groups: list[str], pair_rows: Sequence[tuple[int, int]]) -> dict[str, Any]:
        return embedding_metrics(reference, outputs, [pair_rows[index] for index in pairs], groups)

    def threshold_checks(self, thresholds: FidelityThresholds, variant: str) -> list[Check]:
        return thresholds.cosine_checks(variant)


RERANK = RerankTask()
EMBEDDING = EmbeddingTask()
EXPORT_TASKS: dict[str, ExportTask] = {RERANK.name: RERANK, EMBEDDING.name: EMBEDDING}


def export_task(name: str) -> ExportTask:
    """The ExportTask of a task name (``--task``, the registry's or the manifest's ``task``).

    Raises:
        ValueError: No task has this name.
    """
    if name not in EXPORT_TASKS:
        raise ValueError(f"task must be {' or '.join(map(repr, EXPORT_TASKS))}, got {name!r}")
    return EXPORT_TASKS[name]
