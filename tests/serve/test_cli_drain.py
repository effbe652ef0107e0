"""`onnxrank serve` as a process: flags through their environment twins, and SIGTERM drain
(stop accepting, finish what is queued, exit 0, every accepted request answered)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import DOCUMENTS, QUERY, WAIT_S, poll

ADDRESS = re.compile(r"on (http://127\.0\.0\.1:\d+) ")


@pytest.fixture
def serve_process(tiny_model_dir: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`onnxrank serve` on a free port, batching off (so requests queue one behind another)."""
    env = {**os.environ, "ONNXRANK_SERVE_PORT": "0", "ONNXRANK_SERVE_BATCHING": "false",
           "ONNXRANK_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "onnxrank", "serve", "--model", str(tiny_model_dir),
         "--precision", "fp32", "--device", "cpu"],
        env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in process.stderr],
                              daemon=True)
    reader.start()
    try:
        seen = []
        address = None
        while address is None:
            try:
                line = lines.get(timeout=WAIT_S)
            except queue.Empty:
                pytest.fail(f"onnxrank serve printed no address in {WAIT_S} s: {seen}")
            seen.append(line)
            match = ADDRESS.search(line)
            address = match.group(1) if match else None
        yield process, address
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(WAIT_S)
        reader.join(WAIT_S)
        process.stderr.close()


def queue_depth(client: httpx.Client) -> float:
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            if sample.name == "onnxrank_queue_depth":
                return sample.value
    return 0.0


def test_sigterm_finishes_what_is_queued_then_exits(
    serve_process: tuple[subprocess.Popen[str], str],
) -> None:
    process, address = serve_process
    client = httpx.Client(base_url=address, timeout=WAIT_S)
    poll(lambda: client.get("/ready").status_code == 200, "/ready")
    # Heavy enough that several requests wait behind the one running.
    documents = [" ".join(DOCUMENTS * 6)[: 2000 + index] for index in range(400)]
    body = {"query": QUERY, "documents": documents, "top_n": 5}

    def send(_: int) -> int:
        with httpx.Client(base_url=address, timeout=WAIT_S) as own:
            return own.post("/v1/rerank", json=body).status_code

    with ThreadPoolExecutor(max_workers=6) as pool:
        futures = [pool.submit(send, index) for index in range(6)]
        # One request runs, five wait: SIGTERM comes while all six are held by the server.
        poll(lambda: queue_depth(client) == 5, "five requests to queue behind the running one")
        client.close()
        process.send_signal(signal.SIGTERM)
        statuses = [future.result(WAIT_S) for future in futures]
    assert statuses == [200] * 6
    assert process.wait(WAIT_S) == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{address}/health", timeout=5)


def test_bad_setting_is_a_clear_error(tiny_model_dir: Path) -> None:
    env = {**os.environ, "ONNXRANK_SERVE_MAX_QUEUE": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "onnxrank", "serve", "--model", str(tiny_model_dir)],
        env=env, capture_output=True, text=True, timeout=WAIT_S)
    assert result.returncode == 2
    assert "max_queue must be a number >= 1, got 0" in result.stderr
