"""A peer in a child process: loads one CrossEncoder path (or fastembed), scores over a pipe.

The OpenVINO peers need optimum-intel, which pins transformers below what onnxrank's export needs,
and fastembed pins huggingface-hub below it, so they live in a second environment; the bench
starts this file there with that environment's interpreter (``onnxrank bench --peer-python
PATH``, onnxrank.bench.peers.ChildPeer). It imports only the standard library at the top, so it
runs where onnxrank is not installed; its peer's packages are imported on "load".

Protocol: one JSON object per line on stdin, one reply per line on the original stdout (the
libraries' own prints are sent to stderr, so they cannot corrupt a reply).

- ``{"op": "load", "kind": KIND, "checkpoint": DIR, "work_dir": DIR, "max_length": N,
  "threads": N, "calibration": [[query, passage], ...]}`` -> ``{"ok": true, "settings": {...}}``
- ``{"op": "score", "pairs": [[query, passage], ...]}`` -> ``{"ok": true, "scores": [...],
  "compute_s": S}``: the model's logits (no activation) and the time of ``predict`` alone,
  without the pipe.
- A failure -> ``{"ok": false, "error": ERROR, "message": TEXT}``, ERROR one of
  ``missing_dependency`` (the peer's packages are not in this interpreter), ``load_failed``,
  ``bad_request``, ``score_failed``.

Kinds:

- ``torch``: CrossEncoder on PyTorch fp32 (runs in onnxrank's own environment too: the tests drive
  the protocol with it).
- ``openvino``: ``CrossEncoder(dir, backend="openvino")`` at its faster precision on the machine:
  OpenVINO's default inference precision hint (bf16 where the CPU has it) or f32, whichever
  `fastest` times faster on the first BATCH_SIZE calibration pairs of the load request (on an
  Intel Xeon whose hypervisor hides AMX, OpenVINO's bf16 ran the stand-in at 0.6-0.8x its f32).
- ``openvino_int8``: the model saved by ``export_static_quantized_openvino_model`` with its
  default quantization config, its float part at the faster hint as for ``openvino``; its
  default calibration set (glue/sst2) needs the Hugging Face Hub, so it is calibrated on the
  pairs the load request carries (onnxrank's shipped calibration pairs), tokenized as pairs.
- ``fastembed``: fastembed's TextCrossEncoder on one of our files (`load_fastembed`); the load
  request's ``checkpoint`` is a directory holding it and the tokenizer files, ``model_file`` its
  name, ``model_name`` the custom model it is registered as (onnxrank.bench.baselines runs the
  same function in-process where fastembed installs beside onnxrank).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

# CrossEncoder.predict's default batch size; every sentence-transformers kind scores with it
BATCH_SIZE = 32
FASTEMBED_BATCH_SIZE = 64  # TextCrossEncoder.rerank_pairs's default
# the packages each kind imports, and where they come from
KIND_PACKAGES = {
    "torch": ("torch", "sentence_transformers"),
    "openvino": ("torch", "sentence_transformers", "optimum.intel", "openvino"),
    "openvino_int8": ("torch", "sentence_transformers", "optimum.intel", "openvino", "nncf",
                      "datasets"),
    "fastembed": ("fastembed",),
}
INSTALL_HINT = "docs/peers.md, \"A second environment for the OpenVINO peers and fastembed\""
INT8_FILE_SUFFIX = "qint8_quantized"  # export_static_quantized_openvino_model's default
FLOAT_FILE = "openvino/openvino_model.xml"  # where CrossEncoder.save_pretrained puts the IR
CALIBRATION_COLUMN = "pair"
FLOAT_HINT = "f32"  # the precision hint timed against OpenVINO's default on the machine
PRECISION_ROUNDS = 3  # rounds of `fastest`, each timing every candidate once after a warm-up


class PeerRequestError(Exception):
    """A request the worker answers with an error reply (its `error` names the kind)."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error


def _require(kind: str) -> None:
    """Raise before any import (torch's alone takes seconds) when a package of `kind` is absent."""
    missing = []
    for name in KIND_PACKAGES[kind]:
        try:
            found = importlib.util.find_spec(name) is not None
        except ImportError:  # its parent package is absent
            found = False
        if not found:
            missing.append(name)
    if missing:
        raise PeerRequestError(
            "missing_dependency",
            f"peer {kind!r} needs {', '.join(missing)}, not importable by {sys.executable}; "
            f"build its environment as {INSTALL_HINT} says")


def _write_calibration(work_dir: Path, pairs: list[list[str]]) -> Path:
    """A local JSON-lines dataset of the calibration pairs (datasets loads it offline)."""
    directory = work_dir / "calibration"
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "train.jsonl", "w", encoding="utf-8") as handle:
        for pair in pairs:
            handle.write(json.dumps({CALIBRATION_COLUMN: list(pair)}) + "\n")
    return directory


