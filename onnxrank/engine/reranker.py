"""The Reranker: wires tokenization, batch planning, the onnxruntime session and post-processing."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Literal

import numpy as np

from onnxrank.engine.batching import Batch, plan_batches, run_overhead_tokens
from onnxrank.engine.session import (
    OPENVINO_PROVIDER,
    CpuProvider,
    DeviceInfo,
    OnnxModel,
    build_session,
)
from onnxrank.engine.spec import ModelSpec, load_model_spec
from onnxrank.engine.tokenize import EncodedRow, PairEncoder, load_tokenizer
from onnxrank.errors import InferenceError, ModelLoadError
from onnxrank.types import Device, Pair, Scores

logger = logging.getLogger(__name__)

LongDocuments = Literal["truncate", "max_chunk"]
OnError = Literal["raise", "fallback"]
ScoreActivation = Literal["sigmoid", "none"]

DEFAULT_MAX_BATCH_TOKENS = 8192
DEFAULT_MAX_BATCH_SIZE = 64
DEFAULT_PAD_TO_MULTIPLE = 8
DEFAULT_WINDOW_OVERLAP_TOKENS = 64
# OpenVINO runs only if it reproduces onnxruntime's own fp32 scores on the first shipped
# validation pairs within this many logits (both run the same fp32 graph).
OPENVINO_GATE_PAIRS = 16
OPENVINO_GATE_MAX_ABS_DIFF = 1e-3


@dataclass(frozen=True, slots=True)
class RankedDocument:
    """One reranked document.

    Attributes:
        index: Position of the document in the input list.
        score: Relevance score (after the activation), or the retrieval-order placeholder NaN
            when `reranked` is False.
        text: The document text.
        reranked: False when the document kept its retrieval position unscored (deadline
            reached or fallback after an error).
        span: With ``long_documents="max_chunk"``, the character span [start, end) of the window
            that earned the score; None otherwise.
    """

    index: int
    score: float
    text: str
    reranked: bool = True
    span: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Every engine setting, built once by Reranker.from_dir and passed down.

    Attributes:
        device: cpu, cuda or auto.
        cpu_provider: On CPU: "auto" (OpenVINO EP when installed, usable and within the
            fidelity gate, else onnxruntime's CPU EP), "openvino", or "default" (always the CPU EP).
        precision: auto, fp32, opt, int8 or fp16 (which exported variant to run).
        threads: Intra-op threads; None uses the CPUs this process may use.
        max_batch_tokens: Padded tokens per batch (rows × padded length). 8192 holds 16 pairs
            of 512 tokens or 85 pairs of 96 tokens (then capped by max_batch_size).
        max_batch_size: Rows per batch, whatever their length.
        max_length: Tokens per row; None uses the manifest's max_length (cannot exceed it).
        sort_by_length: Sort rows by length before cutting batches (less padding).
        pad_to_multiple: Round each batch's padded length up to a multiple of this.
        long_documents: "truncate" scores the first window; "max_chunk" scores every window
            and keeps the best.
        window_tokens: Document tokens per window in max_chunk mode; None fills the row.
        window_overlap_tokens: Tokens shared by consecutive windows in max_chunk mode.
        cache_size: Entries in the LRU score cache; 0 disables it.
    """

    device: Device | str = Device.AUTO
    cpu_provider: CpuProvider = "auto"
    precision: str = "auto"
    threads: int | None = None
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_length: int | None = None
    sort_by_length: bool = True
    pad_to_multiple: int = DEFAULT_PAD_TO_MULTIPLE
    long_documents: LongDocuments = "truncate"
    window_tokens: int | None = None
    window_overlap_tokens: int = DEFAULT_WINDOW_OVERLAP_TOKENS
    cache_size: int = 0

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_batch_size", "pad_to_multiple"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.long_documents not in ("truncate", "max_chunk"):
            raise ValueError(
                f"long_documents must be 'truncate' or 'max_chunk', got {self.long_documents!r}"
            )
        if self.window_tokens is not None and self.window_tokens < 8:
            raise ValueError(f"window_tokens must be >= 8 or None, got {self.window_tokens!r}")
        if self.window_overlap_tokens < 0:
            raise ValueError(
                f"window_overlap_tokens must be >= 0, got {self.window_overlap_tokens!r}"
            )
        if self.cache_size < 0:
            raise ValueError(f"cache_size must be >= 0, got {self.cache_size!r}")


