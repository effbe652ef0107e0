"""LlamaIndex adapter (extra ``llamaindex``): OnnxRankRerank, a ``BaseNodePostprocessor``.

It follows LlamaIndex's SentenceTransformerRerank and FlashRankRerank: the text scored is
``node.get_content(metadata_mode=MetadataMode.EMBED)``, the result is the best `top_n`
NodeWithScore, best first, with the model's activated score (sigmoid for cross-encoders) as
``score``, inside a RERANKING callback event; no query bundle is a ValueError and no nodes give [].
``keep_retrieval_score=True`` keeps the retriever's score in ``metadata["retrieval_score"]``.
Unlike those two, the caller's NodeWithScore objects and nodes are not modified: the results are
new NodeWithScore objects (around a copy of the node when its metadata changes).
``apostprocess_nodes`` is BaseNodePostprocessor's own (a worker thread).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxrank._optional import require
from onnxrank.engine.reranker import Reranker
from onnxrank.engine.runtime import DEFAULT_MODELS_DIR

_types = require("llama_index.core.postprocessor.types", extra="llamaindex")
if TYPE_CHECKING:
    from llama_index.core.postprocessor.types import BaseNodePostprocessor
else:
    BaseNodePostprocessor = _types.BaseNodePostprocessor
_schema = require("llama_index.core.schema", extra="llamaindex")
_callbacks = require("llama_index.core.callbacks", extra="llamaindex")
_pydantic = require("llama_index.core.bridge.pydantic", extra="llamaindex")

RETRIEVAL_SCORE_KEY = "retrieval_score"


class OnnxRankRerank(BaseNodePostprocessor):
    """Node postprocessor that reranks with an onnxrank model.

    Args:
        top_n: Nodes to return.
        model: An exported model name under `models_dir`, or a model directory.
        models_dir: Where model names are looked up.
        keep_retrieval_score: Copy each node's retrieval score into its metadata.
        reranker: A loaded Reranker (for engine options); then `model` only names it in events.

    Example:
        >>> postprocessor = OnnxRankRerank(top_n=2, model="minilm-standin")  # doctest: +SKIP
        >>> postprocessor.postprocess_nodes(nodes, query_str="wing flutter")  # doctest: +SKIP
    """

    model: str = _pydantic.Field(description="onnxrank model name or directory.")
    models_dir: str = _pydantic.Field(default=DEFAULT_MODELS_DIR,
                                      description="Where model names are looked up.")
    top_n: int = _pydantic.Field(default=2, ge=1, description="Number of nodes to return sorted by score.")
    keep_retrieval_score: bool = _pydantic.Field(
        default=False, description="Whether to keep the retrieval score in metadata.")
    _reranker: Any = _pydantic.PrivateAttr()

    def __init__(self, top_n: int = 2, model: str | None = None, models_dir: str | Path = DEFAULT_MODELS_DIR,
                 keep_retrieval_score: bool = False, reranker: Reranker | None = None) -> None:
        if reranker is None and model is None:
            raise ValueError("pass model='<exported model name or directory>' or "
                             "reranker=Reranker.from_pretrained(...)")
        if reranker is not None and not isinstance(reranker, Reranker):
            raise TypeError(f"reranker must be an onnxrank Reranker, got {type(reranker).__name__}")
        name = model if model is not None else str(reranker.model_dir)  # type: ignore[union-attr]
        super().__init__(top_n=top_n, model=name, models_dir=str(models_dir),  # type: ignore[call-arg]
                         keep_retrieval_score=keep_retrieval_score)
        self._reranker = reranker if reranker is not None else Reranker.from_pretrained(
            name, models_dir=models_dir)

    @classmethod
    def class_name(cls) -> str:
        return "OnnxRankRerank"

    @property
    def reranker(self) -> Reranker:
        """The onnxrank Reranker doing the scoring."""
        return self._reranker  # type: ignore[no-any-return]

    def _postprocess_nodes(self, nodes: list[Any], query_bundle: Any = None) -> list[Any]:
        if query_bundle is None:
            raise ValueError("Missing query bundle in extra info.")
        if not nodes:
            return []
        texts = [node.node.get_content(metadata_mode=_schema.MetadataMode.EMBED) for node in nodes]
        payload = _callbacks.EventPayload
        with self.callback_manager.event(
            _callbacks.CBEventType.RERANKING,
            payload={payload.NODES: nodes, payload.MODEL_NAME: self.model,
                     payload.QUERY_STR: query_bundle.query_str, payload.TOP_K: self.top_n},
        ) as event:
            ranked = self._reranker.rerank(query_bundle.query_str, texts, top_k=self.top_n)
            new_nodes = []
            for result in ranked:
                original = nodes[result.index]
                node = original.node
                if self.keep_retrieval_score:
                    node = node.model_copy(update={
                        "metadata": {**node.metadata, RETRIEVAL_SCORE_KEY: original.score}})
                new_nodes.append(_schema.NodeWithScore(node=node, score=result.score))
            event.on_end(payload={payload.NODES: new_nodes})
        return new_nodes
