"""What the rewrite tests make and read: the tiny reranker's OpenVINO int8 IR of one recipe, and
the MatMuls it quantized (test_cls_row_split.py, test_outlier_split.py,
test_hadamard_rotation.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def quantized_matmuls(ir_path: Path) -> set[str]:
    """The names of the IR's MatMuls that NNCF quantized: a FakeQuantize feeds one of their
    inputs (it never does a MatMul it left float), directly or through Reshapes, above which NNCF
    moves its quantizers (a rotated input: onnxrank.export.hadamard_rotation)."""
    import openvino

    def source(port: Any) -> Any:
        node = port.get_source_output().get_node()
        while node.get_type_name() == "Reshape":
            node = node.input(0).get_source_output().get_node()
        return node

    model = openvino.Core().read_model(str(ir_path))
    return {op.get_friendly_name() for op in model.get_ops()
            if op.get_type_name() == "MatMul"
            and any(source(port).get_type_name() == "FakeQuantize" for port in op.inputs())}


def quantize_tiny(model_dir: Path, calibration: list, out_dir: Path,
                  settings: Any) -> tuple[dict[str, Any], Path]:
    """The tiny reranker's (2 layers) `model.onnx` quantized with `settings` (an OvInt8Settings)
    into `out_dir`: the ``quantization`` record and the IR's path."""
    from onnxrank.export.quantize_openvino import quantize_openvino_int8

    out = out_dir / "model_ov_int8.xml"
    record = quantize_openvino_int8(fp32_path=model_dir / "model.onnx", out_path=out,
                                    calibration=calibration, layers=2, settings=settings)
    return record, out


def int8_fp32_correlation(ir_path: Path, fp32_path: Path, batch: dict[str, Any]) -> float:
    """Pearson correlation of the IR's int8 scores with the fp32 graph's on `batch`."""
    import numpy as np

    from onnxrank.engine.runtime import open_model_file

    scores = open_model_file(ir_path, backend="openvino", precision="int8", threads=1).run(batch)
    reference = open_model_file(fp32_path, precision="fp32", threads=1).run(batch)
    return float(np.corrcoef(scores[:, 0], reference[:, 0])[0, 1])
