"""A drop-in for sentence-transformers' ``CrossEncoder.predict`` and ``CrossEncoder.rank`` on the engine.

Switching is one import line::

    # from sentence_transformers import CrossEncoder
    from onnxrank.integrations.sentence_transformers import CrossEncoder

    model = CrossEncoder("minilm-standin")            # an exported model name or directory
    scores = model.predict([("query", "doc one"), ("query", "doc two")])
    ranking = model.rank("query", ["doc one", "doc two"], top_k=1, return_documents=True)

The signatures, return types and shapes are those of sentence-transformers 6 (checked side by side
in tests/integrations/test_sentence_transformers.py):

1. ``predict(inputs, prompt_name, prompt, batch_size, show_progress_bar, activation_fn,
   apply_softmax, convert_to_numpy, convert_to_tensor, device, pool, chunk_size)``, positionally
   in that order as there. A list of pairs gives a float32 ndarray of shape (n,); one pair a numpy
   float32 scalar; ``[]`` an empty float64 ndarray (as sentence-transformers returns).
2. ``convert_to_tensor=True`` gives one torch tensor; ``convert_to_numpy=False`` a list of 0-d
   tensors (both need torch, which this module imports only then).
3. The default activation is the model's: the manifest's ``activation`` (``sigmoid``: the
   sigmoid; ``none``: the logits), the one source of truth the engine, the server and this class
   share. sentence-transformers 6 reads its default from the checkpoint's
   ``config_sentence_transformers.json`` (``activation_fn``; older checkpoints: config.json's
   ``sentence_transformers.activation_fn``), else sigmoid for one label; the export is what
   carries that into the manifest. ``activation_fn=`` (here or in the constructor, or set as the
   ``activation_fn`` attribute) overrides it: any callable is applied to the (n, 1) logits, a
   torch callable such as ``torch.nn.Identity()`` on a tensor, any other on a numpy array.
4. ``apply_softmax=True`` does what it does in sentence-transformers 6 on a one-label model:
   nothing (the softmax applies only to scores with more than one label).
5. ``prompt=`` / ``prompt_name=`` (with the constructor's ``prompts`` and
   ``default_prompt_name``) prepend the prompt to each pair's query, as sentence-transformers does.
6. ``rank(query, documents, top_k, return_documents, prompt_name, prompt, batch_size,
   show_progress_bar, activation_fn, device, pool, chunk_size)`` returns
   ``[{"corpus_id": int, "score": float[, "text": str]}]``, scores as Python floats, sorted by
   score (ties keep input order), cut to ``top_k``. Its older ``convert_to_numpy``,
   ``convert_to_tensor`` and ``apply_softmax`` arguments are accepted and ignored, as there.
7. The older spellings sentence-transformers 6 still takes: ``sentences=`` for ``inputs``,
   ``activation_fct=`` for ``activation_fn``, ``num_workers=`` (ignored), and
   ``default_activation_function=`` in the constructor.

What differs: batching is the engine's (token-budget planner; ``batch_size`` is checked and sizes
the progress bar's steps only; ``show_progress_bar=None`` is off); the model is an onnxrank export,
not a Hub checkpoint, so the constructor takes engine options instead of the loading options of
sentence-transformers (``trust_remote_code``, ``backend``, ``model_kwargs``, ... raise TypeError);
``device=`` in predict/rank must name the device the model was loaded on (an export cannot move),
and multi-process inference (a device list, ``pool=``) is not there; extra keyword arguments that
sentence-transformers hands to its model's preprocess/forward raise TypeError.
No extra is needed; torch only for tensor outputs.
"""

from __future__ import annotations

import logging
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from onnxrank._optional import require
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.reranker import Reranker
from onnxrank.engine.runtime import DEFAULT_MODELS_DIR

logger = logging.getLogger(__name__)

# the older keyword arguments sentence-transformers 6 still accepts (its
# cross_encoder_predict_rank_args_decorator): renamed ones, and ones it drops with a warning
_RENAMED = {"sentences": "inputs", "activation_fct": "activation_fn"}
_DROPPED = {"predict": ("num_workers",),
            "rank": ("num_workers", "convert_to_numpy", "convert_to_tensor", "apply_softmax")}


