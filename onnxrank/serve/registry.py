"""The models one server serves: each with the id clients put in ``model``, its task (from its
engine's kind) and its own queue and engine worker, and the lookup every endpoint does."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from onnxrank.engine.embedder import Embedder
from onnxrank.engine.reranker import Reranker
from onnxrank.serve.batcher import Batcher
from onnxrank.serve.errors import Dialect, RequestError
from onnxrank.serve.tasks import EmbeddingTask, RerankTask

# Names of the tasks in messages ("an embedding model").
TASK_NOUN = {"rerank": "a rerank model", "embedding": "an embedding model"}


@dataclass
class ServedModel:
    """One served model: its id, its loaded engine and its Batcher."""

    id: str
    engine: Reranker | Embedder
    batcher: Batcher

    @property
    def task(self) -> str:
        """"rerank" or "embedding": its Batcher's task, which its engine's kind chose."""
        return self.batcher.task.name

    @property
    def reranker(self) -> Reranker:
        """The engine of a rerank model.

        Raises:
            TypeError: The model is not a reranker (ModelSet.pick checks the task first).
        """
        if not isinstance(self.engine, Reranker):
            raise TypeError(f"model {self.id} is {TASK_NOUN[self.task]}, not a reranker")
        return self.engine

    @property
    def embedding_task(self) -> EmbeddingTask:
        """The task of an embedding model (its token counter and embedder).

        Raises:
            TypeError: The model is not an embedding model.
        """
        task = self.batcher.task
        if not isinstance(task, EmbeddingTask):
            raise TypeError(f"model {self.id} is {TASK_NOUN[self.task]}, not an embedding model")
        return task

    @property
    def rerank_task(self) -> RerankTask:
        """The task of a rerank model.

        Raises:
            TypeError: The model is not a reranker.
        """
        task = self.batcher.task
        if not isinstance(task, RerankTask):
            raise TypeError(f"model {self.id} is {TASK_NOUN[self.task]}, not a reranker")
        return task

    @property
    def max_length(self) -> int:
        """Tokens per row the engine runs (a reranker's config may lower the manifest's)."""
        return self.engine.max_length

    @property
    def warning(self) -> str | None:
        """The label every rerank answer carries when the scores are not relevance scores."""
        if not isinstance(self.engine, Reranker) or self.engine.spec.relevance_trained:
            return None
        return (f"model {self.id} is not relevance-trained: its scores are NOT relevance "
                "scores (speed measurements only)")

    def describe(self, created: int) -> dict[str, Any]:
        """The model's entry in /v1/models (OpenAI's model object plus what it runs)."""
        info = self.engine.device_info
        entry: dict[str, Any] = {
            "id": self.id, "object": "model", "created": created, "owned_by": "onnxrank",
            "task": self.task, "max_length": self.max_length, "device": info.device,
            "variant": info.variant, "threads": info.threads,
        }
        if isinstance(self.engine, Embedder):
            entry["dimensions"] = int(self.engine.dim)
        else:
            entry["relevance_trained"] = self.engine.spec.relevance_trained
        return entry


class ModelSet:
    """The served models in command-line order, looked up by id.

    Raises:
        ValueError: No models, or two with the same id.
    """

    def __init__(self, models: Sequence[ServedModel]) -> None:
        if not models:
            raise ValueError("a server needs at least one model, got none")
        ids = [model.id for model in models]
        duplicates = sorted({name for name in ids if ids.count(name) > 1})
        if duplicates:
            raise ValueError(f"model ids must be unique, got {', '.join(duplicates)} more than "
                             "once; give each its own id with --model ID=MODEL")
        self.models = list(models)
        self._by_id = {model.id: model for model in models}

    def __iter__(self) -> Any:
        return iter(self.models)

    def known(self) -> str:
        """Every id with its task, for messages: "minilm (rerank), e5 (embedding)"."""
        return ", ".join(f"{model.id} ({model.task})" for model in self.models)

    def get(self, name: str) -> ServedModel | None:
        """The model with id `name`, or None."""
        return self._by_id.get(name)

    def first(self, task: str) -> ServedModel | None:
        """The first model of `task` (the default of requests that name none), or None."""
        return next((model for model in self.models if model.task == task), None)

    def pick(self, name: str | None, task: str, dialect: Dialect, path: str) -> ServedModel:
        """The model a request to `path` (an endpoint of `task`) asks for in its `model` field.

        1. No name: the first model of the task.
        2. A served id of the task: that model.
        3. A served id of the other task: 400 (TEI: 422), naming the models of the task.
        4. No such id, or no model of the task at all: 404 (TEI, which has no 404: 422),
           naming the served models.

        Raises:
            RequestError: Cases 3 and 4, with ``param`` "model".
        """
        not_found = 422 if dialect == "tei" else 404
        if name is None:
            model = self.first(task)
            if model is None:
                raise RequestError(
                    not_found, f"{path} needs {TASK_NOUN[task]}, and this server serves none; "
                               f"it serves: {self.known()}", param="model", code="model_not_found")
            return model
        model = self.get(name)
        if model is None:
            raise RequestError(
                not_found, f"model {name!r} is not served here; known models: {self.known()}",
                param="model", code="model_not_found")
        if model.task != task:
            wanted = [other.id for other in self.models if other.task == task]
            hint = (f"use one of: {', '.join(wanted)}" if wanted
                    else "this server serves none")
            raise RequestError(
                422 if dialect == "tei" else 400,
                f"model {name!r} is {TASK_NOUN[model.task]}, but {path} needs {TASK_NOUN[task]}; "
                f"{hint}", param="model", code="model_task_mismatch")
        return model
