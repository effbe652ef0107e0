"""Load against rerank, embedding and search servers on loopback: server processes, closed-loop
and open-loop load.

Everything here talks to 127.0.0.1 only, and every loop is bounded in count and in time:

1. `closed_loop`: `clients` concurrent clients, each sending its next request as soon as the
   previous one is answered, until a fixed list of request bodies is used up (or a time limit).
2. `open_loop`: requests sent at a fixed rate for a fixed time whatever the answers, as traffic
   from many independent users arrives; used at about twice the measured capacity to check
   overload behaviour (429s, latency of what is accepted, nothing lost or answered twice).

Servers run as their own processes (`ServerProcess`: ``onnxrank serve``; `InfinityProcess`: the
Infinity peer from its own virtualenv), so the load generator never shares a GIL with them.

The Infinity peer is found on PATH (``infinity_emb``) unless its executable is given; this module
names no place on any machine. It runs from its own virtualenv, so that its pinned dependencies
cannot change this project's (INFINITY_INSTALL says how).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onnxrank._optional import require
from onnxrank.bench.workloads import Request
from onnxrank.errors import MissingDependencyError
from onnxrank.options import config_flags

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 300.0  # loading and warming a model (Infinity imports torch first)
STOP_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 120.0
POLL_S = 0.1
STACKS_TIMEOUT_S = 5.0  # for a server's stack dump (SIGUSR1) to arrive
ADDRESS = re.compile(r"on (http://127\.0\.0\.1:\d+) ")
INFINITY_COMMAND = "infinity_emb"
# How to install the peer into its own virtualenv VENV (then put VENV/bin on PATH, or pass
# VENV/bin/infinity_emb to the bench): torch first, pinned, so that pip does not pick a CUDA build.
INFINITY_INSTALL = ("python3 -m venv VENV && VENV/bin/pip install torch==2.13.0 "
                    "&& VENV/bin/pip install 'infinity-emb[server,torch]'")
# Infinity's and Hugging Face's telemetry and downloads off: the peer runs offline.
OFFLINE_ENV = {"INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}


@dataclass(frozen=True, slots=True)
class Target:
    """One server endpoint under load.

    Attributes:
        name: Contender name in reports and budgets ("serve", "serve_nobatch", "infinity").
        label: Human description.
        url: Full URL of the rerank endpoint.
        bodies: Pre-encoded JSON request bodies, one per workload request (encoding is not timed).
        settings: What runs there, for the report.
    """

    name: str
    label: str
    url: str
    bodies: tuple[bytes, ...]
    settings: dict[str, Any] = field(default_factory=dict)


def cohere_bodies(requests: Sequence[Request], model: str) -> tuple[bytes, ...]:
    """Cohere v1 request bodies (what ``POST /v1/rerank`` of onnxrank and Infinity take)."""
    return tuple(json.dumps({"model": model, "query": request.query,
                             "documents": list(request.documents),
                             "return_documents": False}).encode() for request in requests)


def embedding_bodies(batches: Sequence[Sequence[str]], model: str) -> tuple[bytes, ...]:
    """OpenAI embedding request bodies, float vectors (``POST /v1/embeddings`` of onnxrank,
    ``POST /embeddings`` of Infinity)."""
    return tuple(json.dumps({"model": model, "input": list(texts),
                             "encoding_format": "float"}).encode() for texts in batches)


def search_bodies(queries: Sequence[str], *, k: int, rerank: bool) -> tuple[bytes, ...]:
    """``POST /v1/search`` bodies: hybrid search, optionally reranking the fused candidates."""
    return tuple(json.dumps({"query": query, "k": k, "mode": "hybrid",
                             "rerank": rerank}).encode() for query in queries)


@dataclass
class LoadResult:
    """What a load run saw from the client side.

    Attributes:
        latencies_s: Seconds from send to answer of each answered request, by status.
        statuses: Answers per HTTP status ("error" for a transport failure).
        sent: Requests sent.
        elapsed_s: Wall time of the run.
    """

    latencies_s: dict[int, list[float]] = field(default_factory=dict)
    statuses: Counter[int | str] = field(default_factory=Counter)
    sent: int = 0
    elapsed_s: float = 0.0

    @property
    def answered(self) -> int:
        """Requests that got an HTTP answer (any status)."""
        return sum(count for status, count in self.statuses.items() if status != "error")

    def accepted_latencies_s(self) -> list[float]:
        return self.latencies_s.get(200, [])


# The load generator runs on the machine it loads: its CPU is charged to the server's numbers.
# aiohttp's client costs 0.16 ms of CPU per request against httpx's 0.96-1.15 ms (16 clients on
# loopback, amx: research/load_client_cost.py, docs/serve-bench.md), so the load shows more of
# the server and less of itself.
JSON_HEADERS = {"content-type": "application/json"}


def _session(aiohttp: Any, connections: int) -> Any:
    """An aiohttp client session of at most `connections` keep-alive connections (0: no limit)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections),
                                 timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S))