def fastest(candidates: dict[str, Callable[[], object]],
            rounds: int = PRECISION_ROUNDS) -> tuple[str, dict[str, float]]:
    """The candidate whose call takes the least time, and each one's best time in ms.

    Every candidate runs once untimed, then `rounds` rounds run each once, each round starting
    one candidate later, so a stall of the machine costs every candidate a round rather than one
    candidate all its runs (the engine's probe, onnxrank.engine.runtime, times its candidates the
    same way; this file imports only the standard library).
    """
    if not candidates or rounds < 1:
        raise ValueError(f"fastest needs candidates and rounds >= 1, got {len(candidates)} "
                         f"candidates and {rounds} rounds")
    names = list(candidates)
    for name in names:
        candidates[name]()
    best = dict.fromkeys(names, float("inf"))
    for round_index in range(rounds):
        for offset in range(len(names)):
            name = names[(round_index + offset) % len(names)]
            started = time.perf_counter()
            candidates[name]()
            best[name] = min(best[name], (time.perf_counter() - started) * 1000)
    return min(names, key=lambda name: best[name]), best


ScoreFn = Callable[[list[tuple[str, ...]]], list[float]]


def _load_torch(request: dict[str, Any], threads: int) -> tuple[ScoreFn, dict[str, Any]]:
    import sentence_transformers
    import torch

    settings = {**_st_settings(threads), "precision": "fp32"}  # sets torch's threads first
    model = sentence_transformers.CrossEncoder(
        str(request["checkpoint"]), device="cpu", model_kwargs={"dtype": torch.float32},
        **_st_common(request))
    return _st_scorer(model), settings


def _load_openvino(request: dict[str, Any], threads: int, *,
                   static_int8: bool) -> tuple[ScoreFn, dict[str, Any]]:
    import openvino
    import sentence_transformers

    calibration = request.get("calibration") or []
    if not calibration:
        raise PeerRequestError("bad_request", f"{request['kind']} needs calibration pairs (it "
                                              "times its precisions on them)")
    common, work_dir = _st_common(request), Path(request["work_dir"])
    settings = _st_settings(threads)  # sets torch's threads first
    ov_config = {"INFERENCE_NUM_THREADS": threads}
    exported = sentence_transformers.CrossEncoder(
        str(request["checkpoint"]), device="cpu", backend="openvino",
        model_kwargs={"ov_config": ov_config}, **common)
    saved, file_name = work_dir / "openvino", FLOAT_FILE
    if static_int8:
        saved, file_name = _static_int8(exported, work_dir, calibration)
        settings["calibration"] = (f"{len(calibration)} onnxrank calibration pairs (its default, "
                                   "glue/sst2, needs the Hugging Face Hub)")
    else:
        exported.save_pretrained(str(saved))

    def load(hint: str | None) -> Any:
        if hint is None and not static_int8:
            return exported  # the float IR, already compiled at the default hint
        config = ov_config if hint is None else {**ov_config, "INFERENCE_PRECISION_HINT": hint}
        return sentence_transformers.CrossEncoder(
            str(saved), device="cpu", backend="openvino",
            model_kwargs={"ov_config": config, "file_name": file_name}, **common)

    model, settings["precision_probe_ms"] = _faster_precision(
        load, [tuple(pair) for pair in calibration[:BATCH_SIZE]])
    hint = model.transformers_model.request.get_property("INFERENCE_PRECISION_HINT")
    settings["precision"] = ("int8 + " if static_int8 else "") + hint.get_type_name()
    settings["runtime"] += f", OpenVINO {openvino.__version__}"
    return _st_scorer(model), settings


def load_fastembed(view: str, model_file: str, model_name: str,
                   threads: int) -> tuple[ScoreFn, dict[str, Any]]:
    """fastembed's TextCrossEncoder on `model_file` in the directory `view`, registered as the
    custom model `model_name` and loaded from disk (no download): its scorer and settings."""
    import fastembed
    from fastembed.common.model_description import ModelSource
    from fastembed.rerank.cross_encoder import TextCrossEncoder

    registered = {model["model"].lower() for model in TextCrossEncoder.list_supported_models()}
    if model_name.lower() not in registered:
        # the source is never contacted: specific_model_path makes fastembed load from disk
        TextCrossEncoder.add_custom_model(model=model_name, sources=ModelSource(hf=model_name),
                                          model_file=model_file)
    model = TextCrossEncoder(model_name, specific_model_path=view, threads=threads,
                             providers=["CPUExecutionProvider"], local_files_only=True)

    def score(pairs: list[tuple[str, ...]]) -> list[float]:
        return [float(value) for value in model.rerank_pairs(
            [(pair[0], pair[1]) for pair in pairs], batch_size=FASTEMBED_BATCH_SIZE)]

    return score, {"runtime": f"fastembed {fastembed.__version__}", "python": sys.executable,
                   "threads": threads, "batch_size": FASTEMBED_BATCH_SIZE}


def _load_fastembed(request: dict[str, Any], threads: int) -> tuple[ScoreFn, dict[str, Any]]:
    return load_fastembed(str(request["checkpoint"]), str(request["model_file"]),
                          str(request["model_name"]), threads)


