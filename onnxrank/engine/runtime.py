"""The one runtime layer under every inference path (reranker, embedder, export validation, bench).

`load_model` loads a model directory's files once, chooses the backend and variant (probing the
candidates on first use and caching the choice per machine), verifies the hashes of the files it
opens, builds the runner and returns it with the tokenizer. `pad_rows` turns encoded rows into
model inputs, and `open_model_file` opens a bare file (export validation) through the same
backends.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from onnxrank.engine.backends.base import Backend, CompileCache, ModelRunner
from onnxrank.engine.backends.onnxruntime import OnnxruntimeBackend
from onnxrank.engine.backends.openvino import OpenvinoBackend
from onnxrank.engine.batch_invariance import (
    BATCH_DEPENDENCE_BOUND,
    CHECK_ROWS_PER_LENGTH,
    CHECK_TOKENS,
    PAD_MULTIPLES,
    BatchInvariance,
    measure_batch_invariance,
)
from onnxrank.engine.batching import padding_multiple
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.devices import cpu_model, resolve_device, usable_cpus
from onnxrank.engine.first_use import export_once, exportable
from onnxrank.engine.prefix import PrefixGraph, prefix_batch_movement
from onnxrank.engine.rows import EncodedRow
from onnxrank.engine.spec import ModelSpec, verify_files
from onnxrank.engine.tokenize import load_tokenizer
from onnxrank.engine.variants import VARIANTS
from onnxrank.errors import DeviceUnavailableError, ModelLoadError
from onnxrank.types import Device, Pair

logger = logging.getLogger(__name__)

BACKENDS: dict[str, Backend] = {
    backend.name: backend for backend in (OnnxruntimeBackend(), OpenvinoBackend())
}
# The probe times real pairs at two shapes (pairs, tokens of pair text): 16 pairs cut to 64 tokens
# (short passages) and the first 8 cut to 256 (the long rows of mixed lengths), together about
# the work of the 16 x 128 it timed before. At each shape a candidate's time is its best of 3
# rounds after a warm-up, every round running every candidate once, so a stall of the machine
# costs each candidate a round instead of costing one candidate all its runs (a choice is cached
# for good). The fastest is the candidate with the lowest score by PROBE_RULE (probe_choice).
PROBE_SHAPES = ((16, 64), (8, 256))
PROBE_PAIRS = max(pairs for pairs, _ in PROBE_SHAPES)
PROBE_ROUNDS = 3
PROBE_RULE = "the geometric mean over shapes of each time relative to the fastest at that shape"
CHOICE_CACHE_FILE = "runtime_choices.json"
# The export's record of how far an int8 file with run-time activation scales moves its scores
# with their batch mates (onnxrank.export.validate.batch_dependence), read by gate_refusal against
# BATCH_DEPENDENCE_BOUND (onnxrank.engine.batch_invariance)
BATCH_DEPENDENCE_KEY = "batch_1_vs_64_max_abs_diff"
SPREAD_KEY = "reference_std"
# OpenVINO's compiled models, one entry directory per file, settings and machine (backends/openvino.py)
COMPILE_CACHE_DIR = "openvino"
# Where model names are looked up (and `onnxrank export` writes) unless the caller says otherwise.
DEFAULT_MODELS_DIR = "models"
# Exports made on first use, one directory per checkpoint, in the user cache (engine/first_use.py)
EXPORT_CACHE_DIR = "models"


def resolve_model_dir(name_or_path: str | Path, models_dir: str | Path = DEFAULT_MODELS_DIR, *,
                      export_task: str | None = None) -> Path:
    """The model directory for a name or a path.

    1. ``models_dir/name`` when it holds a manifest.json.
    2. `name_or_path` itself when it holds a manifest.json.
    3. With `export_task`, a Hugging Face checkpoint directory (config.json, no manifest.json) or
       Hub id: its export as that task in the user cache's models/ directory, exported now on
       first use (onnxrank.engine.first_use).

    Args:
        name_or_path: A model name under `models_dir`, a model or checkpoint directory, or a
            Hub id.
        models_dir: Where model names are looked up.
        export_task: ``rerank`` or ``embedding``: what a checkpoint that is not exported yet
            is exported as; None = find exported models only.

    Raises:
        ModelLoadError: Neither location holds an exported model and nothing is exported.
        MissingDependencyError: A first-use export needs the ``export`` extra.
        ExportError: A first-use export failed (FidelityError: its fp32 graph missed the gate);
            the cache is left as it was.
    """
    for candidate in (Path(models_dir) / str(name_or_path), Path(name_or_path)):
        if (candidate / "manifest.json").is_file():
            return candidate
    if export_task is not None and exportable(name_or_path):
        return export_once(name_or_path, export_task, user_cache_dir() / EXPORT_CACHE_DIR)
    named = Path(models_dir) / str(name_or_path)
    allow = (" or let it be exported on first use (export_on_first_use=True, "
             "--export-on-first-use)" if export_task is None and exportable(name_or_path) else "")
    raise ModelLoadError(
        f"no exported model named {str(name_or_path)!r} in {Path(models_dir).resolve()} and no "
        f"model directory at {Path(name_or_path).resolve()}; export one with "
        f"`onnxrank export --model {name_or_path} --out {named}`{allow}"
    )


def pad_rows(rows: Sequence[EncodedRow], pad_token_id: int,
             padded_length: int | None = None) -> dict[str, np.ndarray]:
    """Right-padded int64 input_ids / attention_mask / token_type_ids for rows of one batch.

    Args:
        rows: Encoded rows, in batch order.
        pad_token_id: The tokenizer's padding id.
        padded_length: Columns of the batch; None = the longest row.
    """
    length = padded_length or max(len(row.ids) for row in rows)
    # One allocation for the three inputs, then slice writes per row: on the small batches a CPU
    # plan has (1-16 rows), one masked write per input was slower (timeit: 12 us against 4 us
    # for one row, about even at 16).
    input_ids, attention_mask, type_ids = np.zeros((3, len(rows), length), dtype=np.int64)
    input_ids.fill(pad_token_id)
    for position, row in enumerate(rows):
        size = len(row.ids)
        input_ids[position, :size] = row.ids
        type_ids[position, :size] = row.type_ids
        attention_mask[position, :size] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": type_ids}


def open_model_file(path: str | Path, *, backend: str = "onnxruntime", device: Device | str = "cpu",
                    precision: str = "fp32", threads: int | None = None) -> ModelRunner:
    """Open one model file through a backend, as the engine would (export validation, studies).

    Raises:
        ValueError: Unknown backend, or the backend cannot run `precision` on `device` here.
        ModelLoadError: The file cannot be loaded.
    """
    runtime = _backend(backend)
    resolved = resolve_device(device, ort.get_available_providers())
    reason = runtime.unavailable_reason(resolved, precision)
    if reason is not None:
        raise ValueError(reason)
    return runtime.open(Path(path), device=resolved, precision=precision,
                        variant=Path(path).name, threads=threads or usable_cpus())


@dataclass(frozen=True, slots=True)
class Candidate:
    """One way to run a model: a backend, a precision and the manifest variant it runs."""

    backend: str
    precision: str
    variant: str

    @property
    def label(self) -> str:
        return f"{self.backend}/{self.precision}"


# The probe's input: the model's kind encodes these texts into rows with about this many tokens of
# pair text (onnxrank.engine.model).
ProbeRows = Callable[[ModelSpec, Tokenizer, int], Sequence[EncodedRow]]


def probe_pairs() -> list[Pair]:
    """The probe's text: the PROBE_PAIRS longest passages (in characters, the first of equals) of
    the shipped validation pairs' mixed regime, as (query, passage): long enough to fill every
    probe shape, where most shipped pairs are first-stage candidates shorter than 256 tokens."""
    text = resources.files("onnxrank.data").joinpath("validation_pairs.jsonl").read_text("utf-8")
    records = [record for line in text.splitlines() if line.strip()
               if (record := json.loads(line))["regime"] == "mixed"]
    longest = sorted(records, key=lambda record: -len(record["passage"]))[:PROBE_PAIRS]
    return [(record["query"], record["passage"]) for record in longest]


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A model ready to run: its manifest, directory, runner and tokenizer (truncation off)."""

    spec: ModelSpec
    model_dir: Path
    runner: ModelRunner
    tokenizer: Tokenizer