def fallback_ranking(documents: Sequence[str], *, top_k: int | None = None) -> list[RankedDocument]:
    """Documents in their retrieval order, unscored (``reranked=False``, score NaN).

    This is the graceful-degradation path for retrieval pipelines: use it when the model failed
    to load (catch ModelLoadError), and ``rerank(..., on_error="fallback")`` uses it when a batch
    fails.
    """
    ranked = [
        RankedDocument(index=index, score=math.nan, text=text, reranked=False)
        for index, text in enumerate(documents)
    ]
    return ranked if top_k is None else ranked[:top_k]


class _ScoreCache:
    """Thread-safe LRU of (score, span) keyed by model, settings, query and document."""

    def __init__(self, capacity: int, model_key: str) -> None:
        self.capacity = capacity
        self._model_key = model_key
        self._entries: OrderedDict[str, tuple[float, tuple[int, int] | None]] = OrderedDict()
        self._lock = threading.Lock()

    def key(self, query: str, document: str) -> str:
        # Length-prefixed fields: ("ab", "c") and ("a", "bc") must not collide.
        return "".join(
            f"{len(field)}:{field}" for field in (self._model_key, query, document)
        )

    def get(self, key: str) -> tuple[float, tuple[int, int] | None] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: str, value: tuple[float, tuple[int, int] | None]) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class Reranker:
    """Scores (query, document) pairs with an exported cross-encoder.

    Example:
        >>> reranker = Reranker.from_dir("models/minilm-standin", device="cpu")  # doctest: +SKIP
        >>> ranked = reranker.rerank("what is a wing flutter", ["doc one", "doc two"], top_k=1)
        >>> ranked[0].index  # doctest: +SKIP
        1
    """

    def __init__(
        self, spec: ModelSpec, model_dir: Path, model: OnnxModel, encoder: PairEncoder,
        config: EngineConfig,
    ) -> None:
        self.spec = spec
        self.model_dir = model_dir
        self.config = config
        self._model = model
        self._encoder = encoder
        self._cache = (
            _ScoreCache(config.cache_size, self._cache_model_key()) if config.cache_size else None
        )

    @classmethod
    def from_dir(
        cls,
        path: str | Path,
        *,
        device: Device | str = Device.AUTO,
        cpu_provider: CpuProvider = "auto",
        precision: str = "auto",
        threads: int | None = None,
        max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS,
        max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
        max_length: int | None = None,
        sort_by_length: bool = True,
        pad_to_multiple: int = DEFAULT_PAD_TO_MULTIPLE,
        long_documents: LongDocuments = "truncate",
        window_tokens: int | None = None,
        window_overlap_tokens: int = DEFAULT_WINDOW_OVERLAP_TOKENS,
        cache_size: int = 0,
    ) -> Reranker:
        """Load an exported model directory (see onnxrank.engine.spec) and build its session.

        Args:
            path: Directory written by `onnxrank export`.
            device: "cpu", "cuda" or "auto" (CUDA when a working CUDA provider exists).
            cpu_provider: "auto" (OpenVINO EP when installed and it passes a fidelity check
                against onnxruntime's fp32 scores at load, else the CPU EP), "openvino" or
                "default" (force onnxruntime's CPUExecutionProvider).
            precision: "auto" (int8 on CPU, fp16 on CUDA, falling back to fp32-optimized and
                fp32), or one of "fp32", "opt", "int8", "fp16".
            threads: Intra-op threads; None uses the CPUs this process may run on.
            max_batch_tokens: Padded-token budget per batch (rows × padded length).
            max_batch_size: Row cap per batch.
            max_length: Tokens per (query, document) row; at most the manifest's max_length.
            sort_by_length: Sort rows by length before batching.
            pad_to_multiple: Round each batch's padded length up to this multiple.
            long_documents: "truncate" or "max_chunk" (best window, its span in RankedDocument.span).
            window_tokens: Document tokens per window for "max_chunk"; None fills the row.
            window_overlap_tokens: Overlap between consecutive windows for "max_chunk".
            cache_size: LRU score-cache entries; 0 disables the cache.

        Returns:
            A ready Reranker.

        Raises:
            ModelLoadError: Missing/unreadable files, manifest hash mismatch, a tokenizer that
                does not match the model, or an embedding model.
            DeviceUnavailableError: device="cuda" without a working CUDA provider.
            ValueError: A setting is out of range.
        """
        config = EngineConfig(
            device=device,
            cpu_provider=cpu_provider,
            precision=precision,
            threads=threads,
            max_batch_tokens=max_batch_tokens,
            max_batch_size=max_batch_size,
            max_length=max_length,
            sort_by_length=sort_by_length,
            pad_to_multiple=pad_to_multiple,
            long_documents=long_documents,
            window_tokens=window_tokens,
            window_overlap_tokens=window_overlap_tokens,
            cache_size=cache_size,
        )
        model_dir = Path(path)
        spec = load_model_spec(model_dir)
        if spec.task != "rerank":
            raise ModelLoadError(
                f"{model_dir} holds a {spec.task!r} model; Reranker needs a cross-encoder "
                "exported with --task rerank"
            )
        if spec.num_labels != 1:
            raise ModelLoadError(
                f"{model_dir} has num_labels={spec.num_labels}; Reranker needs one relevance logit"
            )
        if not spec.relevance_trained:
            logger.warning(
                "%s is not relevance-trained (manifest relevance_trained=false): its scores are "
                "not relevance scores; use it for speed measurements only", model_dir,
            )
        max_length = config.max_length or spec.max_length
        if max_length > spec.max_length:
            raise ValueError(
                f"max_length={max_length} exceeds the model's max_length={spec.max_length} "
                f"({model_dir / 'manifest.json'})"
            )
        if config.max_batch_tokens < max_length:
            raise ValueError(
                f"max_batch_tokens={config.max_batch_tokens} must be >= max_length={max_length} "
                "so that one full-length row fits in a batch"
            )
        config = replace(config, max_length=max_length)
        model = build_session(
            spec, model_dir, device=config.device, precision=config.precision,
            threads=config.threads, cpu_provider=config.cpu_provider,
        )
        encoder = PairEncoder(load_tokenizer(spec, model_dir), max_length)
        if model.info.provider == OPENVINO_PROVIDER and config.cpu_provider == "auto":
            model = _gate_openvino(spec, model_dir, model, encoder, config)
        return cls(spec, model_dir, model, encoder, config)

    @classmethod
    def from_pretrained(
        cls, name: str | Path, *, models_dir: str | Path = "models", **options: object
    ) -> Reranker:
        """Load ``models_dir/name`` (or `name` itself when it is a directory); options as from_dir.

        Raises:
            ModelLoadError: Neither location holds a model directory.
        """
        for candidate in (Path(models_dir) / name, Path(name)):
            if (candidate / "manifest.json").is_file():
                return cls.from_dir(candidate, **options)  # type: ignore[arg-type]
        raise ModelLoadError(
            f"no exported model named {str(name)!r} in {Path(models_dir).resolve()} and no model "
            f"directory at {Path(name).resolve()}; export one with "
            f"`onnxrank export --model ... --out {Path(models_dir) / name}`"
        )

    @property
    def device_info(self) -> DeviceInfo:
        """The provider, variant file, onnxruntime version and threads actually running."""
        return self._model.info

    def score(self, pairs: Sequence[Pair]) -> Scores:
        """Raw logits for (query, document) pairs, in input order.

        Raises:
            TypeError: `pairs` is not a sequence of (str, str).
            ValueError: An empty query.
            InferenceError: onnxruntime failed or returned NaN/inf.
        """
        pairs = _check_pairs(pairs)
        scores, _ = self._score_pairs(pairs)
        return scores

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        *,
        top_k: int | None = None,
        activation: ScoreActivation = "sigmoid",
        deadline_ms: float | None = None,
        on_error: OnError = "raise",
    ) -> list[RankedDocument]:
        """Rank documents for a query, best first (ties keep input order).

        Args:
            query: Non-empty query text.
            documents: Candidate texts; empty strings are scored like any other.
            top_k: Keep only the best k; None keeps all.
            activation: "sigmoid" maps logits to (0, 1); "none" keeps raw logits.
            deadline_ms: Score in input (retrieval) order, batch by batch, until this budget is
                spent; unscored documents follow in input order with ``reranked=False``. Overshoots
                by at most one batch.
            on_error: "fallback" logs an inference error and returns the retrieval order with
                ``reranked=False`` instead of raising.

        Returns:
            RankedDocument list, best first.

        Raises:
            ValueError: Empty query or bad option.
            TypeError: Documents not a list of str (names the bad element's index and type).
            InferenceError: Inference failed (only with on_error="raise").
        """
        _check_query(query)
        documents = _check_documents(documents)
        _check_rank_options(top_k, activation, deadline_ms, on_error)
        if not documents:
            return []
        pairs = [(query, document) for document in documents]
        try:
            if deadline_ms is None:
                scores, spans = self._score_pairs(pairs)
                scored = np.ones(len(pairs), dtype=bool)
            else:
                scores, spans, scored = self._score_until(pairs, deadline_ms)
        except InferenceError:
            if on_error == "raise":
                raise
            logger.exception("reranking failed; returning %d documents in retrieval order",
                             len(documents))
            return fallback_ranking(documents, top_k=top_k)
        return _rank(documents, scores, spans, scored, top_k=top_k, activation=activation)

    def rerank_many(
        self,
        requests: Sequence[tuple[str, Sequence[str]]],
        *,
        top_k: int | None = None,
        activation: ScoreActivation = "sigmoid",
    ) -> list[list[RankedDocument]]:
        """Rerank several (query, documents) requests in one pass; their pairs share batches.

        Returns:
            One ranked list per request, in request order.

        Raises:
            ValueError, TypeError, InferenceError: As for rerank.
        """
        _check_rank_options(top_k, activation, None, "raise")
        checked = []
        for query, documents in requests:
            _check_query(query)
            checked.append((query, _check_documents(documents)))
        pairs = [(query, document) for query, documents in checked for document in documents]
        scores, spans = self._score_pairs(pairs) if pairs else (np.zeros(0, np.float32), [])
        results, start = [], 0
        for _, documents in checked:
            stop = start + len(documents)
            results.append(
                _rank(documents, scores[start:stop], spans[start:stop],
                      np.ones(len(documents), dtype=bool), top_k=top_k, activation=activation)
                if documents else []
            )
            start = stop
        return results

    # --- stages -------------------------------------------------------------------------------

    def _encode(self, pairs: Sequence[Pair]) -> list[EncodedRow]:
        if self.config.long_documents == "max_chunk":
            return self._encoder.encode_windows(
                pairs, window_tokens=self.config.window_tokens,
                overlap_tokens=self.config.window_overlap_tokens,
            )
        return self._encoder.encode(pairs)

    def _plan(self, rows: list[EncodedRow], *, sort_by_length: bool) -> list[Batch]:
        return plan_batches(
            [len(row.ids) for row in rows],
            max_batch_tokens=self.config.max_batch_tokens,
            max_batch_size=self.config.max_batch_size,
            sort_by_length=sort_by_length,
            pad_to_multiple=self.config.pad_to_multiple,
            batch_overhead_tokens=run_overhead_tokens(self.device_info.device,
                                                      self.config.max_batch_tokens),
        )

    def _run_batch(self, rows: list[EncodedRow], batch: Batch) -> np.ndarray:
        """Logits of one batch, in the batch's row order."""
        size = len(batch.rows)
        logits = self._model.run(_batch_inputs(rows, batch, self.spec.pad_token_id))
        logits = np.asarray(logits, dtype=np.float32).reshape(size, -1)[:, 0]
        if not np.all(np.isfinite(logits)):
            bad = int(np.flatnonzero(~np.isfinite(logits))[0])
            raise InferenceError(
                f"{self.device_info.model_file} produced a non-finite score ({logits[bad]}) for "
                f"input pair {rows[batch.rows[bad]].pair_index}; the model or its inputs are broken"
            )
        return logits

    def _score_pairs(
        self, pairs: Sequence[Pair]
    ) -> tuple[Scores, list[tuple[int, int] | None]]:
        """Scores and best-window spans for all pairs, using the cache when enabled."""
        scores = np.full(len(pairs), -np.inf, dtype=np.float32)
        spans: list[tuple[int, int] | None] = [None] * len(pairs)
        todo = list(range(len(pairs)))
        keys: list[str] = []
        if self._cache is not None:
            keys = [self._cache.key(query, document) for query, document in pairs]
            todo = []
            for index, key in enumerate(keys):
                hit = self._cache.get(key)
                if hit is None:
                    todo.append(index)
                else:
                    scores[index], spans[index] = hit
        if todo:
            rows = self._encode([pairs[index] for index in todo])
            for batch in self._plan(rows, sort_by_length=self.config.sort_by_length):
                self._merge(rows, batch, self._run_batch(rows, batch), todo, scores, spans)
            if self._cache is not None:
                for index in todo:
                    self._cache.put(keys[index], (float(scores[index]), spans[index]))
        return scores, spans

    def _score_until(
        self, pairs: Sequence[Pair], deadline_ms: float
    ) -> tuple[Scores, list[tuple[int, int] | None], np.ndarray]:
        """Score in input order until the deadline; returns which pairs got every row scored."""
        started = time.perf_counter()
        deadline = started + deadline_ms / 1000.0
        scores = np.full(len(pairs), -np.inf, dtype=np.float32)
        spans: list[tuple[int, int] | None] = [None] * len(pairs)
        rows = self._encode(pairs)
        rows_done = np.zeros(len(pairs), dtype=np.int64)
        rows_total = np.bincount([row.pair_index for row in rows], minlength=len(pairs))
        seconds_per_token = 0.0
        everything = list(range(len(pairs)))
        for batch in self._plan(rows, sort_by_length=False):
            now = time.perf_counter()
            batch_tokens = len(batch.rows) * batch.padded_length
            # Stop if the deadline passed or the next batch is predicted (from the speed of the
            # batches so far) to end after it: this keeps the overshoot within one batch.
            if now >= deadline or now + seconds_per_token * batch_tokens > deadline:
                break
            self._merge(rows, batch, self._run_batch(rows, batch), everything, scores, spans)
            for row_index in batch.rows:
                rows_done[rows[row_index].pair_index] += 1
            seconds_per_token = max(seconds_per_token,
                                    (time.perf_counter() - now) / batch_tokens)
        return scores, spans, rows_done == rows_total

    @staticmethod
    def _merge(
        rows: list[EncodedRow], batch: Batch, logits: np.ndarray, targets: list[int],
        scores: Scores, spans: list[tuple[int, int] | None],
    ) -> None:
        """Scatter a batch's logits back to pair order, keeping each pair's best window."""
        for row_index, logit in zip(batch.rows, logits):
            row = rows[row_index]
            target = targets[row.pair_index]
            if logit > scores[target]:
                scores[target] = logit
                spans[target] = row.span

    def _cache_model_key(self) -> str:
        settings = (
            self.spec.manifest_hash(), self.device_info.variant, self.config.max_length,
            self.config.long_documents, self.config.window_tokens,
            self.config.window_overlap_tokens,
        )
        return "|".join(str(setting) for setting in settings)