async def _send(session: Any, url: str, body: bytes, result: LoadResult) -> None:
    started = time.perf_counter()
    result.sent += 1
    try:
        async with session.post(url, data=body, headers=JSON_HEADERS) as response:
            await response.read()
    except Exception as err:  # a transport failure is a lost request: it is counted, not raised
        logger.warning("request to %s failed: %r", url, err)
        result.statuses["error"] += 1
        return
    result.statuses[response.status] += 1
    result.latencies_s.setdefault(response.status, []).append(time.perf_counter() - started)


async def _closed_loop(url: str, bodies: Sequence[bytes], clients: int,
                       time_limit_s: float) -> LoadResult:
    aiohttp = require("aiohttp", extra="serve-test")
    result = LoadResult()
    next_body = iter(range(len(bodies)))
    stop_at = time.perf_counter() + time_limit_s
    async with _session(aiohttp, clients) as session:

        async def one_client() -> None:
            for index in next_body:  # shared iterator: each body is sent once, by one client
                if time.perf_counter() >= stop_at:
                    return
                await _send(session, url, bodies[index], result)

        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        result.elapsed_s = time.perf_counter() - started
    return result


def closed_loop(url: str, bodies: Sequence[bytes], *, clients: int,
                time_limit_s: float) -> LoadResult:
    """Send every body once through `clients` concurrent closed-loop clients (bounded in time).

    Raises:
        ValueError: clients < 1 or no bodies.
    """
    if clients < 1 or not bodies:
        raise ValueError(f"need clients >= 1 and at least one body, got {clients} and {len(bodies)}")
    return asyncio.run(_closed_loop(url, bodies, clients, time_limit_s))


async def _open_loop(url: str, bodies: Sequence[bytes], rate_per_s: float,
                     duration_s: float) -> LoadResult:
    aiohttp = require("aiohttp", extra="serve-test")
    result = LoadResult()
    count = max(1, int(rate_per_s * duration_s))
    interval = 1.0 / rate_per_s
    async with _session(aiohttp, 0) as session:
        started = time.perf_counter()
        tasks = []
        for index in range(count):  # bounded: rate x duration requests, then stop sending
            delay = started + index * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(
                _send(session, url, bodies[index % len(bodies)], result)))
        await asyncio.wait_for(asyncio.gather(*tasks), REQUEST_TIMEOUT_S + duration_s)
        result.elapsed_s = time.perf_counter() - started
    return result


def open_loop(url: str, bodies: Sequence[bytes], *, rate_per_s: float,
              duration_s: float) -> LoadResult:
    """Send ``rate_per_s * duration_s`` requests at a fixed rate, answered or not.

    Raises:
        ValueError: A non-positive rate or duration, or no bodies.
    """
    if rate_per_s <= 0 or duration_s <= 0 or not bodies:
        raise ValueError(f"need rate_per_s > 0, duration_s > 0 and bodies, got {rate_per_s}, "
                         f"{duration_s} and {len(bodies)}")
    return asyncio.run(_open_loop(url, bodies, rate_per_s, duration_s))