def load_model(spec: ModelSpec, model_dir: Path, *, config: EngineConfig, probe_rows: ProbeRows,
               choice_cache: Path | None = None, started: float | None = None) -> LoadedModel:
    """Load the files of an exported model directory with the engine settings in `config`.

    Args:
        spec: The directory's manifest (load_model_spec).
        model_dir: Model directory written by `onnxrank export`.
        config: Device, backend, precision and threads are read here.
        probe_rows: The rows the probe times candidates on, built by the model's kind from
            `probe_pairs` with about the given tokens of pair text (called only when there is
            a choice to probe).
        choice_cache: JSON file of probed choices; None = default_choice_cache().
        started: perf_counter() when the load began (reported as load_ms); None = now.

    Raises:
        ModelLoadError: Missing, unreadable or modified files.
        DeviceUnavailableError: CUDA was requested and is unavailable.
        ValueError: The requested backend or precision cannot run here (the message names
            what can).
    """
    started = time.perf_counter() if started is None else started
    device = resolve_device(config.device, ort.get_available_providers())
    try:
        loaded = _load_on(spec, model_dir, device, config, probe_rows, choice_cache)
    except DeviceUnavailableError as err:
        if device is not Device.CUDA or Device(config.device) is Device.CUDA:
            raise
        logger.warning("%s Falling back to CPU because device='auto'.", err)
        loaded = _load_on(spec, model_dir, Device.CPU, config, probe_rows, choice_cache)
    info = loaded.runner.with_info(load_ms=(time.perf_counter() - started) * 1000).info
    logger.info("running %s with %s/%s on %s (%d threads, loaded in %.0f ms, compile cache %s): %s",
                spec.name, info.backend, info.precision, info.provider, info.threads, info.load_ms,
                info.compile_cache, info.reason)
    return loaded


