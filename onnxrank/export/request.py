"""What an export is asked to do: one frozen ExportRequest, built by the CLI from its flags and
read by every export route (onnxrank.export.pipeline.EXPORT_ROUTES)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from onnxrank.engine.spec import VARIANT_NAMES
from onnxrank.export.colbert_checkpoint import TASK as LATE_INTERACTION_TASK
from onnxrank.export.fidelity import FidelityThresholds
from onnxrank.export.onnx import DEFAULT_OPSET, Exporter, check_exporter
from onnxrank.export.quantize import DEFAULT_INT8_RECIPES, Int8Settings
from onnxrank.export.quantize_openvino import DEFAULT_OV_INT8_RECIPES, OvInt8Settings
from onnxrank.export.source import DEFAULT_REGISTRY
from onnxrank.export.tasks import DEFAULT_MODEL, export_task

# the tasks that export through stages of their own (the keys of
# onnxrank.export.pipeline.EXPORT_ROUTES); any other task is an ExportTask's (export_task)
ROUTED_TASKS: tuple[str, ...] = (LATE_INTERACTION_TASK,)


@dataclass(frozen=True, slots=True)
class ExportRequest:
    """What to export and how; the CLI builds one from its flags.

    Attributes:
        model: Registry name, Hugging Face Hub id or checkpoint directory.
        out_dir: Target model directory; None = models/<name>.
        task: ``rerank``, ``embedding`` or ``late_interaction``; None = from the registry, else
            ``late_interaction`` for a late-interaction checkpoint directory, else ``rerank``.
        max_length: Token limit per row recorded in the manifest; None = 512 for rerankers, the
            sentence-transformers max_seq_length for embedders; capped by the position embeddings.
        opset: ONNX opset of the export (at least 18 with the dynamo exporter).
        variants: Variants to keep (fp32, opt, int8, fp16, ov_int8).
        thresholds: Fidelity thresholds; a variant below them on the tuning or the held-out
            validation pairs fails the export.
        int8: onnxruntime int8 recipes, tried in order until one meets the thresholds on the
            tuning pairs (the manifest records every attempt).
        ov_int8: OpenVINO int8 recipes, tried the same way.
        cls_only_last_layer: Rerank models: compute the last encoder layer for the [CLS] row only
            (exact up to float rounding; see onnxrank.export.prune). Embedding models are never
            pruned: mean pooling reads every row.
        validation_pairs: Validate on about this many pairs (the first pairs of query groups of
            both parts: onnxrank.export.validate.load_validation_pairs); None = all the shipped
            pairs.
        calibration_pairs: Calibrate the static int8 recipes on about this many pairs (whole
            query groups); None = all the shipped calibration pairs.
        registry_path: models/registry.json.
        seed: Seed for stand-in weights and head fitting.
        recipe: Decoder rerankers: a built-in scoring recipe's name or a recipe file (JSON);
            None = the built-in recipe of a known Hub id (onnxrank.export.recipes).
        exporter: The torch exporter of the fp32 graph (onnxrank.export.onnx.EXPORTERS); None =
            the family's own (``Family.exporters``' first). The manifest's ``family.exporter``
            records the one used.
    """

    model: str = DEFAULT_MODEL
    out_dir: Path | None = None
    task: str | None = None
    max_length: int | None = None
    opset: int = DEFAULT_OPSET
    variants: tuple[str, ...] = VARIANT_NAMES
    thresholds: FidelityThresholds = field(default_factory=FidelityThresholds)
    int8: tuple[Int8Settings, ...] = DEFAULT_INT8_RECIPES
    ov_int8: tuple[OvInt8Settings, ...] = DEFAULT_OV_INT8_RECIPES
    cls_only_last_layer: bool = True
    validation_pairs: int | None = None
    calibration_pairs: int | None = None
    registry_path: Path = DEFAULT_REGISTRY
    seed: int = 0
    recipe: str | None = None
    exporter: Exporter | None = None

    def __post_init__(self) -> None:
        if self.exporter is not None:
            check_exporter(self.exporter)
        unknown = [name for name in self.variants if name not in VARIANT_NAMES]
        if unknown or not self.variants:
            raise ValueError(
                f"variants must be a non-empty subset of {', '.join(VARIANT_NAMES)}, "
                f"got {', '.join(self.variants) or 'nothing'}"
            )
        if self.task is not None and self.task not in ROUTED_TASKS:
            export_task(self.task)
        if not self.int8:
            raise ValueError("int8 needs at least one recipe (Int8Settings)")
        if not self.ov_int8:
            raise ValueError("ov_int8 needs at least one recipe (OvInt8Settings)")
        if self.max_length is not None and self.max_length < 8:
            raise ValueError(f"max_length must be >= 8, got {self.max_length}")
        # before minutes of loading and tracing, not when the pairs are encoded
        for name, pairs in (("validation", self.validation_pairs),
                            ("calibration", self.calibration_pairs)):
            if pairs is not None and pairs < 1:
                raise ValueError(f"{name} pairs must be >= 1, got {pairs}")