def _gate_openvino(
    spec: ModelSpec, model_dir: Path, model: OnnxModel, encoder: PairEncoder, config: EngineConfig
) -> OnnxModel:
    """Keep the OpenVINO session only if it matches the CPU EP's fp32 scores; else use the CPU EP."""
    reference = build_session(spec, model_dir, device="cpu", precision="fp32",
                              threads=config.threads, cpu_provider="default")
    with resources.files("onnxrank.data").joinpath("validation_pairs.jsonl").open() as handle:
        records = [json.loads(line) for line, _ in zip(handle, range(OPENVINO_GATE_PAIRS))]
    rows = encoder.encode([(record["query"], record["passage"]) for record in records])
    batch = plan_batches([len(row.ids) for row in rows], max_batch_tokens=1 << 30,
                         max_batch_size=len(rows))[0]
    feeds = _batch_inputs(rows, batch, spec.pad_token_id)
    difference = float(np.abs(model.run(feeds) - reference.run(feeds)).max())
    if difference <= OPENVINO_GATE_MAX_ABS_DIFF:
        logger.info("OpenVINO EP passed the fidelity gate (max |Δlogit| %.2e)", difference)
        return model
    logger.warning(
        "OpenVINO EP differs from onnxruntime's fp32 scores by %.2e (> %.0e) on the validation "
        "pairs; using CPUExecutionProvider instead", difference, OPENVINO_GATE_MAX_ABS_DIFF,
    )
    return build_session(spec, model_dir, device="cpu", precision=config.precision,
                         threads=config.threads, cpu_provider="default")