def _load_on(spec: ModelSpec, model_dir: Path, device: Device, config: EngineConfig,
             probe_rows: ProbeRows, choice_cache: Path | None) -> LoadedModel:
    threads = config.threads or usable_cpus()
    candidates, left_out = choose_candidates(spec, device, config.backend, config.precision)
    tokenizer = load_tokenizer(spec, model_dir)  # its hash is checked with the variant, in _open
    opener = _Opener(spec, model_dir, device, threads, compile_cache_root(config))
    cache = choice_cache or default_choice_cache()

    def rows(tokens: int) -> Sequence[EncodedRow]:
        return probe_rows(spec, tokenizer, tokens)

    # settings that name a padding multiple own the padding: the batch check does not run
    checked = config.pad_to_multiple is None
    if len(candidates) == 1:
        requested = config.backend != "auto" and config.precision != "auto"
        runner = (_open_checked(spec, candidates[0], opener, rows, cache) if checked
                  else opener.open(candidates[0])).with_info(
            reason="requested" if requested else "the only validated candidate here")
    else:
        # the batch check leaves a rerank variant out only where the gate would (auto precision)
        gated = config.precision == "auto" and spec.task == "rerank"
        runner, moving = _choose_by_probe(spec, candidates, opener, rows, cache,
                                          checked=checked, gated=gated)
        left_out += moving
    if left_out:
        runner = runner.with_info(reason=f"{runner.info.reason}; left out: {'; '.join(left_out)}")
    return LoadedModel(spec, model_dir, runner, tokenizer)


