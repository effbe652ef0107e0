"""ONNX sentence embedder: texts in, pooled and L2-normalised float32 vectors out."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from tokenizers import Tokenizer

from onnxrank._optional import require
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.execution import run_in_order
from onnxrank.engine.model import EngineModel
from onnxrank.engine.recipe import PromptRecipe
from onnxrank.engine.runtime import LoadedModel, probe_pairs
from onnxrank.engine.spec import ModelKind
from onnxrank.engine.text import TextEncoder

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EmbedRun:
    """Vectors of a list of texts and what producing them took.

    Attributes:
        vectors: float32 [len(texts), dim], rows L2-normalised (what `Embedder.embed` returns).
        token_counts: Tokens per text as the model saw them (special tokens included, truncated
            to max_length).
        tokenize_ms: Time spent tokenizing.
        inference_ms: Time spent in model runs (padding included).
        batches: (rows, padded length) of every model run, in run order.
    """

    vectors: NDArray[np.float32]
    token_counts: NDArray[np.int64]
    tokenize_ms: float = 0.0
    inference_ms: float = 0.0
    batches: list[tuple[int, int]] = field(default_factory=list)


class Embedder(EngineModel[str]):
    """Embeds texts with an exported embedding model (manifest task "embedding").

    The graph does the mean pooling and L2 normalisation, so cosine similarity is a dot product.
    Loading goes through the same runtime layer as the Reranker (``Embedder.from_dir(path,
    config=None, **overrides)``: hash check, backend and variant choice, fidelity records); of the
    engine options, device, backend, precision, threads, max_batch_tokens, max_batch_size and
    pad_to_multiple apply (the reranker's batch planning). Loading a model of another kind is a
    ModelLoadError; a max_batch_tokens below the model's max_length is a ValueError.

    Example:
        >>> embedder = Embedder.from_dir("models/minilm-embedder")  # doctest: +SKIP
        >>> embedder.embed(["hybrid retrieval"]).shape  # doctest: +SKIP
        (1, 384)
    """

    kind = ModelKind.EMBEDDER
    needs = "an embedding model exported with --task embedding, such as models/minilm-embedder"
    output_noun = "embedding value"
    item_noun = "text"

    @classmethod
    def _checked(cls, loaded: LoadedModel, config: EngineConfig) -> Embedder:
        if config.max_batch_tokens < loaded.spec.max_length:
            raise ValueError(
                f"max_batch_tokens must be >= the model's max_length ({loaded.spec.max_length}), "
                f"got {config.max_batch_tokens}"
            )
        encoder = cls.row_encoder(loaded.tokenizer, loaded.spec.max_length, loaded.spec.recipe)
        return cls(loaded.spec, loaded.model_dir, loaded.runner, encoder, loaded.tokenizer, config)

    @classmethod
    def row_encoder(cls, tokenizer: Tokenizer, max_length: int,
                    recipe: PromptRecipe | None) -> TextEncoder:
        """Single-text rows, special tokens included, cut at `max_length` (the manifest's)."""
        return TextEncoder(tokenizer, max_length)

    @classmethod
    def probe_items(cls) -> list[str]:
        return [passage for _, passage in probe_pairs()]

    def count_tokens(self, texts: Sequence[str], *, truncate: bool = True) -> list[int]:
        """Tokens per text as `embed` counts them (special tokens included; capped at max_length
        when `truncate`), without running the model: what a server checks before queueing."""
        return TextEncoder(self._tokenizer, self.max_length).count_tokens(texts, truncate=truncate)

    @property
    def dim(self) -> int:
        """Embedding size (from the manifest, else from one probe run)."""
        if self.spec.embedding_dim is not None:
            return int(self.spec.embedding_dim)
        return int(self.embed(["probe"]).shape[1])

    def embed(self, texts: Sequence[str], *, show_progress: bool = False) -> NDArray[np.float32]:
        """Embed texts, in input order.

        Args:
            texts: Texts to embed; each is truncated to the manifest's max_length tokens.
            show_progress: Show a tqdm progress bar over batches (for indexing).

        Returns:
            float32 array [len(texts), dim], rows L2-normalised.

        Raises:
            InferenceError: The runtime failed or the output is not finite.
        """
        return self.embed_detailed(texts, show_progress=show_progress).vectors

    def embed_detailed(self, texts: Sequence[str], *, show_progress: bool = False) -> EmbedRun:
        """`embed`, plus the token counts it tokenized, stage times and the batches that ran (for
        servers: usage counts without tokenizing twice).

        Raises:
            As for embed.
        """
        if len(texts) == 0:
            return EmbedRun(vectors=np.zeros((0, self.spec.embedding_dim or 0), dtype=np.float32),
                            token_counts=np.zeros(0, dtype=np.int64))
        started = time.perf_counter()
        rows = self._encoder.encode(texts)
        token_counts = np.asarray([len(row.ids) for row in rows], dtype=np.int64)
        tokenized = time.perf_counter()
        plan = self._plan(rows)
        progress = None
        if show_progress:
            progress = require("tqdm.auto", extra="dense").tqdm(
                total=len(texts), desc="embedding", unit="text"
            )
        try:
            vectors = run_in_order(plan, self._runner.run, finite=self._finite,
                                   on_batch=None if progress is None
                                   else lambda batch: progress.update(len(batch.rows)))
        finally:
            if progress is not None:
                progress.close()
        return EmbedRun(vectors=vectors, token_counts=token_counts,
                        tokenize_ms=(tokenized - started) * 1000.0,
                        inference_ms=(time.perf_counter() - tokenized) * 1000.0,
                        batches=[(len(batch.rows), batch.padded_length) for batch in plan.batches])