# what each kind loads; a new peer is one loader here and its packages in KIND_PACKAGES
LOADERS: dict[str, Callable[[dict[str, Any], int], tuple[ScoreFn, dict[str, Any]]]] = {
    "torch": _load_torch,
    "openvino": functools.partial(_load_openvino, static_int8=False),
    "openvino_int8": functools.partial(_load_openvino, static_int8=True),
    "fastembed": _load_fastembed,
}
KINDS = tuple(LOADERS)


def _st_common(request: dict[str, Any]) -> dict[str, Any]:
    return {"max_length": int(request["max_length"]), "local_files_only": True}


def _st_settings(threads: int) -> dict[str, Any]:
    import sentence_transformers
    import torch

    torch.set_num_threads(threads)
    return {"runtime": f"sentence-transformers {sentence_transformers.__version__}, torch "
                       f"{torch.__version__}",
            "python": sys.executable, "batch_size": BATCH_SIZE, "threads": threads}


def _st_scorer(model: Any) -> ScoreFn:
    import torch

    identity = torch.nn.Identity()

    def score(pairs: list[tuple[str, ...]]) -> list[float]:
        # logits, as the engine's: a float32 sigmoid ties every logit above about 17 at 1.0
        return [float(value) for value in model.predict(
            pairs, batch_size=BATCH_SIZE, show_progress_bar=False, activation_fn=identity)]

    return score


def _static_int8(model: Any, work_dir: Path, calibration: list[list[str]]) -> tuple[Path, str]:
    """export_static_quantized_openvino_model on `model`: the directory and file it saved."""
    from sentence_transformers.backend import export_static_quantized_openvino_model

    saved = work_dir / "openvino_int8"
    model.save_pretrained(str(saved))
    export_static_quantized_openvino_model(
        model, None, str(saved), dataset_name=str(_write_calibration(work_dir, calibration)),
        dataset_config_name="default", dataset_split="train", column_name=CALIBRATION_COLUMN)
    return saved, f"openvino/openvino_model_{INT8_FILE_SUFFIX}.xml"


def _faster_precision(load: Callable[[str | None], Any],
                      pairs: list[tuple[str, ...]]) -> tuple[Any, dict[str, float]]:
    """The model at OpenVINO's default precision hint or at f32, whichever `fastest` times
    faster on `pairs` (the peer at its best, not at its default), and both times in ms."""
    default = load(None)
    hint = default.transformers_model.request.get_property(
        "INFERENCE_PRECISION_HINT").get_type_name()
    if hint == FLOAT_HINT:
        return default, {}
    models = {hint: default, FLOAT_HINT: load(FLOAT_HINT)}
    chosen, times = fastest({name: functools.partial(_st_scorer(model), pairs)
                             for name, model in models.items()})
    return models[chosen], {name: round(ms, 1) for name, ms in times.items()}


class Peer:
    """One loaded peer of a kind in LOADERS."""

    def __init__(self, request: dict[str, Any]) -> None:
        kind = request.get("kind")
        if kind not in LOADERS:
            raise PeerRequestError("bad_request", f"kind must be one of {', '.join(KINDS)}, "
                                                  f"got {kind!r}")
        _require(kind)
        self._score, self.settings = LOADERS[kind](request, int(request["threads"]))

    def score(self, pairs: list[list[str]]) -> tuple[list[float], float]:
        started = time.perf_counter()
        scores = self._score([tuple(pair) for pair in pairs])
        return scores, time.perf_counter() - started


def _answer(peer: Peer | None, request: dict[str, Any]) -> tuple[Peer | None, dict[str, Any]]:
    op = request.get("op")
    if op == "load":
        try:
            peer = Peer(request)
        except PeerRequestError:
            raise
        except Exception as err:  # whatever the peer's libraries raise, as a reply
            raise PeerRequestError("load_failed", f"{type(err).__name__}: {err}") from err
        return peer, {"ok": True, "settings": peer.settings}
    if op == "score":
        if peer is None:
            raise PeerRequestError("bad_request", "score before load")
        try:
            scores, seconds = peer.score(request["pairs"])
        except Exception as err:
            raise PeerRequestError("score_failed", f"{type(err).__name__}: {err}") from err
        return peer, {"ok": True, "scores": scores, "compute_s": seconds}
    raise PeerRequestError("bad_request", f"op must be load or score, got {op!r}")


def serve(requests: TextIO, replies: TextIO) -> None:
    """Answer requests line by line until stdin closes."""
    peer: Peer | None = None
    for line in requests:
        try:
            peer, reply = _answer(peer, json.loads(line))
        except PeerRequestError as err:
            reply = {"ok": False, "error": err.error, "message": str(err)}
        except json.JSONDecodeError as err:
            reply = {"ok": False, "error": "bad_request", "message": f"not JSON: {err}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main() -> None:
    # Replies go to a copy of stdout; fd 1 becomes stderr for every library that prints.
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(sys.stdin, replies)


if __name__ == "__main__":
    main()
