"""The fastest paths users already have, each at its best, as bench contenders (the peers scenario).

In this process, beside onnxrank (their packages install without changing any of its versions):

- ``ct2``: CTranslate2 int8. ``TransformersConverter`` converts the checkpoint's encoder (it knows
  BertModel, not the classification head), the head (pooler output -> logits) runs in numpy; pairs
  are sorted by length and scored in batches of 32 with the best int8 compute type the CPU has.
- ``flashrank``: FlashRank's ``Ranker`` on our int8 file (where the export's gate left it out,
  onnxruntime's dynamic int8 of ``model.onnx``, written for it). It only loads its own model names from
  ``cache_dir/<name>/<file>`` and downloads them when absent; a directory of links under its
  int8 MiniLM entry's name makes it load ours, offline. One session.run per query (its way), its
  onnxruntime session without a thread setting (its way too: every core).

In a child process of another interpreter (``onnxrank bench --peer-python PATH``; their package,
optimum-intel, pins transformers below onnxrank's export): sentence-transformers on OpenVINO and
its static int8 export (onnxrank/bench/peer_worker.py says how each is built); there too the
latency scenario's fastembed rows, where fastembed (which pins huggingface-hub below today's
stack) is not installed beside onnxrank (`fastembed_peer`). Their time is the child's own
scoring time; the pipe's round trip is reported beside it, not counted.

sentence-transformers on ONNX with its quantized export cannot take part: see ONNX_SKIP_REASON.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
from tokenizers import Tokenizer

from onnxrank._optional import require
from onnxrank.bench import peer_worker
from onnxrank.bench.baselines import (
    checkpoint_dir,
    fastembed_label,
    fastembed_model_file,
    fastembed_model_name,
    fastembed_settings,
    fastembed_view,
)
from onnxrank.engine.spec import ModelSpec, verify_files
from onnxrank.errors import DeviceUnavailableError, MissingDependencyError, ModelLoadError
from onnxrank.export.quantize import Int8Settings, quantize_int8
from onnxrank.types import Pair, Scores

logger = logging.getLogger(__name__)

CT2_BATCH_SIZE = 32
# the int8 compute types CTranslate2 may offer on a CPU, best first (int8 activations throughout;
# int8_float32 keeps non-GEMM layers in fp32)
CT2_COMPUTE_TYPES = ("int8", "int8_float32")
# FlashRank's int8 MiniLM cross-encoder: the name and file Ranker expects under cache_dir
FLASHRANK_MODEL = "ms-marco-MiniLM-L-12-v2"
FLASHRANK_FILES = ("tokenizer.json", "config.json", "special_tokens_map.json", "tokenizer_config.json")
# the file written for FlashRank where the export kept no int8 variant
FLASHRANK_DYNAMIC_FILE = "dynamic_int8.onnx"
ONNX_SKIP_REASON = (
    "sentence-transformers on ONNX with export_dynamic_quantized_onnx_model skipped: its extra "
    "(optimum-onnx) takes transformers to 4.57.6, on which sentence-transformers 6 cannot run, "
    "in onnxrank's environment and in a second one alike")
# the worker's kinds the peers scenario runs; a child peer's bench name is "st_" + its kind
CHILD_PEERS = ("openvino", "openvino_int8")
CHILD_LABELS = {
    "torch": "sentence-transformers CrossEncoder (PyTorch fp32) in a child process",
    "openvino": 'sentence-transformers CrossEncoder(backend="openvino") at its faster precision '
                "(OpenVINO's default hint or f32)",
    "openvino_int8": "sentence-transformers export_static_quantized_openvino_model (defaults), its "
                     "float part at the faster hint",
}
PEER_PYTHON_HINT = ("not run: pass --peer-python PATH, the interpreter of an environment with "
                    "sentence-transformers[openvino] and datasets, built as "
                    f"{peer_worker.INSTALL_HINT} says")
CHILD_START_TIMEOUT_S = 900.0  # the static int8 export calibrates a full-size model on 2 cores
CHILD_ERRORS = {"missing_dependency": MissingDependencyError}


def _cpu_only(name: str, device: str) -> None:
    if device != "cpu":
        raise DeviceUnavailableError(f"the {name} peer runs on CPU only in the bench")


def _checkpoint_with_position_type(checkpoint: Path) -> Path:
    """A copy of the checkpoint's files (links) whose config.json names BERT's absolute position
    embeddings: transformers 5 dropped the attribute, CTranslate2's converter asserts on it."""
    view = Path(tempfile.mkdtemp(prefix="onnxrank-bench-ct2-checkpoint-"))
    for path in checkpoint.iterdir():
        if path.name != "config.json":
            (view / path.name).symlink_to(path.resolve())
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    config.setdefault("position_embedding_type", "absolute")
    (view / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return view


class CTranslate2Peer:
    """CTranslate2 int8 encoder + the classification head in numpy, length-sorted batches.

    Raises:
        MissingDependencyError: ctranslate2 or safetensors is not installed.
        DeviceUnavailableError: device is not "cpu".
        ModelLoadError: No checkpoint or no model.safetensors in it, a head other than one logit,
            or the converter fails.
    """

    name = "ct2"

    def __init__(self, spec: ModelSpec, model_dir: Path, *, device: str, threads: int) -> None:
        _cpu_only(self.name, device)
        checkpoint = checkpoint_dir(spec, model_dir)
        ctranslate2 = require("ctranslate2", extra="bench")
        converters = require("ctranslate2.converters", extra="bench")
        if not (checkpoint / "model.safetensors").is_file():
            raise ModelLoadError(f"the ct2 peer reads the classifier head from model.safetensors, "
                                 f"which is not in {checkpoint}")
        weights = require("safetensors.numpy", extra="bench").load_file(
            str(checkpoint / "model.safetensors"))
        if "classifier.weight" not in weights or weights["classifier.weight"].shape[0] != 1:
            raise ModelLoadError(f"the ct2 peer applies a one-logit classifier head; "
                                 f"{checkpoint}/model.safetensors has none")
        self._head = (weights["classifier.weight"][0].astype(np.float32),
                      float(weights["classifier.bias"][0]))
        work = Path(tempfile.mkdtemp(prefix="onnxrank-bench-ct2-"))
        weakref.finalize(self, shutil.rmtree, work, ignore_errors=True)
        source = _checkpoint_with_position_type(checkpoint)
        try:
            converters.TransformersConverter(str(source)).convert(
                str(work / "model"), quantization="int8", force=True)
        except Exception as err:  # the converter raises whatever its loaders raise
            raise ModelLoadError(f"CTranslate2 could not convert {checkpoint}: {err}") from err
        finally:
            shutil.rmtree(source, ignore_errors=True)
        supported = ctranslate2.get_supported_compute_types("cpu")
        compute_type = next(kind for kind in (*CT2_COMPUTE_TYPES, "float32") if kind in supported)
        self._encoder = ctranslate2.Encoder(str(work / "model"), device="cpu",
                                            compute_type=compute_type, intra_threads=threads)
        self._tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
        self._tokenizer.no_padding()  # CTranslate2 takes ragged batches: padding would be read
        self._tokenizer.enable_truncation(spec.max_length)
        self.settings: dict[str, Any] = {
            "runtime": f"CTranslate2 {ctranslate2.__version__}", "device": "cpu",
            "precision": compute_type, "threads": threads, "batch_size": CT2_BATCH_SIZE,
            "batching": "pairs sorted by length", "head": "pooler output -> logit in numpy",
            "checkpoint": str(checkpoint)}
        self.label = f"CTranslate2 {compute_type} (length-sorted batches of {CT2_BATCH_SIZE})"

    def score(self, pairs: Sequence[Pair]) -> Scores:
        """Logits of the pairs, in input order."""
        encodings = self._tokenizer.encode_batch(list(pairs))
        order = np.argsort([len(encoding.ids) for encoding in encodings], kind="stable")
        scores = np.empty(len(pairs), dtype=np.float32)
        weight, bias = self._head
        for start in range(0, len(order), CT2_BATCH_SIZE):
            batch = order[start:start + CT2_BATCH_SIZE]
            output = self._encoder.forward_batch(
                [encodings[i].tokens for i in batch],
                token_type_ids=[encodings[i].type_ids for i in batch])
            scores[batch] = np.asarray(output.pooler_output, dtype=np.float32) @ weight + bias
        return scores


class FlashRankPeer:
    """FlashRank's Ranker on an int8 file of the model, loaded offline through a directory of
    links: the export's `int8` file, or where the export's gate left it out, onnxruntime's dynamic
    int8 of ``model.onnx`` (the export's dynamic recipe, ungated) written for it.

    Raises:
        MissingDependencyError: flashrank is not installed.
        DeviceUnavailableError: device is not "cpu".
        ModelLoadError: A file FlashRank reads is missing or does not match the manifest.
    """

    name = "flashrank"

    def __init__(self, spec: ModelSpec, model_dir: Path, *, device: str, threads: int) -> None:
        _cpu_only(self.name, device)
        flashrank = require("flashrank", extra="bench")
        config = require("flashrank.Config", extra="bench")
        checkpoint = checkpoint_dir(spec, model_dir)
        cache = Path(tempfile.mkdtemp(prefix="onnxrank-bench-flashrank-"))
        weakref.finalize(self, shutil.rmtree, cache, ignore_errors=True)
        model_file, origin = _flashrank_int8_file(spec, Path(model_dir), cache)
        view = cache / FLASHRANK_MODEL
        view.mkdir()
        (view / config.model_file_map[FLASHRANK_MODEL]).symlink_to(model_file)
        for name in FLASHRANK_FILES:
            source = checkpoint / name
            if not source.is_file():
                raise ModelLoadError(f"the FlashRank peer needs {name} in {checkpoint}")
            (view / name).symlink_to(source.resolve())
        tokenizer_config = json.loads((checkpoint / "tokenizer_config.json").read_text("utf-8"))
        tokenizer_config["model_max_length"] = spec.max_length  # it truncates at the smaller
        (view / "tokenizer_config.json").unlink()
        (view / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), "utf-8")
        # Ranker calls logging.basicConfig; WARNING keeps its per-call debug lines out
        self._ranker = flashrank.Ranker(model_name=FLASHRANK_MODEL, cache_dir=str(cache),
                                        max_length=spec.max_length, log_level="WARNING")
        self._request = flashrank.RerankRequest
        self.settings = {
            "runtime": f"FlashRank {getattr(flashrank, '__version__', '0.2')}", "device": "cpu",
            "precision": "int8", "model_file": str(model_file), "int8_file": origin,
            "threads": "onnxruntime default (every core): Ranker sets none",
            "batching": "one session.run per query, padded to its longest pair"}
        self.label = f"FlashRank Ranker ({origin}, one batch per query)"

    def score(self, pairs: Sequence[Pair]) -> Scores:
        """Scores of the pairs (its sigmoid of the logit), in input order; one Ranker.rerank per
        run of pairs that share a query."""
        scores = np.empty(len(pairs), dtype=np.float32)
        start = 0
        while start < len(pairs):
            query = pairs[start][0]
            end = start
            while end < len(pairs) and pairs[end][0] == query:
                end += 1
            passages = [{"id": index, "text": pairs[index][1]} for index in range(start, end)]
            for passage in self._ranker.rerank(self._request(query=query, passages=passages)):
                scores[passage["id"]] = passage["score"]
            start = end
        return scores


