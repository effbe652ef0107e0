"""Graph rewrites of the fp32 export: onnxruntime's transformer fusions (opt) and fp16 (for CUDA)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from onnxrank._optional import require

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
    model_type: str | None = "bert",
) -> dict[str, Any]:
    """GPU-optimize the fp32 graph, then convert weights and compute to float16.

    `model_type` is the family's optimizer model type; None (a family the optimizer does not
    know) converts the graph without fusions.

    Inputs stay int64 and the output float32 (``keep_io_types=True``), so callers feed the same
    arrays as for the fp32 file.

    Returns:
        The manifest's ``optimization`` entry of the fp16 variant.
    """
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
    model = optimizer.optimize_model(
        str(in_path),
        model_type=model_type or "bert",
        num_heads=num_heads,
        hidden_size=hidden_size,
        opt_level=FP16_OPT_LEVEL,
        use_gpu=True,
        optimization_options=options,
    )
    statistics = model.get_fused_operator_statistics()
    model.convert_float_to_float16(keep_io_types=True)
    model.save_model_to_file(str(out_path))
    logger.info("converted %s -> %s (fp16)", in_path.name, out_path.name)
    return {
        "optimizer": "onnxruntime.transformers.optimizer",
        "model_type": model_type,
        "opt_level": FP16_OPT_LEVEL,
        "use_gpu": True,
        "num_heads": num_heads,
        "hidden_size": hidden_size,
        "fusions": {op: int(statistics.get(op, 0)) for op in FUSED_OPS},
        "float16": {"converter": "OnnxModel.convert_float_to_float16", "keep_io_types": True},
    }
