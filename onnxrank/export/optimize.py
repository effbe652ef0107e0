"""Graph rewrites of the fp32 export: onnxruntime's transformer fusions (opt) and fp16 (for CUDA)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from onnxrank._optional import require
from onnxrank.export.graph_edit import tensor_readers
from onnxrank.export.onnx import EXTERNAL_DATA_SUFFIX, PROTOBUF_LIMIT_BYTES

logger = logging.getLogger(__name__)

# Fused ops reported in the manifest (onnxruntime.transformers BertOnnxModel statistics).
FUSED_OPS = (
    "Attention",
    "MultiHeadAttention",
    "SkipLayerNormalization",
    "EmbedLayerNormalization",
    "Gelu",
    "FastGelu",
    "BiasGelu",
)
# opt_level 1 = onnxruntime's basic (provider-independent) rewrites, then the Python fusions.
# Levels 2/99 bake CPU- or GPU-specific kernels into the saved file; level 1 keeps one file valid
# for both providers, and the session's own ORT_ENABLE_ALL pass at load time then has little left
# to do on an already fused graph.
OPT_LEVEL = 1
FP16_OPT_LEVEL = 0


def optimize_transformer(
    in_path: Path, out_path: Path, *, num_heads: int, hidden_size: int, use_gpu: bool = False,
    model_type: str = "bert",
) -> dict[str, Any]:
    """Fuse attention, layer norms and GELU with onnxruntime.transformers.optimizer.

    Args:
        in_path: fp32 ONNX file from export_module.
        out_path: Where to save the fused graph.
        num_heads: Attention heads (from the model config).
        hidden_size: Hidden size (from the model config).
        use_gpu: Optimize for the CUDA provider (used for the fp16 variant).
        model_type: The optimizer's model type (the family's ort_model_type).

    Returns:
        The manifest's ``optimization`` entry: optimizer, model_type, opt_level, fusion counts.
    """
    optimizer = require("onnxruntime.transformers.optimizer", extra="export")
    model = optimizer.optimize_model(
        str(in_path),
        model_type=model_type,
        num_heads=num_heads,
        hidden_size=hidden_size,
        opt_level=OPT_LEVEL,
        use_gpu=use_gpu,
    )
    statistics = model.get_fused_operator_statistics()
    fusions = {op: int(statistics.get(op, 0)) for op in FUSED_OPS}
    model.save_model_to_file(str(out_path))
    logger.info("optimized %s -> %s: %s", in_path.name, out_path.name, fusions)
    return {
        "optimizer": "onnxruntime.transformers.optimizer",
        "model_type": model_type,
        "opt_level": OPT_LEVEL,
        "use_gpu": use_gpu,
        "num_heads": num_heads,
        "hidden_size": hidden_size,
        "fusions": fusions,
    }


def convert_fp16(
    in_path: Path, out_path: Path, *, num_heads: int, hidden_size: int,
    model_type: str | None = "bert", keep_fp32: Sequence[str] = (),
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """GPU-optimize the fp32 graph, then convert weights and compute to float16.

    `model_type` is the family's optimizer model type; None (a family the optimizer does not
    know) converts the graph without fusions.

    Inputs stay int64 and the outputs float32 (``keep_io_types=True``; a decoder's prefix cache
    too), so callers feed the same arrays as for the fp32 file. Kept in float32: `keep_fp32`
    (the family's score head), every RMS norm's variance (`norm_variance_nodes`) and the rotary
    angles (`rotary_angle_nodes`). A graph over protobuf's limit keeps its weights in
    ``<out_path name>.data`` beside it.

    Returns:
        The manifest's ``optimization`` entry of the fp16 variant, and the external data file
        names written beside `out_path` (empty for a self-contained file).
    """
    onnx_model = _fp16_source(in_path, num_heads=num_heads, hidden_size=hidden_size,
                              model_type=model_type)
    statistics = onnx_model.get_fused_operator_statistics()
    graph = onnx_model.model.graph
    variance, rotary = norm_variance_nodes(graph), rotary_angle_nodes(graph)
    onnx_model.convert_float_to_float16(keep_io_types=True,
                                        node_block_list=[*keep_fp32, *variance, *rotary])
    extra_files = _save(onnx_model, out_path)
    logger.info("converted %s -> %s (fp16)", in_path.name, out_path.name)
    return {
        "optimizer": "onnxruntime.transformers.optimizer",
        "model_type": model_type,
        "opt_level": FP16_OPT_LEVEL,
        "use_gpu": True,
        "num_heads": num_heads,
        "hidden_size": hidden_size,
        "fusions": {op: int(statistics.get(op, 0)) for op in FUSED_OPS},
        "float16": {"converter": "OnnxModel.convert_float_to_float16", "keep_io_types": True,
                    "nodes_kept_fp32": {"norm_variance": len(variance),
                                        "rotary_angles": len(rotary),
                                        "family": sorted(keep_fp32)}},
    }, extra_files


def _fp16_source(in_path: Path, *, num_heads: int, hidden_size: int,
                 model_type: str | None) -> Any:
    """The optimizer's OnnxModel of the fp32 graph, fused for the CUDA provider (none for None)."""
    optimizer = require("onnxruntime.transformers.optimizer", extra="export")
    # opt_level 0: Python fusions only. Level 1 would run an onnxruntime session on the CUDA
    # provider, which an export machine without a GPU does not have.
    options = None
    if model_type is None:
        fusion_options = require("onnxruntime.transformers.fusion_options", extra="export")
        options = fusion_options.FusionOptions("bert")
        for attribute in vars(options):
            if attribute.startswith("enable_") and attribute != "enable_shape_inference":
                setattr(options, attribute, False)
    return optimizer.optimize_model(
        str(in_path),
        model_type=model_type or "bert",
        num_heads=num_heads,
        hidden_size=hidden_size,
        opt_level=FP16_OPT_LEVEL,
        use_gpu=True,
        optimization_options=options,
    )


def norm_variance_nodes(graph: Any) -> list[str]:
    """The nodes of each RMS norm's variance, ``rsqrt(mean(x^2) + eps)``, in an ONNX graph: a
    Pow whose consumer is a ReduceMean, then the Add / Sqrt / Reciprocal / Div after it, up to
    the Mul that normalizes. x^2 overflows float16 (65,504) from |x| = 256, and a large LLM's
    hidden states reach the thousands."""
    consumers = tensor_readers(graph)
    chains: list[str] = []
    for node in graph.node:
        following = consumers.get(node.output[0], []) if node.op_type == "Pow" else []
        if [consumer.op_type for consumer in following] != ["ReduceMean"]:
            continue
        chain = [node]
        while len(following) == 1 and following[0].op_type in _VARIANCE_OPS:
            chain.append(following[0])
            following = consumers.get(following[0].output[0], [])
        chains.extend(member.name for member in chain)
    return chains


def rotary_angle_nodes(graph: Any) -> list[str]:
    """Every Cos and Sin node of an ONNX graph and all the nodes they are computed from: rotary
    embeddings' angles, position x frequency. float16 holds 8,192 to a step of 8 (radians), so
    long rows' angles would be noise (at 320 positions, the tiny decoder's largest fp16 score
    difference from fp32 on OpenVINO drops from 0.0019 to 0.0013 with them kept). The walk
    stops at Shape nodes: a sequence length read off the hidden states is not their values
    (keeping that Shape would cast them to float32)."""
    producers = {output: node for node in graph.node for output in node.output}
    pending = [node for node in graph.node if node.op_type in ("Cos", "Sin")]
    names = {node.name for node in pending}
    while pending:
        for name in pending.pop().input:
            producer = producers.get(name)
            if producer is not None and producer.op_type != "Shape" and producer.name not in names:
                names.add(producer.name)
                pending.append(producer)
    return sorted(names)


# the ops from the mean of squares to the reciprocal root (rsqrt traces as Sqrt, then Div(1, .))
_VARIANCE_OPS = ("ReduceMean", "Add", "Sqrt", "Reciprocal", "Div")


def _save(onnx_model: Any, out_path: Path) -> tuple[str, ...]:
    """Save an OnnxModel to `out_path`, its weights in one external data file when over
    protobuf's limit (OnnxModel names it ``<out_path name>.data``); that file's name, if any."""
    initializers = onnx_model.model.graph.initializer
    # summed per tensor: protobuf cannot even size a message past 2 GB
    external = sum(tensor.ByteSize() for tensor in initializers) > PROTOBUF_LIMIT_BYTES
    onnx_model.save_model_to_file(str(out_path), use_external_data_format=external)
    return (out_path.name + EXTERNAL_DATA_SUFFIX,) if external else ()
