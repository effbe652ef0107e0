"""Does onnxruntime's 8-bit MatMulNBits (the per-row int8 file's kernel) saturate on AVX2?

A research script, not part of the package. On CPUs without VNNI the u8 x s8 pair sums of
vpmaddubsw are int16 and can saturate (why dynamic int8 keeps 7-bit weights); this runs
MatMulNBits as onnxrank's per-row int8 writes it (bits=8, accuracy_level=4, blocks of 32) on
inputs whose every product is +-127 x 127, and on random ones, and prints the largest error
against numpy. Run it natively and on an emulated AVX2-only CPU (QEMU user mode, Debian's
qemu-user; an AMD Zen 3 model, no AVX-512 or VNNI) and compare, from the repository root::

    python research/matmulnbits_avx2.py
    qemu-x86_64 -cpu EPYC-Milan "$(command -v python)" research/matmulnbits_avx2.py
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from onnxrank.export.quantize_rows import ACCURACY_LEVEL, BITS, int8_blocks

BLOCK = 32


def matmul_nbits(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """x @ weight through one MatMulNBits node of the per-row file's settings, one thread."""
    inputs, outputs = weight.shape
    values, scales = int8_blocks(weight.astype(np.float32), BLOCK)
    node = helper.make_node("MatMulNBits", ["x", "w", "s"], ["y"], domain="com.microsoft",
                            K=inputs, N=outputs, bits=BITS, block_size=BLOCK,
                            accuracy_level=ACCURACY_LEVEL)
    graph = helper.make_graph(
        [node], "nbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, inputs])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, outputs])],
        [numpy_helper.from_array(values, "w"), numpy_helper.from_array(scales, "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x.astype(np.float32)})[0])


def main() -> None:
    rng = np.random.default_rng(0)
    signs = rng.choice([-1.0, 1.0], (8, 384))
    cases = {
        "every product +127 x +127": (np.ones((4, 256)), np.ones((256, 64))),
        "every product +127 x -127": (np.ones((4, 256)), -np.ones((256, 64))),
        "every product -127 x -127": (-np.ones((4, 256)), -np.ones((256, 64))),
        "random normal": (rng.normal(size=(8, 384)), rng.normal(size=(384, 96))),
        "5% outlier channels (x40)": (np.where(rng.random((8, 384)) < 0.05, 40.0, 1.0) * signs,
                                      rng.normal(size=(384, 96))),
    }
    for name, (x, weight) in cases.items():
        error = np.abs(matmul_nbits(x, weight) - x @ weight).max()
        print(f"{name}: max |error| {error:.4g}, max |x @ w| {np.abs(x @ weight).max():.4g}")


if __name__ == "__main__":
    main()