class CrossEncoder:
    """sentence-transformers' CrossEncoder interface (predict, rank) backed by an onnxrank Reranker.

    Args:
        model_name_or_path: An exported model name under `models_dir`, or a model directory.
        models_dir: Where model names are looked up.
        device: "cpu", "cuda" (or "cuda:N", run on the default CUDA device) or None (auto).
        prompts: Prompt name -> text prepended to every pair's query (``prompt_name=``).
        default_prompt_name: The prompt applied when predict/rank name none; None: no prompt.
        max_length: Tokens per (query, document) row; None uses the manifest's.
        activation_fn: Default activation for predict/rank; None uses the model's own (the
            manifest's). ``default_activation_function=`` is its older name.
        config: Engine settings; overrides (e.g. ``precision="fp32"``, ``threads=2``) apply on top.
        **overrides: EngineConfig fields.

    Raises:
        ModelLoadError: No exported model under that name or path.
        TypeError: An override that is no engine option.
        ValueError: A default_prompt_name that is not in `prompts`.
    """

    def __init__(self, model_name_or_path: str | Path, *, models_dir: str | Path = DEFAULT_MODELS_DIR,
                 device: str | None = None, prompts: dict[str, str] | None = None,
                 default_prompt_name: str | None = None, max_length: int | None = None,
                 activation_fn: Callable[..., Any] | None = None,
                 config: EngineConfig | None = None, **overrides: Any) -> None:
        if "default_activation_function" in overrides:
            older = overrides.pop("default_activation_function")
            logger.warning("The CrossEncoder `default_activation_function` argument was renamed; "
                           "use `activation_fn`")
            activation_fn = activation_fn if activation_fn is not None else older
        self.prompts = {name: text if text is not None else "" for name, text in (prompts or {}).items()}
        if default_prompt_name is not None and default_prompt_name not in self.prompts:
            raise ValueError(f"Default prompt name '{default_prompt_name}' not found in the configured "
                             f"prompts dictionary with keys {list(self.prompts)!r}.")
        self.default_prompt_name = default_prompt_name
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
    def max_seq_length(self) -> int:
        """Tokens per (query, document) row."""
        return int(self.reranker.config.max_length or self.reranker.spec.max_length)

    @property
    def max_length(self) -> int:
        """Deprecated alias of `max_seq_length`, as in sentence-transformers 6."""
        warnings.warn("The `max_length` property was renamed and is now deprecated. Please use "
                      "`max_seq_length` instead.", DeprecationWarning, stacklevel=2)
        return self.max_seq_length

    def predict(
        self,
        inputs: Sequence[Any] | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        activation_fn: Callable[..., Any] | None = None,
        apply_softmax: bool | None = False,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
        device: Any = None,
        pool: dict[str, Any] | None = None,
        chunk_size: int | None = None,
        **kwargs: Any,
    ) -> Any:
        """Scores for (query, document) pairs, shaped as sentence-transformers' CrossEncoder.predict.

        Args:
            inputs: A list of (query, document) pairs, or one pair (``sentences=``: older name).
            prompt_name: A key of the constructor's `prompts`: its text goes before each query.
            prompt: A prompt text put before each query (wins over `prompt_name`).
            batch_size: Must be positive; the engine plans its own batches, this only sets how
                many pairs each progress-bar step scores.
            show_progress_bar: A tqdm bar over steps of `batch_size` pairs (None: off).
            activation_fn: Applied to the (n, 1) logits; None: the default activation
                (``activation_fct=``: older name).
            apply_softmax: As in sentence-transformers 6: no effect on a one-label model.
            convert_to_numpy: False returns a list of 0-d torch tensors.
            convert_to_tensor: True returns one torch tensor (wins over convert_to_numpy).
            device: None, or the device the model runs on ("cpu", "cuda", "cuda:0", a
                torch.device).
            pool: Must be None (no multi-process inference).
            chunk_size: Unused (sentence-transformers reads it only with a pool).

        Returns:
            ndarray (n,), a numpy scalar for one pair, a tensor, or a list of tensors (see above).

        Raises:
            TypeError: Both or neither of `inputs` and `sentences`; pairs that are not two str;
                a keyword argument sentence-transformers would hand to its model.
            ValueError: batch_size < 1, an empty query, an unknown prompt_name, another device
                than the model's, a device list or a pool.
        """
        older = _older_arguments("predict", kwargs)
        if "activation_fn" in older and activation_fn is None:
            activation_fn = older["activation_fn"]
        if inputs is not None and "inputs" in older:
            raise TypeError("predict() takes the pairs as `inputs` (or the older `sentences`), "
                            "exactly one of them")
        pairs: Any = inputs if inputs is not None else older.get("inputs")
        if pairs is None:
            raise TypeError("predict() takes the pairs as `inputs` (or the older `sentences`), "
                            "exactly one of them")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}.")
        self._check_device(device, pool)
        singular = _is_single_pair(pairs)
        pair_list = [tuple(pairs)] if singular else [tuple(pair) for pair in pairs]
        text = self._resolve_prompt(prompt, prompt_name)
        if text:
            pair_list = [(text + pair[0], *pair[1:]) if pair and isinstance(pair[0], str) else pair
                         for pair in pair_list]
        logits = self._logits(pair_list, batch_size=batch_size, show_progress=bool(show_progress_bar))
        # apply_softmax: sentence-transformers 6 applies its softmax only to scores that keep a
        # label axis after the one-label squeeze, so on this (n,) output it does nothing
        values = self._activate(logits, activation_fn if activation_fn is not None
                                else self.activation_fn)
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
        prompt_name: str | None = None,
        prompt: str | None = None,
        batch_size: int = 32,
        show_progress_bar: bool | None = None,
        activation_fn: Callable[..., Any] | None = None,
        device: Any = None,
        pool: dict[str, Any] | None = None,
        chunk_size: int | None = None,
        **kwargs: Any,
    ) -> list[dict[Literal["corpus_id", "score", "text"], int | float | str]]:
        """Documents ranked for a query, shaped as sentence-transformers' CrossEncoder.rank.

        Returns:
            ``[{"corpus_id": index, "score": score[, "text": document]}]``, best first (ties in
            input order), at most `top_k` entries; scores are Python floats.

        Raises:
            As for predict.
        """
        older = _older_arguments("rank", kwargs)
        if "inputs" in older:
            raise TypeError("rank() got an unexpected keyword argument 'sentences'")
        if "activation_fn" in older and activation_fn is None:
            activation_fn = older["activation_fn"]
        scores = self.predict([(query, document) for document in documents], prompt_name=prompt_name,
                              prompt=prompt, batch_size=batch_size,
                              show_progress_bar=show_progress_bar, activation_fn=activation_fn,
                              device=device, pool=pool, chunk_size=chunk_size)
        results: list[dict[Literal["corpus_id", "score", "text"], int | float | str]] = []
        for index, score in enumerate(scores.tolist()):  # Python floats, as there
            results.append({"corpus_id": index, "score": score})
            if return_documents:
                results[-1]["text"] = documents[index]
        # sorted() is stable, so equal scores keep input order, as in sentence-transformers
        results = sorted(results, key=lambda result: result["score"], reverse=True)
        return results[:top_k]

    def _resolve_prompt(self, prompt: str | None, prompt_name: str | None) -> str | None:
        """sentence-transformers' rule: `prompt`, else `prompt_name`'s, else the default's."""
        if prompt is not None:
            if prompt_name is not None:
                logger.warning("Provide either a `prompt`, a `prompt_name`, or neither, but not "
                               "both. Ignoring the `prompt_name` in favor of `prompt`.")
            return prompt
        if prompt_name is not None:
            if prompt_name not in self.prompts:
                raise ValueError(f"Prompt name '{prompt_name}' not found in the configured prompts "
                                 f"dictionary with keys {list(self.prompts)!r}.")
            return self.prompts[prompt_name]
        if self.default_prompt_name is not None:
            return self.prompts.get(self.default_prompt_name)
        return None

    def _check_device(self, device: Any, pool: dict[str, Any] | None) -> None:
        if pool is not None or isinstance(device, (list, tuple)):
            raise ValueError("multi-process inference (a device list or pool=) is not supported: "
                             "the engine runs in this process and plans its own batches")
        if device is None:
            return
        running = self.reranker.device_info.device
        if str(device).split(":", 1)[0] != running:
            raise ValueError(f"this model was loaded on {running} and an onnxrank model cannot "
                             f"move: load it with CrossEncoder(..., device={str(device)!r}) instead "
                             f"of passing device={str(device)!r} to predict/rank")

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


