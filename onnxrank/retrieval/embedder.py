"""ONNX sentence embedder: texts in, pooled and L2-normalised float32 vectors out."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tokenizers import Tokenizer

from onnxrank._optional import require
from onnxrank.engine.backends.base import DeviceInfo, ModelRunner
from onnxrank.engine.batching import plan_engine_batches
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.runtime import load_model, pad_rows
from onnxrank.engine.spec import ModelSpec
from onnxrank.engine.tokenize import EncodedRow
from onnxrank.errors import InferenceError

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


class Embedder:
    """Embeds texts with an exported embedding model (manifest task "embedding").

    The graph does the mean pooling and L2 normalisation, so cosine similarity is a dot product.
    Loading goes through the same runtime layer as the Reranker (hash check, backend and variant
    choice, fidelity records); of the engine options, device, backend, precision, threads,
    max_batch_tokens, max_batch_size and pad_to_multiple apply (the reranker's batch planning).

    Example:
        >>> embedder = Embedder.from_dir("models/minilm-embedder")  # doctest: +SKIP
        >>> embedder.embed(["hybrid retrieval"]).shape  # doctest: +SKIP
        (1, 384)
    """

    def __init__(self, spec: ModelSpec, model_dir: Path, runner: ModelRunner,
                 tokenizer: Tokenizer, config: EngineConfig) -> None:
        self.spec = spec
        self.model_dir = model_dir
        self.config = config
        self._runner = runner
        self._tokenizer = tokenizer

    @classmethod
    def from_dir(cls, path: str | Path, config: EngineConfig | None = None,
                 **overrides: Any) -> Embedder:
        """Load an exported embedding model directory.

        Args:
            path: Model directory with manifest.json, tokenizer.json and the ONNX variants.
            config: Engine settings; None = EngineConfig() defaults.
            **overrides: EngineConfig fields to change, e.g. ``precision="fp32"``.

        Returns:
            The loaded embedder.

        Raises:
            ModelLoadError: Missing or corrupted files, or the model is not an embedding model.
            ValueError: Bad settings, or max_batch_tokens below the model's max_length.
        """
        config = (config or EngineConfig()).with_overrides(**overrides)
        loaded = load_model(path, task="embedding", config=config)
        if config.max_batch_tokens < loaded.spec.max_length:
            raise ValueError(
                f"max_batch_tokens must be >= the model's max_length ({loaded.spec.max_length}), "
                f"got {config.max_batch_tokens}"
            )
        # load_model hands out a fresh Tokenizer with truncation off; this one is ours to set.
        loaded.tokenizer.enable_truncation(loaded.spec.max_length)
        return cls(loaded.spec, loaded.model_dir, loaded.runner, loaded.tokenizer, config)

    @property
    def dim(self) -> int:
        """Embedding size (from the manifest, else from one probe run)."""
        if self.spec.embedding_dim is not None:
            return int(self.spec.embedding_dim)
        return int(self.embed(["probe"]).shape[1])

    @property
    def device_info(self) -> DeviceInfo:
        """What runs the model (device, backend, variant, threads)."""
        return self._runner.info

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
        rows = [
            EncodedRow(np.asarray(encoding.ids, np.int64), np.asarray(encoding.type_ids, np.int64),
                       index)
            for index, encoding in enumerate(
                self._tokenizer.encode_batch(list(texts), add_special_tokens=True))
        ]
        token_counts = np.asarray([len(row.ids) for row in rows], dtype=np.int64)
        tokenized = time.perf_counter()
        batches = plan_engine_batches(token_counts.tolist(), self.config, self._runner)
        progress = None
        if show_progress:
            progress = require("tqdm.auto", extra="dense").tqdm(
                total=len(texts), desc="embedding", unit="text"
            )
        output: NDArray[np.float32] | None = None
        for batch in batches:
            feeds = pad_rows([rows[index] for index in batch.rows], self.spec.pad_token_id,
                             batch.padded_length)
            vectors = self._runner.run(feeds).astype(np.float32, copy=False)
            if not np.all(np.isfinite(vectors)):
                raise InferenceError(
                    f"embedding model {self.spec.name!r} produced non-finite values "
                    f"({self._runner.info.model_file})"
                )
            if output is None:
                output = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
            output[batch.rows] = vectors
            if progress is not None:
                progress.update(len(batch.rows))
        if progress is not None:
            progress.close()
        if output is None:
            raise InferenceError(f"embedding model {self.spec.name!r} produced no batches")
        return EmbedRun(vectors=output, token_counts=token_counts,
                        tokenize_ms=(tokenized - started) * 1000.0,
                        inference_ms=(time.perf_counter() - tokenized) * 1000.0,
                        batches=[(len(batch.rows), batch.padded_length) for batch in batches])
