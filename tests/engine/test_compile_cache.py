"""OpenVINO's compiled-model cache: entries per model and settings, hits across processes, and a
cache directory that cannot be used never stops a load."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from onnxrank import Reranker
from onnxrank.engine.config import EngineConfig
from onnxrank.engine.runtime import COMPILE_CACHE_DIR, compile_cache_root, user_cache_dir

PAIRS = [("wing flutter", "flutter of a wing in a slipstream"), ("heat", "heat transfer in slabs")]
# A new process loads the model through the same cache and prints what its device_info says.
LOAD_IN_NEW_PROCESS = """
import json, sys
from onnxrank import Reranker
reranker = Reranker.from_dir(sys.argv[1], device="cpu", backend="openvino", precision="fp32",
                             threads=1, compile_cache_dir=sys.argv[2])
info = reranker.device_info
print(json.dumps({"compile_cache": info.compile_cache, "load_ms": info.load_ms,
                  "scores": reranker.score([tuple(pair) for pair in json.loads(sys.argv[3])]).tolist()}))
"""


def load(model_dir: Path, cache_dir: Path | str) -> Reranker:
    return Reranker.from_dir(model_dir, device="cpu", backend="openvino", precision="fp32",
                             threads=1, compile_cache_dir=str(cache_dir))


def entries(cache_dir: Path) -> list[Path]:
    """Published entry directories (not staging ones, which start with a dot)."""
    return sorted(path for path in cache_dir.iterdir() if not path.name.startswith("."))


@pytest.fixture(scope="module")
def reference_scores(tiny_model_dir: Path) -> np.ndarray:
    return Reranker.from_dir(tiny_model_dir, device="cpu", backend="onnxruntime",
                             precision="fp32").score(PAIRS)


def test_a_second_process_loads_from_the_cache(tiny_model_dir: Path, tmp_path: Path,
                                                reference_scores: np.ndarray) -> None:
    cache_dir = tmp_path / "compiled"
    first = load(tiny_model_dir, cache_dir)
    assert first.device_info.compile_cache == "miss"
    assert first.device_info.load_ms > 0
    [entry] = entries(cache_dir)
    assert [path.suffix for path in entry.iterdir()] == [".blob"]
    assert not [path for path in cache_dir.iterdir() if path.name.startswith(".")]  # no staging left
    result = subprocess.run(
        [sys.executable, "-c", LOAD_IN_NEW_PROCESS, str(tiny_model_dir), str(cache_dir),
         json.dumps(PAIRS)], capture_output=True, text=True, timeout=120, check=True)
    second = json.loads(result.stdout.strip().splitlines()[-1])
    assert second["compile_cache"] == "hit"
    assert second["load_ms"] > 0
    np.testing.assert_allclose(second["scores"], reference_scores, atol=1e-4)
    assert entries(cache_dir) == [entry]


def test_each_file_and_setting_gets_its_own_entry(tiny_model_dir: Path, tmp_path: Path) -> None:
    cache_dir = tmp_path / "compiled"
    load(tiny_model_dir, cache_dir)
    Reranker.from_dir(tiny_model_dir, device="cpu", backend="openvino", precision="fp32",
                      threads=2, compile_cache_dir=str(cache_dir))
    # the same files in another directory: OpenVINO keys its blobs by path, so do the entries
    elsewhere = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, elsewhere, ignore=shutil.ignore_patterns("checkpoint"))
    assert load(elsewhere, cache_dir).device_info.compile_cache == "miss"
    assert len(entries(cache_dir)) == 3
    assert load(tiny_model_dir, cache_dir).device_info.compile_cache == "hit"


def test_a_corrupt_entry_is_recompiled(tiny_model_dir: Path, tmp_path: Path,
                                       reference_scores: np.ndarray) -> None:
    cache_dir = tmp_path / "compiled"
    load(tiny_model_dir, cache_dir)
    [entry] = entries(cache_dir)
    for blob in entry.iterdir():  # a half-written or damaged blob
        blob.chmod(0o600)
        blob.write_bytes(blob.read_bytes()[: blob.stat().st_size // 2])
    damaged = load(tiny_model_dir, cache_dir)
    assert damaged.device_info.compile_cache == "miss"
    np.testing.assert_allclose(damaged.score(PAIRS), reference_scores, atol=1e-4)
    assert load(tiny_model_dir, cache_dir).device_info.compile_cache == "hit"


def test_an_unusable_cache_dir_does_not_stop_loading(
    tiny_model_dir: Path, tmp_path: Path, reference_scores: np.ndarray,
    caplog: pytest.LogCaptureFixture,
) -> None:
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("not a cache\n")
    reranker = load(tiny_model_dir, not_a_dir)
    assert reranker.device_info.compile_cache == "off"
    assert f"OpenVINO compile cache {not_a_dir} not used for" in caplog.text
    np.testing.assert_allclose(reranker.score(PAIRS), reference_scores, atol=1e-4)
    assert not_a_dir.read_text() == "not a cache\n"
    # a directory full of someone else's files: our entry goes next to them
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "12345.blob").write_bytes(b"\x00" * 64)
    assert load(tiny_model_dir, foreign).device_info.compile_cache == "miss"
    assert load(tiny_model_dir, foreign).device_info.compile_cache == "hit"
    assert (foreign / "12345.blob").read_bytes() == b"\x00" * 64


def test_the_cache_can_be_switched_off_and_onnxruntime_has_none(tiny_model_dir: Path,
                                                                tmp_path: Path) -> None:
    off = Reranker.from_dir(tiny_model_dir, device="cpu", backend="openvino", precision="fp32",
                            compile_cache=False, compile_cache_dir=str(tmp_path / "unused"))
    assert off.device_info.compile_cache == "off"
    assert not (tmp_path / "unused").exists()
    onnxruntime = Reranker.from_dir(tiny_model_dir, device="cpu", backend="onnxruntime",
                                    precision="fp32", compile_cache_dir=str(tmp_path / "unused"))
    assert onnxruntime.device_info.compile_cache == "off"
    assert onnxruntime.device_info.load_ms > 0
    assert not (tmp_path / "unused").exists()


def test_default_location_is_the_user_cache_dir(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert user_cache_dir() == tmp_path / "onnxrank"
    assert compile_cache_root(EngineConfig()) == tmp_path / "onnxrank" / COMPILE_CACHE_DIR
    assert compile_cache_root(EngineConfig(compile_cache_dir="/srv/ov")) == Path("/srv/ov")
    assert compile_cache_root(EngineConfig(compile_cache=False)) is None