def choose_candidates(spec: ModelSpec, device: Device, backend: str,
                      precision: str) -> tuple[list[Candidate], list[str]]:
    """The (backend, precision) pairs that may run `spec` on `device` for these settings, and
    why each one considered before them was left out ("backend/precision: reason").

    1. Explicit backend and precision: that one, or ValueError naming what can run.
    2. An ``auto`` setting: from every available backend, the first `auto_candidates` of its
       `preference` that were exported and pass `gate_refusal`; onnxruntime's CPU EP needs
       nothing but the base install, so something always runs.

    Raises:
        ValueError: Unknown backend or precision, or nothing requested can run here.
    """
    names = list(BACKENDS) if backend == "auto" else [_backend(backend).name]
    runnable: list[Candidate] = []
    refusals: list[str] = []
    for name in names:
        runtime = BACKENDS[name]
        precisions = runtime.preference.get(device, ()) if precision == "auto" else (precision,)
        taken = 0
        for wanted in precisions:
            reason = runtime.unavailable_reason(device, wanted)
            variant = runtime.variants.get(wanted, "")
            if reason is None and variant not in spec.variants:
                reason = f"variant {variant!r} was not exported (the model has: " \
                         f"{', '.join(spec.variants)})"
            if reason is None and precision == "auto":
                reason = gate_refusal(spec, name, wanted)
            if reason is not None:
                refusals.append(f"{name}/{wanted}: {reason}")
                continue
            runnable.append(Candidate(name, wanted, variant))
            taken += 1
            if precision == "auto" and taken == runtime.auto_candidates:
                break
    if not runnable:
        raise ValueError(
            f"nothing can run model {spec.name!r} with backend={backend!r}, "
            f"precision={precision!r} on {device.value}: " + "; ".join(refusals)
            + f". Available backends: {', '.join(available_backends(device))}"
        )
    return runnable, refusals


def gate_refusal(spec: ModelSpec, backend: str, precision: str) -> str | None:
    """Why ``precision="auto"`` must leave this way of running the model out; None if it may
    choose it (an explicit precision is never refused for these reasons).

    1. A precision with a record of its own (`Backend.gate_records`: OpenVINO bf16 on
       model.onnx, the int8 IR with bf16 for the rest) needs that record under its variant's
       ``fidelity`` to say ``passed``; a manifest without it was not validated that way.
    2. Its variant's scores may move with their batch mates by at most BATCH_DEPENDENCE_BOUND
       times the score spread: the export records ``batch_1_vs_64_max_abs_diff`` (the largest
       |score difference| between scoring each validation row alone and in batches of 64, in
       score units) for every int8 file whose activation scales are computed at run time
       (dynamic per batch, or per row), and ``reference_std`` (the PyTorch reference's score
       std on the tuning pairs) for every variant; a batch record without a spread cannot be
       judged and is refused. Files with fixed scales (fp32, opt, fp16, OpenVINO's static or
       weight-only int8) carry no record: what still moves their scores with the padded batch
       shape is float rounding (up to 0.06 x the spread in OpenVINO's bf16 on the stand-in),
       which the load's batch check measures on the machine and removes by padding
       (onnxrank.engine.batch_invariance; a probed rerank candidate it cannot bound is left
       out there).
       Rerank models only: an embedding model's record is in embedding
       components, not in the units of its spread (similarities), so it is not gated.
    """
    runtime = BACKENDS[backend]
    variant = spec.variants.get(runtime.variants[precision])
    fidelity = variant.fidelity if variant is not None else {}
    key = runtime.gate_records.get(precision)
    record = fidelity.get(key) if key is not None else None
    if key is not None and not (isinstance(record, dict) and record.get("passed") is True):
        return f"{backend}/{precision} has no passing fidelity record in the manifest"
    moved = fidelity.get(BATCH_DEPENDENCE_KEY)
    if moved is None or spec.task != "rerank":
        return None
    spread = fidelity.get(SPREAD_KEY)
    if not spread:
        return (f"its scores move with their batch mates by up to {moved:.3g} "
                f"({BATCH_DEPENDENCE_KEY}) and the manifest records no score spread "
                f"({SPREAD_KEY}) to bound it by")
    if moved > BATCH_DEPENDENCE_BOUND * spread:
        return (f"its scores move with their batch mates by up to {moved:.3g} "
                f"({BATCH_DEPENDENCE_KEY}), {moved / spread:.2g} x the score spread "
                f"{spread:.3g}, above the bound of {BATCH_DEPENDENCE_BOUND:g} x the spread "
                "(ask for it explicitly to run it)")
    return None


def available_backends(device: Device) -> list[str]:
    """Backends that can run something on `device` here."""
    return [name for name, runtime in BACKENDS.items()
            if any(runtime.unavailable_reason(device, p) is None
                   for p in runtime.preference.get(device, ()))]