# --- server processes --------------------------------------------------------------------------


SERVING_MODULES = ("starlette", "uvicorn", "prometheus_client", "httpx", "aiohttp")


def missing_serving_dependency() -> str | None:
    """Why the serving scenario cannot run here (a module of the serve extras is missing)."""
    for module in SERVING_MODULES:
        try:
            require(module, extra="serve-test")
        except MissingDependencyError as err:
            return str(err)
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process (Linux /proc), or None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _wait_http_ok(url: str, process: subprocess.Popen[str], timeout_s: float) -> None:
    httpx = require("httpx", extra="serve-test")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with status {process.returncode} before {url} "
                               "answered")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(POLL_S)
    raise TimeoutError(f"{url} did not answer 200 within {timeout_s:.0f} s")


class _Process:
    """A server subprocess, stopped with SIGTERM (then killed if it does not exit)."""

    dumps_stacks = False  # whether SIGUSR1 makes it print every thread's stack

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        logger.info("starting %s", " ".join(command))
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.tail: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stream = self.process.stderr
        if stream is None:
            return
        for line in stream:
            self.lines.put(line)
            self.tail = [*self.tail[-20:], line.rstrip()]

    @property
    def rss_bytes(self) -> int | None:
        return rss_bytes(self.process.pid)

    def stacks(self) -> list[str]:
        """The lines a running ``onnxrank serve`` writes on SIGUSR1 (every thread's stack), for
        the error of a start that did not finish; none for another server or a dead one."""
        if not (self.dumps_stacks and hasattr(signal, "SIGUSR1")) or self.process.poll() is not None:
            return []
        self.process.send_signal(signal.SIGUSR1)
        lines, deadline = [], time.monotonic() + STACKS_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                lines.append(self.lines.get(timeout=POLL_S * 5).rstrip())
            except queue.Empty:
                if lines:  # the dump is written at once: a pause after it ends it
                    break
        return lines

    def stop(self) -> int | None:
        """SIGTERM, wait (bounded), kill if needed; returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        self._reader.join(STOP_TIMEOUT_S)
        if self.process.stderr is not None:
            self.process.stderr.close()
        return self.process.returncode


class ServerProcess(_Process):
    """``onnxrank serve`` in its own process on a free loopback port.

    Args:
        model_dirs: The exported model directories (rerank or embedding), served under their
            manifests' names.
        threads: Engine threads of the process (divided between the models).
        batching: Cross-request batching on or off.
        engine_options: EngineConfig fields the bench run sets (``--precision`` ...), passed on
            as the same flags.
        index: An index directory for ``POST /v1/search``, or None.
        extra_args: More ``onnxrank serve`` flags.
    """

    dumps_stacks = True

    def __init__(self, model_dirs: Sequence[Path], *, threads: int, batching: bool,
                 engine_options: Mapping[str, Any] | None = None, index: Path | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        models = [argument for model_dir in model_dirs for argument in ("--model", str(model_dir))]
        indexed = [] if index is None else ["--index", str(index)]
        command = [sys.executable, "-m", "onnxrank", "serve", *models, *indexed,
                   "--host", LOOPBACK, "--port", "0", "--threads", str(threads),
                   "--batching" if batching else "--no-batching",
                   *config_flags(engine_options or {}), *extra_args]
        # The flags say everything: no ONNXRANK_* twin of the caller's environment applies.
        env = {name: value for name, value in os.environ.items()
               if not name.startswith("ONNXRANK_")}
        super().__init__(command, env)
        self.base_url = self._address()
        try:
            _wait_http_ok(f"{self.base_url}/ready", self.process, START_TIMEOUT_S)
        except TimeoutError as err:
            stacks = self.stacks()
            self.stop()
            raise TimeoutError(f"{err}; its threads' stacks: {' | '.join(stacks)}") from err

    def _address(self) -> str:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=POLL_S * 10)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            match = ADDRESS.search(line)
            if match:
                return match.group(1)
        stacks = self.stacks()
        self.stop()
        raise RuntimeError("onnxrank serve did not print its address: " + " | ".join(self.tail)
                           + ("; its threads' stacks: " + " | ".join(stacks) if stacks else ""))

    def metrics_text(self) -> str:
        httpx = require("httpx", extra="serve-test")
        return str(httpx.get(f"{self.base_url}/metrics", timeout=30).text)


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called `name` with `labels` in Prometheus text."""
    parser = require("prometheus_client.parser", extra="serve")
    return float(sum(sample.value for family in parser.text_string_to_metric_families(text)
                     for sample in family.samples
                     if sample.name == name and all(sample.labels.get(key) == value
                                                    for key, value in labels.items())))


