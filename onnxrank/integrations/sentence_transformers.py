"""A drop-in for sentence-transformers' ``CrossEncoder.predict`` and ``CrossEncoder.rank`` on the engine.

Switching is one import line::

    # from sentence_transformers import CrossEncoder
    from onnxrank.integrations.sentence_transformers import CrossEncoder

    model = CrossEncoder("minilm-standin")            # an exported model name or directory
    scores = model.predict([("query", "doc one"), ("query", "doc two")])
    ranking = model.rank("query", ["doc one", "doc two"], top_k=1, return_documents=True)

The return shapes are those of sentence-transformers 5 (checked side by side in
tests/integrations/test_sentence_transformers.py):

1. ``predict(list of pairs)`` -> float32 ndarray of shape (n,); ``predict(one pair)`` -> a numpy
   float32 scalar; ``predict([])`` -> an empty float64 ndarray (as sentence-transformers returns).
2. ``convert_to_tensor=True`` -> one torch tensor; ``convert_to_numpy=False`` -> a list of 0-d
   tensors (both need torch, which this module imports only then).
3. ``activation_fn=None`` applies the model's activation (the manifest's, sigmoid for
   cross-encoders, like sentence-transformers' default for one label); any callable is applied to
   the (n, 1) logits, a ``torch.nn.Module`` such as ``torch.nn.Identity()`` on a tensor.
4. ``apply_softmax=True`` behaves as in sentence-transformers: a softmax over the single label, so
   every score is 1.0.
5. ``rank`` returns ``[{"corpus_id", "score"[, "text"]}]`` sorted by score (ties keep input
   order), cut to ``top_k``.

What differs: batching is the engine's (token-budget planner; ``batch_size`` is checked and sizes
the progress bar's steps only), and the model is an onnxrank export, not a Hub checkpoint.
No extra is needed; torch only for tensor outputs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from onnxrank._optional import require
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.reranker import Reranker
from onnxrank.engine.runtime import DEFAULT_MODELS_DIR


class CrossEncoder:
    """sentence-transformers' CrossEncoder interface (predict, rank) backed by an onnxrank Reranker.

    Args:
        model_name_or_path: An exported model name under `models_dir`, or a model directory.
        models_dir: Where model names are looked up.
        device: "cpu", "cuda" (or "cuda:N", run on the default CUDA device) or None (auto).
        max_length: Tokens per (query, document) row; None uses the manifest's.
        activation_fn: Default activation for predict/rank; None uses the model's own.
        config: Engine settings; overrides (e.g. ``precision="fp32"``, ``threads=2``) apply on top.
        **overrides: EngineConfig fields.

    Raises:
        ModelLoadError: No exported model under that name or path.
        TypeError: An override that is no engine option.
    """

    def __init__(self, model_name_or_path: str | Path, *, models_dir: str | Path = DEFAULT_MODELS_DIR,
                 device: str | None = None, max_length: int | None = None,
                 activation_fn: Callable[..., Any] | None = None,
                 config: EngineConfig | None = None, **overrides: Any) -> None:
        if device is not None:
            overrides["device"] = device.split(":", 1)[0]
        if max_length is not None:
            overrides["max_length"] = max_length
        self.reranker = Reranker.from_pretrained(model_name_or_path, models_dir=models_dir,
                                                 config=config, **overrides)
        self.activation_fn = activation_fn

    @property
    def num_labels(self) -> int:
        """Always 1: onnxrank loads only single-logit cross-encoders."""
        return 1

    @property
    def max_length(self) -> int:
        """Tokens per (query, document) row."""
        return int(self.reranker.config.max_length or self.reranker.spec.max_length)

    def predict(
        self,
        inputs: Sequence[Any] | None = None,
        *,
        sentences: Sequence[Any] | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        activation_fn: Callable[..., Any] | None = None,
        apply_softmax: bool | None = False,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
    ) -> Any:
        """Scores for (query, document) pairs, shaped as sentence-transformers' CrossEncoder.predict.

        Args:
            inputs: A list of (query, document) pairs, or one pair.
            sentences: The pre-v4 name of `inputs`.
            batch_size: Must be positive; the engine plans its own batches, this only sets how
                many pairs each progress-bar step scores.
            show_progress_bar: A tqdm bar over steps of `batch_size` pairs (None: off).
            activation_fn: Applied to the (n, 1) logits; None: the default activation.
            apply_softmax: As in sentence-transformers (with one label every score becomes 1.0).
            convert_to_numpy: False returns a list of 0-d torch tensors.
            convert_to_tensor: True returns one torch tensor (wins over convert_to_numpy).

        Returns:
            ndarray (n,), a numpy scalar for one pair, a tensor, or a list of tensors (see above).

        Raises:
            TypeError: Both or neither of `inputs` and `sentences`; pairs that are not two str.
            ValueError: batch_size < 1 or an empty query.
        """
        if (inputs is None) == (sentences is None):
            raise TypeError("predict() takes the pairs as `inputs` (or the older `sentences`), "
                            "exactly one of them")
        pairs: Any = inputs if inputs is not None else sentences
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}.")
        singular = _is_single_pair(pairs)
        pair_list = [tuple(pairs)] if singular else [tuple(pair) for pair in pairs]
        logits = self._logits(pair_list, batch_size=batch_size, show_progress=bool(show_progress_bar))
        values = self._activate(logits, activation_fn or self.activation_fn)
        if apply_softmax:
            # sentence-transformers applies its softmax to the (n, 1) scores before squeezing them,
            # over one label: every score is exp(s) / exp(s) = 1.
            values = np.ones_like(values)
        if convert_to_tensor:
            torch = require("torch", extra="export")
            result: Any = torch.from_numpy(values.copy()) if len(values) else torch.tensor([])
        elif convert_to_numpy:
            # sentence-transformers builds the array from per-pair values: [] becomes float64
            result = values if len(values) else np.asarray([])
        else:
            torch = require("torch", extra="export")
            result = [torch.tensor(value) for value in values]
        return result[0] if singular else result

    def rank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: int | None = None,
        return_documents: bool = False,
        *,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        activation_fn: Callable[..., Any] | None = None,
        apply_softmax: bool | None = False,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
    ) -> list[dict[str, Any]]:
        """Documents ranked for a query, shaped as sentence-transformers' CrossEncoder.rank.

        Returns:
            ``[{"corpus_id": index, "score": score[, "text": document]}]``, best first (ties in
            input order), at most `top_k` entries.

        Raises:
            As for predict.
        """
        scores = self.predict([(query, document) for document in documents], batch_size=batch_size,
                              show_progress_bar=show_progress_bar, activation_fn=activation_fn,
                              apply_softmax=apply_softmax, convert_to_numpy=convert_to_numpy,
                              convert_to_tensor=convert_to_tensor)
        results: list[dict[str, Any]] = []
        for index, score in enumerate(scores):
            results.append({"corpus_id": index, "score": score})
            if return_documents:
                results[-1]["text"] = documents[index]
        # sorted() is stable, so equal scores keep input order, as in sentence-transformers
        results = sorted(results, key=lambda result: result["score"], reverse=True)
        return results[:top_k]

    def _logits(self, pairs: list[tuple[Any, ...]], *, batch_size: int,
                show_progress: bool) -> NDArray[np.float32]:
        if not show_progress:
            return self.reranker.score(pairs)
        tqdm = require("tqdm", extra="score").tqdm
        logits = np.zeros(len(pairs), dtype=np.float32)
        for start in tqdm(range(0, len(pairs), batch_size), desc="Batches"):
            logits[start:start + batch_size] = self.reranker.score(pairs[start:start + batch_size])
        return logits

    def _activate(self, logits: NDArray[np.float32],
                  activation_fn: Callable[..., Any] | None) -> NDArray[np.float32]:
        if activation_fn is None:
            return self.reranker.activate(logits).astype(np.float32)
        column = logits.reshape(-1, 1)
        torch = sys.modules.get("torch")  # a torch callable means torch is already imported
        if torch is not None and (isinstance(activation_fn, torch.nn.Module)
                                  or getattr(activation_fn, "__module__", "").startswith("torch")):
            with torch.inference_mode():
                output = activation_fn(torch.from_numpy(column.copy())).numpy()
        else:
            output = np.asarray(activation_fn(column))
        return np.asarray(output, dtype=np.float32).reshape(len(logits))


def _is_single_pair(inputs: Any) -> bool:
    """sentence-transformers' rule: a list/tuple whose first element is not itself a list/tuple."""
    if isinstance(inputs, (list, tuple)):
        return len(inputs) > 0 and not isinstance(inputs[0], (list, tuple))
    if isinstance(inputs, np.ndarray) and inputs.dtype.kind in ("U", "O"):
        return inputs.size > 0 and inputs.ndim < 2
    return True