def user_cache_dir() -> Path:
    """onnxrank's per-user cache: $XDG_CACHE_HOME/onnxrank (else ~/.cache/onnxrank)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "onnxrank"


def default_choice_cache() -> Path:
    """Where probed choices are kept: runtime_choices.json in the user cache directory."""
    return user_cache_dir() / CHOICE_CACHE_FILE


def compile_cache_root(config: EngineConfig) -> Path | None:
    """Where compiled models are kept: None when `config.compile_cache` is off, else
    `config.compile_cache_dir`, else openvino/ in the user cache directory."""
    if not config.compile_cache:
        return None
    if config.compile_cache_dir is not None:
        return Path(config.compile_cache_dir).expanduser()
    return user_cache_dir() / COMPILE_CACHE_DIR


def machine_fingerprint(threads: int) -> dict[str, str]:
    """What makes a speed measurement valid: CPU, threads and runtime versions."""
    fingerprint = {"cpu": cpu_model(), "threads": str(threads), "onnxruntime": ort.__version__}
    try:
        import openvino

        fingerprint["openvino"] = openvino.__version__
    except ImportError:
        fingerprint["openvino"] = "not installed"
    return fingerprint


def _choice_key(spec: ModelSpec, device: Device, candidates: list[Candidate],
                fingerprint: dict[str, str], *, checked: bool = True) -> str:
    # the probe's shapes and rule and the batch check's (or that none ran) are part of the key:
    # a choice made another way is not reused
    check = [PAD_MULTIPLES, CHECK_TOKENS, CHECK_ROWS_PER_LENGTH, BATCH_DEPENDENCE_BOUND] \
        if checked else None
    probe = [PROBE_SHAPES, PROBE_RULE, check]
    material = json.dumps([spec.manifest_hash(), device.value,
                           [candidate.label for candidate in candidates], fingerprint, probe],
                          sort_keys=True)
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


_cache_lock = threading.Lock()


def _read_choices(path: Path) -> dict[str, dict[str, object]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_choice(path: Path, key: str, spec: ModelSpec, fingerprint: dict[str, str],
                  entry: dict[str, object]) -> None:
    """Cache `entry` under `key`, stamped with the model, the machine and the time measured."""
    with _cache_lock:
        choices = _read_choices(path)
        choices[key] = {**entry, "model": spec.name, "fingerprint": fingerprint,
                        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f".{path.name}.{os.getpid()}")
            partial.write_text(json.dumps(choices, indent=2, sort_keys=True) + "\n",
                               encoding="utf-8")
            os.replace(partial, path)
        except OSError as err:  # a read-only home must not stop inference
            logger.warning("could not cache the runtime choice in %s: %s", path, err)


def probe_choice(times_ms: Mapping[str, Mapping[str, float]]) -> tuple[str, dict[str, float]]:
    """The fastest candidate by PROBE_RULE, and every candidate's score.

    A score of 1.0 is fastest at every shape; 1.2 is 20% slower than the fastest at each shape
    (geometric mean), so a short shape's few milliseconds count as much as a long one's many.
    Ties go to the first candidate (the backends' order of preference).

    Args:
        times_ms: Per candidate label, its time in ms at each shape (every candidate timed at
            the same shapes).
    """
    shapes = next(iter(times_ms.values()))
    fastest = {shape: min(times[shape] for times in times_ms.values()) for shape in shapes}
    scores = {label: math.prod(times[shape] / fastest[shape] for shape in shapes)
              ** (1 / len(shapes)) for label, times in times_ms.items()}
    return min(scores, key=scores.__getitem__), scores


def _probe_feeds(rows: Callable[[int], Sequence[EncodedRow]],
                 pad_token_id: int) -> dict[str, dict[str, np.ndarray]]:
    """The probe's batches by shape: "16x64" is 16 pairs of 64 tokens of pair text."""
    return {f"{pairs}x{tokens}": pad_rows(rows(tokens)[:pairs], pad_token_id)
            for pairs, tokens in PROBE_SHAPES}


def _describe_times(times_ms: Mapping[str, Mapping[str, float]]) -> str:
    """"onnxruntime/int8 16x64 3.1 ms, 8x256 12.0 ms; openvino/fp32 ...", for `reason`."""
    return "; ".join(
        f"{label} " + ", ".join(f"{shape} {ms:.1f} ms" for shape, ms in times.items())
        for label, times in times_ms.items())


def _cached_choice(entry: object, labels: Sequence[str], *, checked: bool) -> tuple[
        str, str, dict[str, dict[str, float]], BatchInvariance | None, list[str]] | None:
    """A cached entry's choice, time of measurement, per-shape times, the choice's batch check
    (None where none ran) and the candidates the check left out, when the choice is one of
    `labels` and the entry has a check if `checked`; None for anything else (an entry of an
    older probe, a damaged file)."""
    if not isinstance(entry, dict) or entry.get("choice") not in labels:
        return None
    times = entry.get("probe_ms")
    if not isinstance(times, dict) or not all(
            isinstance(shapes, dict) and shapes
            and all(isinstance(ms, (int, float)) for ms in shapes.values())
            for shapes in times.values()):
        return None
    check = _read_check(entry.get("batch_check"))
    left_out = entry.get("left_out", [])
    if (checked and check is None) or not isinstance(left_out, list):
        return None
    return str(entry["choice"]), str(entry.get("measured_at")), times, check, left_out


def _check_record(check: BatchInvariance) -> dict[str, object]:
    return {"pad_to_multiple": check.pad_to_multiple,
            "moved": {str(multiple): share for multiple, share in check.moved.items()}}


def _read_check(record: object) -> BatchInvariance | None:
    """A cached batch check, or None when the record is not one."""
    if not isinstance(record, dict) or not isinstance(record.get("moved"), dict):
        return None
    try:
        moved = {int(multiple): float(share) for multiple, share in record["moved"].items()}
        check = BatchInvariance(int(record["pad_to_multiple"]), moved)
    except (KeyError, TypeError, ValueError):
        return None
    return check if check.pad_to_multiple in moved else None


def _batch_check(spec: ModelSpec, runner: ModelRunner,
                 rows: Callable[[int], Sequence[EncodedRow]]) -> BatchInvariance:
    """Measure on this machine the padding multiple at which `runner`'s outputs stop moving with
    their batch mates (onnxrank.engine.batch_invariance), on validation rows of several lengths."""
    check_rows = [row for tokens in CHECK_TOKENS for row in rows(tokens)[:CHECK_ROWS_PER_LENGTH]]
    return measure_batch_invariance(
        runner.run, lambda batch, length: pad_rows(batch, spec.pad_token_id, length), check_rows,
        spec.max_length)


def _with_check(runner: ModelRunner, check: BatchInvariance | None) -> ModelRunner:
    if check is None:
        return runner
    return runner.with_info(batch_invariant_multiple=check.pad_to_multiple,
                            batch_movement=check.moved[check.pad_to_multiple])


def _open_checked(spec: ModelSpec, candidate: Candidate, opener: _Opener,
                  rows: Callable[[int], Sequence[EncodedRow]], cache: Path) -> ModelRunner:
    """Open the one candidate with its batch check, measured once per machine and cached."""
    fingerprint = machine_fingerprint(opener.threads)
    key = _choice_key(spec, opener.device, [candidate], fingerprint)
    runner = opener.open(candidate)
    entry = _read_choices(cache).get(key)
    check = _read_check(entry.get("batch_check")) if isinstance(entry, dict) else None
    if check is None:
        check = _batch_check(spec, runner, rows)
        _write_choice(cache, key, spec, fingerprint,
                      {"choice": candidate.label, "batch_check": _check_record(check)})
    return _with_check(runner, check)


def _choose_by_probe(spec: ModelSpec, candidates: list[Candidate], opener: _Opener,
                     rows: Callable[[int], Sequence[EncodedRow]], cache: Path, *,
                     checked: bool, gated: bool) -> tuple[ModelRunner, list[str]]:
    """Open the cached choice for this machine, or time every candidate, check the fastest's
    batch independence (with `checked`) and cache the choice; with `gated` too, a candidate
    whose outputs move with their batch mates beyond the bound at every padding multiple is left
    out for the next fastest. Returns the runner and the candidates the batch check left out,
    with why."""
    fingerprint = machine_fingerprint(opener.threads)
    key = _choice_key(spec, opener.device, candidates, fingerprint, checked=checked)
    by_label = {candidate.label: candidate for candidate in candidates}
    cached = _cached_choice(_read_choices(cache).get(key), list(by_label), checked=checked)
    if cached is not None:
        choice, measured_at, cached_times, check, left_out = cached
        runner = opener.open(by_label[choice]).with_info(reason=(
            f"fastest of {', '.join(by_label)} when probed on this machine at {measured_at} "
            f"({_describe_times(cached_times)}; cached in {cache})"))
        return _with_check(runner, check), [str(reason) for reason in left_out]
    shapes = _probe_feeds(rows, spec.pad_token_id)  # encoded only when there is something to time
    runners: dict[str, ModelRunner] = {}
    for candidate in candidates:
        runners[candidate.label] = opener.open(candidate)
        for feeds in shapes.values():  # warm-up: first runs allocate and compile kernels
            runners[candidate.label].run(feeds)
    labels = list(runners)
    times: dict[str, dict[str, float]] = {label: dict.fromkeys(shapes, float("inf"))
                                          for label in labels}
    for round_index in range(PROBE_ROUNDS):
        # each round starts one candidate later, so none always runs right after the same one
        shift = round_index % len(labels)
        for shape, feeds in shapes.items():
            for label in labels[shift:] + labels[:shift]:
                started = time.perf_counter()
                runners[label].run(feeds)
                times[label][shape] = min(times[label][shape],
                                          (time.perf_counter() - started) * 1000)
    _, scores = probe_choice(times)
    ranked = sorted(labels, key=scores.__getitem__)  # stable: ties keep the preference order
    checks: dict[str, BatchInvariance] = {}
    for label in ranked if checked else ():  # fastest first, until one is within the bound
        checks[label] = _batch_check(spec, runners[label], rows)
        if not gated or checks[label].within_bound:
            break
    # when none is within the bound, the fastest runs and its DeviceInfo says how far it moves
    choice = next((label for label, check in checks.items()
                   if not gated or check.within_bound), ranked[0])
    check = checks.get(choice)
    left_out = [f"{label}: its outputs move with their batch mates on this machine "
                f"({moved.describe()}), above the bound of {BATCH_DEPENDENCE_BOUND:g} x the "
                "spread (ask for it explicitly to run it)"
                for label, moved in checks.items() if label != choice]
    _write_choice(cache, key, spec, fingerprint, {
        "choice": choice, "probe_ms": times, "score": scores, "rule": PROBE_RULE,
        "batch_check": None if check is None else _check_record(check), "left_out": left_out,
    })
    runner = runners[choice].with_info(reason=(
        f"fastest when probed now ({_describe_times(times)}; validation pairs as batches of "
        f"{' and '.join(shapes)} pairs x tokens, best of {PROBE_ROUNDS} interleaved rounds, "
        f"ranked by {PROBE_RULE}); cached in {cache}"))
    return _with_check(runner, check), left_out


@dataclass(frozen=True, slots=True)
class _Opener:
    """Opens candidates of one model with one load's settings."""

    spec: ModelSpec
    model_dir: Path
    device: Device
    threads: int
    compile_cache_root: Path | None

    def open(self, candidate: Candidate) -> ModelRunner:
        """Verify the tokenizer's and the candidate's files against the manifest, then load them.

        Only what is opened gets hashed: a cached choice opens one variant, not every candidate.
        """
        verify_files(self.spec, self.model_dir, [candidate.variant])
        variant = self.spec.variants[candidate.variant]
        compile_cache = None if self.compile_cache_root is None else CompileCache(
            self.compile_cache_root,
            content_key=",".join([variant.sha256, *sorted(variant.extra_files.values())]))
        return BACKENDS[candidate.backend].open(
            self.model_dir / variant.file, device=self.device, precision=candidate.precision,
            variant=candidate.variant, threads=self.threads, compile_cache=compile_cache)


def open_prefix_graph(spec: ModelSpec, model_dir: Path, runner: ModelRunner,
                      config: EngineConfig,
                      rows: Callable[[int], Sequence[EncodedRow]]) -> PrefixGraph | None:
    """The prefix graph (onnxrank.engine.prefix) of the variant `runner` runs, opened the same
    way (backend, precision, device, threads), or None: `config.prefix_reuse` is off, the
    variant has no prefix graph that passed its gate at this precision (its own record for a
    precision with one, like OpenVINO bf16 on model.onnx: passed_gate's rule), the graph is
    one from before the prefix cache (logged: the whole rows serve until it is exported again),
    or, with ``precision="auto"``, one query's rows (`rows`, the probe's) move with their batch
    mates through it beyond BATCH_DEPENDENCE_BOUND x their spread on this machine (logged;
    measured once per machine at the runner's padding multiple and cached with the runtime
    choices, default_choice_cache(); not measured where the settings name the precision or the
    padding).

    Raises:
        ModelLoadError: The prefix graph is missing, modified or cannot be loaded.
    """
    info = runner.info
    graph = spec.prefix_graphs.get(info.variant)
    run = next((run for run in VARIANTS[info.variant].runs_as
                if run.backend == info.backend and run.precision == info.precision), None)
    if not config.prefix_reuse or graph is None or run is None:
        return None
    # a precision with a record of its own (OpenVINO bf16) needs the prefix graph's own too
    record = graph.fidelity if run.fidelity_key is None else graph.fidelity.get(run.fidelity_key)
    if not isinstance(record, dict) or record.get("passed") is not True:
        return None
    verify_files(spec, model_dir, [], prefix_graphs=(info.variant,))
    root = compile_cache_root(config)
    compile_cache = None if root is None else CompileCache(
        root, content_key=",".join([graph.sha256, *sorted(graph.extra_files.values())]))
    opened = BACKENDS[info.backend].open(
        model_dir / graph.file, device=Device(info.device), precision=info.precision,
        variant=info.variant, threads=info.threads, compile_cache=compile_cache)
    try:
        prefix_graph = PrefixGraph(opened)
    except ModelLoadError as err:
        logger.warning("prefix reuse is off: %s", err)
        return None
    # the check only gates: a named precision or padding is used as asked, unmeasured
    if config.precision != "auto" or config.pad_to_multiple is not None:
        return prefix_graph
    moved = _prefix_check(spec, prefix_graph, runner, rows, padding_multiple(config, runner))
    if moved > BATCH_DEPENDENCE_BOUND:
        logger.warning(
            "prefix reuse is off: through the prefix graph, %s/%s's scores move with their batch "
            "mates by %.2g x their spread on this machine, above the bound of %g x the spread "
            "(the whole rows run; ask for the precision explicitly to reuse the prefix anyway)",
            info.backend, info.precision, moved, BATCH_DEPENDENCE_BOUND)
        return None
    return prefix_graph


def _prefix_check(spec: ModelSpec, graph: PrefixGraph, runner: ModelRunner,
                  rows: Callable[[int], Sequence[EncodedRow]], multiple: int) -> float:
    """How far one query's rows move with their batch mates through `graph`, as a share of their
    spread (onnxrank.engine.prefix.prefix_batch_movement) at `multiple`, the one the engine's
    batches are padded to: cached per machine beside the whole rows' check."""
    info = runner.info
    cache = default_choice_cache()
    fingerprint = machine_fingerprint(info.threads)
    candidate = Candidate(info.backend, info.precision, info.variant)
    key = _choice_key(spec, Device(info.device), [candidate], fingerprint) + "/prefix"
    entry = _read_choices(cache).get(key)
    cached = entry.get("moved") if isinstance(entry, dict) else None
    if isinstance(cached, (int, float)) and entry is not None \
            and entry.get("pad_to_multiple") == multiple:
        return float(cached)
    check_rows = [row for tokens in CHECK_TOKENS for row in rows(tokens)[:CHECK_ROWS_PER_LENGTH]]
    moved = prefix_batch_movement(graph, check_rows, spec.pad_token_id, multiple, spec.max_length)
    _write_choice(cache, key, spec, fingerprint,
                  {"prefix_check": candidate.label, "pad_to_multiple": multiple, "moved": moved})
    return moved


def _backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError as err:
        raise ValueError(
            f"backend must be one of 'auto', {', '.join(repr(n) for n in BACKENDS)}, got {name!r}"
        ) from err