def _batch_inputs(rows: list[EncodedRow], batch: Batch, pad_token_id: int) -> dict[str, np.ndarray]:
    """Right-padded input_ids / attention_mask / token_type_ids for one batch."""
    size = len(batch.rows)
    input_ids = np.full((size, batch.padded_length), pad_token_id, dtype=np.int64)
    type_ids = np.zeros((size, batch.padded_length), dtype=np.int64)
    attention_mask = np.zeros((size, batch.padded_length), dtype=np.int64)
    for position, row_index in enumerate(batch.rows):
        row = rows[row_index]
        length = len(row.ids)
        input_ids[position, :length] = row.ids
        type_ids[position, :length] = row.type_ids
        attention_mask[position, :length] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": type_ids}


# --- validation and post-processing ------------------------------------------------------------

def _check_query(query: object) -> None:
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    if not query.strip():
        raise ValueError(f"query must be a non-empty string, got {query!r}")


def _check_documents(documents: object) -> list[str]:
    if isinstance(documents, str) or not isinstance(documents, Sequence):
        raise TypeError(
            f"documents must be a list of str, got {type(documents).__name__}"
        )
    for index, document in enumerate(documents):
        if not isinstance(document, str):
            raise TypeError(
                f"documents[{index}] must be a str, got {type(document).__name__}"
            )
    return list(documents)


