"""ONNX sentence embedder: texts in, pooled and L2-normalised float32 vectors out."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from tokenizers import Tokenizer

from onnxrank.engine.batching import plan_batches
from onnxrank.engine.session import (
    DeviceInfo,
    OnnxModel,
    build_session,
    choose_variant,
    resolve_device,
)
from onnxrank.engine.spec import ModelSpec, load_model_spec, verify_files
from onnxrank.engine.tokenize import load_tokenizer
from onnxrank.errors import InferenceError, ModelLoadError
from onnxrank.types import Device

logger = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_TOKENS = 8192


class Embedder:
    """Embeds texts with an exported embedding model (manifest task "embedding").

    The graph does the mean pooling and L2 normalisation, so cosine similarity is a dot product.

    Example:
        >>> embedder = Embedder.from_dir("models/minilm-embedder")  # doctest: +SKIP
        >>> embedder.embed(["hybrid retrieval"]).shape  # doctest: +SKIP
        (1, 384)
    """

    def __init__(
        self,
        spec: ModelSpec,
        model: OnnxModel,
        tokenizer: Tokenizer,
        *,
        model_dir: Path,
        max_batch_tokens: int,
    ) -> None:
        self.spec = spec
        self.model_dir = model_dir
        self._model = model
        self._tokenizer = tokenizer
        self.max_batch_tokens = max_batch_tokens

    @classmethod
    def from_dir(
        cls,
        path: str | Path,
        *,
        device: Device | str = Device.AUTO,
        precision: str = "auto",
        threads: int | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
    ) -> Embedder:
        """Load an exported embedding model directory.

        Args:
            path: Model directory with manifest.json, tokenizer.json and the ONNX variants.
            device: "cpu", "cuda" or "auto".
            precision: "auto" (int8 on CPU when exported, else opt/fp32), or fp32, opt, int8, fp16.
            threads: Intra-op threads; None uses every CPU this process may use.
            max_batch_tokens: Padded tokens per batch, e.g. 8192 = 32 texts of 256 tokens.

        Returns:
            The loaded embedder.

        Raises:
            ModelLoadError: Missing or corrupted files, or the model is not an embedding model.
            ValueError: Bad device, precision, threads or max_batch_tokens.
        """
        directory = Path(path)
        spec = load_model_spec(directory)
        if spec.task != "embedding":
            raise ModelLoadError(
                f"model {spec.name!r} in {directory} has task {spec.task!r}, but an embedder needs "
                "task 'embedding'; pass an embedding model such as models/minilm-embedder "
                "(rerank models go to --model / Reranker)"
            )
        if max_batch_tokens < spec.max_length:
            raise ValueError(
                f"max_batch_tokens must be >= the model's max_length ({spec.max_length}), "
                f"got {max_batch_tokens}"
            )
        import onnxruntime as ort

        variant = choose_variant(spec, resolve_device(device, ort.get_available_providers()), precision)
        verify_files(spec, directory, [variant])
        model = build_session(spec, directory, device=device, precision=variant, threads=threads)
        tokenizer = load_tokenizer(spec, directory)
        # load_tokenizer hands out a fresh Tokenizer with truncation off; this one is ours to set.
        tokenizer.enable_truncation(spec.max_length)
        return cls(spec, model, tokenizer, model_dir=directory, max_batch_tokens=max_batch_tokens)

    @property
    def dim(self) -> int:
        """Embedding size (from the manifest, else from one probe run)."""
        if self.spec.embedding_dim is not None:
            return int(self.spec.embedding_dim)
        return int(self.embed(["probe"]).shape[1])

    @property
    def device_info(self) -> DeviceInfo:
        """What runs the model (device, provider, variant, threads)."""
        return self._model.info

    def embed(self, texts: Sequence[str], *, show_progress: bool = False) -> NDArray[np.float32]:
        """Embed texts, in input order.

        Args:
            texts: Texts to embed; each is truncated to the manifest's max_length tokens.
            show_progress: Show a tqdm progress bar over batches (for indexing).

        Returns:
            float32 array [len(texts), dim], rows L2-normalised.

        Raises:
            InferenceError: onnxruntime failed or the output is not finite.
        """
        if len(texts) == 0:
            return np.zeros((0, self.spec.embedding_dim or 0), dtype=np.float32)
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=True)
        lengths = [len(encoding.ids) for encoding in encodings]
        batches = plan_batches(lengths, max_batch_tokens=self.max_batch_tokens, max_batch_size=256)
        progress = None
        if show_progress:
            from onnxrank._optional import require

            progress = require("tqdm.auto", extra="dense").tqdm(
                total=len(texts), desc="embedding", unit="text"
            )
        output: NDArray[np.float32] | None = None
        for batch in batches:
            size = len(batch.rows)
            ids = np.full((size, batch.padded_length), self.spec.pad_token_id, dtype=np.int64)
            mask = np.zeros((size, batch.padded_length), dtype=np.int64)
            type_ids = np.zeros((size, batch.padded_length), dtype=np.int64)
            for slot, row in enumerate(batch.rows):
                encoding = encodings[row]
                length = len(encoding.ids)
                ids[slot, :length] = encoding.ids
                mask[slot, :length] = 1
                type_ids[slot, :length] = encoding.type_ids
            vectors = self._model.run(
                {"input_ids": ids, "attention_mask": mask, "token_type_ids": type_ids}
            ).astype(np.float32, copy=False)
            if not np.all(np.isfinite(vectors)):
                raise InferenceError(
                    f"embedding model {self.spec.name!r} produced non-finite values "
                    f"({self._model.info.model_file})"
                )
            if output is None:
                output = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
            output[batch.rows] = vectors
            if progress is not None:
                progress.update(size)
        if progress is not None:
            progress.close()
        if output is None:
            raise InferenceError(f"embedding model {self.spec.name!r} produced no batches")
        return output


def resolve_model_dir(name_or_path: str | Path, models_dir: str | Path = "models") -> Path:
    """Find a model directory: an existing path as given, else ``models_dir/name``.

    Raises:
        ModelLoadError: Neither exists.
    """
    candidate = Path(name_or_path)
    if candidate.is_dir():
        return candidate
    named = Path(models_dir) / str(name_or_path)
    if named.is_dir():
        return named
    raise ModelLoadError(
        f"no model directory {str(name_or_path)!r}: it is not a path and {named} does not exist; "
        f"export it with `onnxrank export --model {name_or_path} --out {named}` "
        "or pass --models-dir"
    )
