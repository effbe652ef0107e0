"""Backends by name: `make_reranker("cohere", base_url=...)`, and `as_backend` for search()."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from onnxrank.engine.runtime import DEFAULT_MODELS_DIR
from onnxrank.rerankers.base import DEFAULT_ON_ERROR, DEFAULT_TIMEOUT_S, OnError, RerankBackend
from onnxrank.rerankers.cohere import DEFAULT_COHERE_MODEL, CohereReranker
from onnxrank.rerankers.llm import DEFAULT_LLM_URL, DEFAULT_MAX_CONCURRENCY, ChatApi, LLMReranker
from onnxrank.rerankers.local import DEFAULT_LOCAL_MODEL, LocalReranker
from onnxrank.rerankers.none import NoReranker

if TYPE_CHECKING:
    from onnxrank.engine.config import EngineConfig

BACKEND_NAMES: tuple[str, ...] = ("local", "cohere", "llm", "none")
DEFAULT_BACKEND = "local"


def make_reranker(
    name: str,
    *,
    model: str | Path | None = None,
    models_dir: str | Path = DEFAULT_MODELS_DIR,
    config: EngineConfig | None = None,
    base_url: str | None = None,
    api_key: str | None = None,
    api: ChatApi = "openai",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    on_error: OnError = DEFAULT_ON_ERROR,
) -> RerankBackend:
    """A backend by name; each uses the options that apply to it.

    1. "local": `model` (default "minilm-standin") under `models_dir`, engine `config`; loaded on
       first use.
    2. "cohere": `model` (default "rerank-v3.5"), `base_url` (default Cohere's API), `api_key`
       (default COHERE_API_KEY / CO_API_KEY), `timeout_s`.
    3. "llm": `model` (required), `base_url` (default Ollama's OpenAI-compatible root),
       `api` ("openai" or "ollama"), `api_key`, `timeout_s`, `max_concurrency`.
    4. "none": the retrieval order.

    Raises:
        ValueError: Unknown name, or "llm" without a model.
    """
    if name == "local":
        return LocalReranker(
            DEFAULT_LOCAL_MODEL if model is None else model,
            models_dir=models_dir,
            config=config,
            on_error=on_error,
        )
    if name == "cohere":
        return CohereReranker(
            model=DEFAULT_COHERE_MODEL if model is None else str(model),
            base_url=base_url,
            api_key=api_key,
            timeout_s=timeout_s,
            on_error=on_error,
        )
    if name == "llm":
        if model is None:
            raise ValueError("the llm reranker needs a chat model name (model=..., CLI --reranker-model)")
        return LLMReranker(
            model=str(model),
            base_url=DEFAULT_LLM_URL if base_url is None else base_url,
            api=api,
            api_key=api_key,
            timeout_s=timeout_s,
            max_concurrency=max_concurrency,
            on_error=on_error,
        )
    if name == "none":
        return NoReranker()
    raise ValueError(f"reranker must be one of {', '.join(BACKEND_NAMES)}, got {name!r}")


def as_backend(reranker: object) -> RerankBackend:
    """A backend from what `HybridRetriever.search(reranker=...)` accepts.

    1. A backend (anything with `name` and `rerank`): itself.
    2. An engine `Reranker`: wrapped in LocalReranker.
    3. A backend name ("local", "cohere", "llm", "none"): make_reranker(name).

    Raises:
        TypeError: Anything else.
    """
    from onnxrank.engine.reranker import Reranker

    if isinstance(reranker, Reranker):
        return LocalReranker(reranker)
    if isinstance(reranker, str):
        return make_reranker(reranker)
    if isinstance(reranker, RerankBackend):
        return reranker
    raise TypeError(
        "reranker must be a backend (onnxrank.rerankers), a Reranker or a backend name "
        f"({', '.join(BACKEND_NAMES)}), got {type(reranker).__name__}"
    )