def _check_pairs(pairs: object) -> list[Pair]:
    if isinstance(pairs, str) or not isinstance(pairs, Sequence):
        raise TypeError(f"pairs must be a list of (query, document) tuples, got {type(pairs).__name__}")
    checked: list[Pair] = []
    for index, pair in enumerate(pairs):
        if (
            not isinstance(pair, (tuple, list)) or len(pair) != 2
            or not all(isinstance(text, str) for text in pair)
        ):
            raise TypeError(
                f"pairs[{index}] must be a (query, document) tuple of two str, got {pair!r:.80}"
            )
        _check_query(pair[0])
        checked.append((pair[0], pair[1]))
    return checked


def _check_rank_options(
    top_k: int | None, activation: str, deadline_ms: float | None, on_error: str
) -> None:
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive int or None, got {top_k!r}")
    if activation not in ("sigmoid", "none"):
        raise ValueError(f"activation must be 'sigmoid' or 'none', got {activation!r}")
    if deadline_ms is not None and not deadline_ms > 0:
        raise ValueError(f"deadline_ms must be > 0 or None, got {deadline_ms!r}")
    if on_error not in ("raise", "fallback"):
        raise ValueError(f"on_error must be 'raise' or 'fallback', got {on_error!r}")


def _rank(
    documents: list[str], logits: Scores, spans: list[tuple[int, int] | None],
    scored: np.ndarray, *, top_k: int | None, activation: ScoreActivation,
) -> list[RankedDocument]:
    """Sort scored documents best first (ties by input order); unscored ones follow in order."""
    scored_indices = np.flatnonzero(scored)
    values = logits[scored_indices].astype(np.float64)
    if activation == "sigmoid":
        values = 0.5 * (1.0 + np.tanh(0.5 * values))  # sigmoid without exp overflow
    keep = len(scored_indices) if top_k is None else min(top_k, len(scored_indices))
    if keep < len(scored_indices):
        # argpartition is O(n): only the k survivors get sorted.
        candidates = np.argpartition(-values, keep - 1)[:keep]
        # ties at the cut must still prefer the earlier input: widen to all equal values
        threshold = values[candidates].min()
        candidates = np.flatnonzero(values >= threshold)
    else:
        candidates = np.arange(len(scored_indices))
    # lexsort: primary key -score, secondary key input index (stable tie-break)
    order = candidates[np.lexsort((scored_indices[candidates], -values[candidates]))][:keep]
    ranked = [
        RankedDocument(index=int(scored_indices[position]), score=float(values[position]),
                       text=documents[scored_indices[position]],
                       span=spans[scored_indices[position]])
        for position in order
    ]
    if top_k is None or len(ranked) < top_k:
        unscored = fallback_ranking(documents)
        ranked += [unscored[index] for index in np.flatnonzero(~scored)]
    return ranked if top_k is None else ranked[:top_k]