def _flashrank_int8_file(spec: ModelSpec, model_dir: Path, cache: Path) -> tuple[Path, str]:
    """The int8 file FlashRank runs and where it came from: the export's `int8` variant, else
    onnxruntime's dynamic int8 of the fp32 graph, written under `cache`."""
    if "int8" in spec.variants:
        verify_files(spec, model_dir, ["int8"])
        return (model_dir / spec.variants["int8"].file).resolve(), "our int8 file"
    verify_files(spec, model_dir, ["fp32"])
    out = cache / FLASHRANK_DYNAMIC_FILE
    quantize_int8(fp32_path=model_dir / spec.variants["fp32"].file, opt_path=None, out_path=out,
                  settings=Int8Settings("dynamic"))
    return out, "onnxruntime dynamic int8 of model.onnx, ungated: the export kept no int8 file"


class ChildPeer:
    """A peer in a child process of `python` (onnxrank.bench.peer_worker): build one with
    `sentence_transformers_peer` or `fastembed_peer`.

    Args:
        name: The bench's name of the row.
        label: What the row runs, in words.
        load: The worker's load request without its ``op`` and ``work_dir`` (``kind`` one of
            peer_worker.KINDS).
        device: Only "cpu".
        python: The interpreter of the peer's environment.

    Raises:
        MissingDependencyError: The child's environment lacks the peer's packages.
        DeviceUnavailableError: device is not "cpu".
        ModelLoadError: The interpreter cannot start, or the peer fails to load.
    """

    def __init__(self, name: str, label: str, load: dict[str, Any], *, device: str,
                 python: str) -> None:
        _cpu_only(name, device)
        self.name = name
        self._python = python
        self._work = Path(tempfile.mkdtemp(prefix=f"onnxrank-bench-{name}-"))
        self._stderr: IO[bytes] = open(self._work / "stderr.log", "w+b")  # noqa: SIM115
        try:
            # -I: the worker's own directory (onnxrank/bench, which has a profile.py) and the
            # user's site stay off its path
            self._process = subprocess.Popen(
                [python, "-I", peer_worker.__file__], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=self._stderr, text=True, encoding="utf-8")
        except OSError as err:
            self._stderr.close()
            shutil.rmtree(self._work, ignore_errors=True)
            raise ModelLoadError(f"could not start the peer interpreter {python}: {err}") from err
        weakref.finalize(self, _stop, self._process, self._work, self._stderr)
        reply = self._ask({**load, "op": "load", "work_dir": str(self._work)},
                          timeout_s=CHILD_START_TIMEOUT_S)
        self.settings: dict[str, Any] = {**reply["settings"], "device": "cpu",
                                         "timed": "the child's scoring time, without the pipe"}
        self.label = label
        self.compute_s: list[float] = []  # per score call, the child's own time
        self.round_trip_s: list[float] = []  # per score call, the pipe's share of the wall time

    def _ask(self, request: dict[str, Any], *, timeout_s: float | None = None) -> dict[str, Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        try:
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            line = self._process.stdout.readline()
        except (BrokenPipeError, OSError) as err:
            line = ""
            logger.warning("peer %s pipe failed: %s", self.name, err)
        if not line:
            self._process.wait(timeout=timeout_s)
            raise ModelLoadError(f"peer {self.name} ({self._python}) exited with "
                                 f"status {self._process.returncode}: {self._stderr_tail()}")
        reply: dict[str, Any] = json.loads(line)
        if not reply["ok"]:
            error = CHILD_ERRORS.get(reply["error"], ModelLoadError)
            raise error(f"peer {self.name}: {reply['error']}: {reply['message']}")
        return reply

    def _stderr_tail(self, chars: int = 1500) -> str:
        self._stderr.flush()
        self._stderr.seek(0, os.SEEK_END)
        self._stderr.seek(max(0, self._stderr.tell() - chars))
        return self._stderr.read().decode("utf-8", "replace").strip()

    def score(self, pairs: Sequence[Pair]) -> Scores:
        """Scores of the pairs, in input order; records the child's time and the pipe's."""
        started = time.perf_counter()
        reply = self._ask({"op": "score", "pairs": [list(pair) for pair in pairs]})
        wall = time.perf_counter() - started
        self.compute_s.append(float(reply["compute_s"]))
        self.round_trip_s.append(wall - float(reply["compute_s"]))
        return np.asarray(reply["scores"], dtype=np.float32)

    def last_compute_s(self) -> float:
        """The child's time of the last score call (what the harness times)."""
        return self.compute_s[-1]


def child_peer_name(kind: str) -> str:
    """The bench's name of a sentence-transformers worker kind: "st_openvino" for "openvino"."""
    return f"st_{kind}"


def sentence_transformers_peer(kind: str, spec: ModelSpec, model_dir: Path, *, device: str,
                               threads: int, python: str,
                               calibration: Sequence[Pair] = ()) -> ChildPeer:
    """sentence-transformers' CrossEncoder path `kind` ("torch", "openvino", "openvino_int8")
    on the model's checkpoint in a child of `python`, named child_peer_name(kind).

    Args:
        calibration: Pairs the OpenVINO kinds time their precisions on (and the static int8
            export calibrates on).

    Raises:
        As ChildPeer; ModelLoadError also when the model directory has no checkpoint.
    """
    name = child_peer_name(kind)
    _cpu_only(name, device)
    return ChildPeer(name, CHILD_LABELS[kind], {
        "kind": kind, "checkpoint": str(checkpoint_dir(spec, model_dir)),
        "max_length": spec.max_length, "threads": threads,
        "calibration": [list(pair) for pair in calibration]}, device=device, python=python)


def fastembed_peer(spec: ModelSpec, model_dir: Path, *, name: str, device: str, threads: int,
                   python: str, variant: str = "int8") -> ChildPeer:
    """The fastembed row `name` on our `variant` file (as onnxrank.bench.baselines.
    FastembedBaseline) in a child of `python`: for where fastembed does not install beside
    onnxrank.

    Raises:
        As ChildPeer and fastembed_model_file.
    """
    model_dir = Path(model_dir)
    model_file = fastembed_model_file(spec, model_dir, variant=variant, device=device)
    view = fastembed_view(spec, model_dir, model_file)
    try:
        peer = ChildPeer(name, fastembed_label(variant) + " in a child process",
                         {"kind": "fastembed", "checkpoint": str(view), "model_file": model_file,
                          "model_name": fastembed_model_name(spec, variant), "threads": threads},
                         device=device, python=python)
    except BaseException:
        shutil.rmtree(view, ignore_errors=True)
        raise
    weakref.finalize(peer, shutil.rmtree, view, ignore_errors=True)
    peer.settings.update(fastembed_settings(spec, model_dir, model_file, variant=variant))
    return peer


def _stop(process: subprocess.Popen[str], work: Path, stderr: IO[bytes]) -> None:
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
    stderr.close()
    shutil.rmtree(work, ignore_errors=True)
