"""The per-operator profile reads each runtime's own profiler at the batches the engine plans."""

from __future__ import annotations

from pathlib import Path

import pytest

from onnxrank.bench.profile import GEMM_OPERATORS, main, profile
from onnxrank.engine.reranker import Reranker, planned_feeds


@pytest.mark.parametrize(("backend", "precision"), [("onnxruntime", "int8"), ("openvino", "int8")])
def test_profile_splits_the_runtimes_time_by_operator(tiny_model_dir: Path, backend: str,
                                                      precision: str) -> None:
    if backend == "openvino":
        pytest.importorskip("openvino")
    result = profile(tiny_model_dir, regime="short", queries=2, repeats=1, candidates=8,
                     backend=backend, precision=precision)
    assert result.runtime.startswith(f"{backend}/{precision} ")
    gemm = [name for name in result.operators_ms if name in GEMM_OPERATORS]
    assert gemm, f"no GEMM operator among {sorted(result.operators_ms)}"
    assert 0.0 < result.gemm_share < 1.0
    assert all(ms > 0 for ms in result.operators_ms.values())
    assert result.gemm_gops > 0 and result.model_gops > 0
    # the batches profiled are the ones the engine plans for the same requests
    reranker = Reranker.from_dir(tiny_model_dir, device="cpu", backend=backend, precision=precision)
    assert result.batches_per_query >= len(planned_feeds(reranker, [("q", "d")] * 8)) >= 1


def test_profile_command_prints_the_gemm_share(tiny_model_dir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--model-dir", str(tiny_model_dir), "--queries", "1", "--repeats", "1",
                 "--candidates", "4", "--backend", "onnxruntime", "--precision", "fp32"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("onnxruntime/fp32 (")
    assert "GEMM operators: " in out and "MatMul" in out