def infinity_executable(explicit: str | Path | None = None) -> Path:
    """Infinity's ``infinity_emb`` command: `explicit` when given, else the one on PATH.

    Raises:
        FileNotFoundError: Neither exists; the message says how to install the peer.
    """
    if explicit is not None:
        if Path(explicit).is_file():
            return Path(explicit)
        raise FileNotFoundError(f"Infinity's executable {explicit} does not exist; install it "
                                f"into its own virtualenv: {INFINITY_INSTALL}")
    found = shutil.which(INFINITY_COMMAND)
    if found is None:
        raise FileNotFoundError(
            f"Infinity ({INFINITY_COMMAND}) is not on PATH; install it into its own virtualenv "
            f"({INFINITY_INSTALL}), then put VENV/bin on PATH or give VENV/bin/{INFINITY_COMMAND} "
            "to the bench")
    return Path(found)


class InfinityProcess(_Process):
    """Infinity (``infinity_emb v2``) serving a Hugging Face checkpoint directory on loopback,
    telemetry and downloads off (a rerank or an embedding checkpoint: Infinity finds which).

    Args:
        checkpoint_dir: The Hugging Face checkpoint (``models/<name>/checkpoint``).
        threads: Torch threads.
        batch_size: Infinity's batch size.
        executable: ``infinity_emb`` to run; None: the one on PATH.

    Raises:
        FileNotFoundError: Infinity or the checkpoint is missing (the message says how to
            install Infinity).
        RuntimeError / TimeoutError: It did not start.
    """

    def __init__(self, checkpoint_dir: Path, *, threads: int, batch_size: int = 32,
                 executable: str | Path | None = None) -> None:
        executable = infinity_executable(executable)
        if not (checkpoint_dir / "config.json").is_file():
            raise FileNotFoundError(f"could not find config.json in {checkpoint_dir}: Infinity "
                                    "needs the Hugging Face checkpoint of the model")
        self.port = free_port()
        command = [str(executable), "v2", "--model-id", str(checkpoint_dir), "--engine", "torch",
                   "--device", "cpu", "--host", LOOPBACK, "--port", str(self.port),
                   "--batch-size", str(batch_size), "--served-model-name", "peer"]
        env = {**os.environ, **OFFLINE_ENV, "OMP_NUM_THREADS": str(threads),
               "MKL_NUM_THREADS": str(threads)}
        super().__init__(command, env)
        self.base_url = f"http://{LOOPBACK}:{self.port}"
        try:
            _wait_http_ok(f"{self.base_url}/health", self.process, START_TIMEOUT_S)
        except (RuntimeError, TimeoutError) as err:
            self.stop()
            raise RuntimeError(f"{err}; Infinity said: " + " | ".join(self.tail)) from err


def latency_stats(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99 (and min/max/mean) in milliseconds of request latencies."""
    import numpy as np

    if not seconds:
        return {}
    values = np.asarray(seconds, dtype=np.float64) * 1000.0
    return {"n": int(values.size), "min_ms": float(values.min()),
            "p50_ms": float(np.percentile(values, 50)), "p95_ms": float(np.percentile(values, 95)),
            "p99_ms": float(np.percentile(values, 99)), "max_ms": float(values.max()),
            "mean_ms": float(values.mean())}
