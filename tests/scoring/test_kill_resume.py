"""A real `onnxrank score` process, SIGKILLed mid-run and restarted, writes exactly the rows and scores
of an uninterrupted run, and does not score the finished shards again.

Synchronisation without sleeps or timing: the killed run reads its input from a named pipe that
the test feeds. The test writes two shards and a half, waits until the run's manifest lists the two
finished shards (the run is then blocked reading the third shard's remaining rows, holding half a
shard it has read but not scored), and kills it. The restart reads the same rows from a regular
file at the same path.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from scoring_fixtures import make_lines

from onnxrank.cli import main
from onnxrank.scoring.shards import MANIFEST_NAME, parts_dir_for

SHARD_ROWS = 40
ROWS = 5 * SHARD_ROWS + 13
# Bounds for the waits below; they end as soon as the condition holds.
WAIT_SECONDS = 120.0
POLL_SECONDS = 0.02


def score_argv(input_path: Path, output: Path, model_dir: Path) -> list[str]:
    return [sys.executable, "-m", "onnxrank", "score", "--input", str(input_path),
            "--output", str(output), "--model", str(model_dir), "--precision", "fp32",
            "--device", "cpu", "--shard-rows", str(SHARD_ROWS), "--no-progress"]


def wait_until(condition, process: subprocess.Popen[bytes], what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"onnxrank score exited ({process.returncode}) before {what}: "
                                 f"{process.stderr.read().decode() if process.stderr else ''}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(POLL_SECONDS)


def open_pipe_for_writing(path: Path, process: subprocess.Popen[bytes]) -> int:
    """Open the FIFO's write end once the scoring process has opened its read end."""
    descriptor: list[int] = []

    def opened() -> bool:
        try:
            descriptor.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError as err:
            if err.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
            return False
        return True

    wait_until(opened, process, "the run to open its input")
    os.set_blocking(descriptor[0], True)
    return descriptor[0]


def finished_shards(parts_dir: Path) -> int:
    try:
        return len(json.loads((parts_dir / MANIFEST_NAME).read_text(encoding="utf-8"))["shards"])
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes (POSIX)")
def test_sigkilled_run_resumes_to_exactly_the_uninterrupted_scores(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    lines = make_lines(ROWS, bad_every=17)
    text = "".join(line + "\n" for line in lines)
    reference_input = tmp_path / "reference" / "pairs.jsonl"
    reference_input.parent.mkdir()
    reference_input.write_text(text, encoding="utf-8")
    reference = tmp_path / "reference" / "scores.parquet"
    assert main(score_argv(reference_input, reference, tiny_model_dir)[3:]) == 0

    work = tmp_path / "run"
    work.mkdir()
    pairs, output = work / "pairs.jsonl", work / "scores.parquet"
    os.mkfifo(pairs)
    process = subprocess.Popen(score_argv(pairs, output, tiny_model_dir), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    try:
        pipe = open_pipe_for_writing(pairs, process)
        head = "".join(line + "\n" for line in lines[:2 * SHARD_ROWS + SHARD_ROWS // 2])
        os.write(pipe, head.encode("utf-8"))
        wait_until(lambda: finished_shards(parts_dir_for(output)) == 2, process,
                   "two finished shards")
        process.send_signal(signal.SIGKILL)
        assert process.wait() == -signal.SIGKILL
        os.close(pipe)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not output.exists()
    assert sorted(path.name for path in parts_dir_for(output).glob("shard-*")) == [
        "shard-000000.bad.jsonl", "shard-000000.parquet",
        "shard-000001.bad.jsonl", "shard-000001.parquet"]

    pairs.unlink()
    pairs.write_text(text, encoding="utf-8")
    # a temporary file as a kill during a shard write would leave it: ignored and removed
    (parts_dir_for(output) / ".shard-000002.parquet.tmp-1").write_bytes(b"half a shard")
    restart = subprocess.run(score_argv(pairs, output, tiny_model_dir), capture_output=True,
                             text=True, check=True)
    assert "resumed: 2 of 6 shards were already scored and were not scored again" in restart.stderr

    resumed, uninterrupted = pq.read_table(output), pq.read_table(reference)
    good_rows = [row for row in range(ROWS) if row % 17 != 16]
    assert resumed.num_rows == len(good_rows) == uninterrupted.num_rows
    assert resumed.column("row").to_pylist() == good_rows
    assert resumed.equals(uninterrupted), "resumed run's scores differ from the uninterrupted run's"
    assert (work / "scores.bad_rows.jsonl").read_bytes() == (
        tmp_path / "reference" / "scores.bad_rows.jsonl").read_bytes()
    assert not parts_dir_for(output).exists()
