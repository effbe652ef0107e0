"""What the rewrite tests read from a saved OpenVINO int8 IR (test_cls_row_split.py,
test_outlier_split.py)."""

from __future__ import annotations

from pathlib import Path


def quantized_matmuls(ir_path: Path) -> set[str]:
    """The names of the IR's MatMuls that NNCF quantized: a FakeQuantize feeds one of their
    inputs (it never does a MatMul it left float)."""
    import openvino

    model = openvino.Core().read_model(str(ir_path))
    return {op.get_friendly_name() for op in model.get_ops()
            if op.get_type_name() == "MatMul"
            and any(port.get_source_output().get_node().get_type_name() == "FakeQuantize"
                    for port in op.inputs())}