def _older_arguments(method: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The older keyword arguments sentence-transformers 6 still takes, under their new names;
    TypeError for any other (sentence-transformers hands those to its model's preprocess and
    forward, which an onnxrank export does not have)."""
    renamed: dict[str, Any] = {}
    for name in list(kwargs):
        if name in _RENAMED:
            logger.warning("The `%s` argument was renamed and is now deprecated. Please use `%s` "
                           "instead.", name, _RENAMED[name])
            renamed[_RENAMED[name]] = kwargs.pop(name)
        elif name in _DROPPED[method]:
            logger.warning("The CrossEncoder.%s `%s` argument is deprecated and has no effect.",
                           method, name)
            kwargs.pop(name)
    if kwargs:
        raise TypeError(f"{method}() got unexpected keyword arguments {sorted(kwargs)}: "
                        "sentence-transformers hands them to its model's preprocess/forward, "
                        "which an onnxrank export does not have")
    return renamed


def _is_single_pair(inputs: Any) -> bool:
    """sentence-transformers' rule: a list/tuple whose first element is not itself a list/tuple."""
    if isinstance(inputs, (list, tuple)):
        return len(inputs) > 0 and not isinstance(inputs[0], (list, tuple))
    if isinstance(inputs, np.ndarray) and inputs.dtype.kind in ("U", "O"):
        return inputs.size > 0 and inputs.ndim < 2
    return True
