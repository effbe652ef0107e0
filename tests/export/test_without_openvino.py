"""An export where OpenVINO is not installed (a GPU machine with onnxruntime-gpu, say): the bf16
record is optional, so it says why it is missing and every onnxruntime variant is still written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BLOCK_OPENVINO = "import sys; sys.modules['openvino'] = sys.modules['nncf'] = None; "


def test_the_export_keeps_its_variants_and_records_why_bf16_is_missing(
    tiny_checkpoint_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "models" / "no-openvino"
    completed = subprocess.run(
        [sys.executable, "-c", BLOCK_OPENVINO + "from onnxrank.cli import main; raise SystemExit(main())",
         "export", "--model", str(tiny_checkpoint_dir), "--out", str(out),
         "--variants", "fp32,opt,fp16", "--validation-pairs", "16", "--quiet"],
        capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(manifest["variants"]) == ["fp16", "fp32", "opt"]
    assert all((out / f"model{suffix}.onnx").is_file() for suffix in ("", "_opt", "_fp16"))
    [bf16] = [record for key, record in manifest["variants"]["fp32"]["fidelity"].items()
              if "bf16" in key]
    # the engine's own reason, as loading with precision="bf16" would give it
    assert bf16 == {"validated": False, "passed": False, "reason": (
        'the openvino package is not installed (pip install "onnxrank[openvino]")')}
