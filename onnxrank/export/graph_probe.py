"""Intermediate tensors of an ONNX graph on given inputs: what the graph rewrites before static
int8 measure (per-channel maxima, a tensor's shape at run time)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from onnxrank._optional import require


def probe_tensors(fp32_path: Path, tensors: Sequence[str],
                  feeds: Sequence[Mapping[str, np.ndarray]],
                  scratch_path: Path) -> Iterator[dict[str, np.ndarray]]:
    """The named tensors' values for each item of `feeds` (onnxruntime, CPU).

    The graph is saved once with the tensors as extra outputs next to `scratch_path` (a hidden
    ``.probe-`` copy, removed before the first item is scored).
    """
    onnx = require("onnx", extra="export")
    ort = require("onnxruntime", extra="export")
    # its own copy: saving with external data empties the saved tensors of the model in memory
    model = onnx.load(str(fp32_path))
    model.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                              for name in tensors)
    probe = Path(scratch_path).with_name(f".probe-{Path(scratch_path).name}")
    try:
        onnx.save(model, str(probe), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=f"{probe.name}.data")
        session = ort.InferenceSession(str(probe), providers=["CPUExecutionProvider"])
    finally:
        for path in (probe, probe.with_name(f"{probe.name}.data")):
            path.unlink(missing_ok=True)
    names = {node.name for node in session.get_inputs()}
    for item in feeds:
        values = session.run(list(tensors), {key: value for key, value in item.items() if key in names})
        yield dict(zip(tensors, values))
