"""What differs between model families, in one place per family (the interface).

A `Family` answers every family question the export, validation, the OpenVINO step and the
engine ask: how to load the checkpoint, which module to trace, its graph inputs, its maximum
length, whether (and how) the [CLS]-only last-layer rewrite applies, which onnxruntime optimizer
`model_type` fuses it, which variants apply, how pairs are encoded (the tokenizer's own pair
template, or a prompt recipe) and how ov_int8 is quantized. Subclasses override only what
differs; onnxrank.export.families.registry picks one by ``config.model_type``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from onnxrank._optional import require
from onnxrank.engine.spec import VARIANT_NAMES, Activation
from onnxrank.export.onnx import EXPORTERS, Exporter

if TYPE_CHECKING:
    import torch

    from onnxrank.export.families.checkpoint_config import CheckpointConfig
    from onnxrank.export.loaded import LoadedModel
    from onnxrank.export.quantize import Int8Settings
    from onnxrank.export.tasks import ExportTask

logger = logging.getLogger(__name__)

# graph inputs a cross-encoder may take, in the order the graph declares them
GRAPH_INPUT_ORDER = ("input_ids", "attention_mask", "token_type_ids")
OvInt8Mode = Literal["static", "weight_only"]


class Family:
    """The default: a BERT-shaped ``*ForSequenceClassification`` encoder.

    Attributes:
        name: The family's name in manifests and docs (``bert``, ``xlm-roberta``, ...).
        model_types: The ``config.model_type`` values it handles.
        examples: Hub models of this family (docs and ``onnxrank models list``).
        ort_model_type: onnxruntime.transformers.optimizer's ``model_type`` that fuses this
            family's graph (variants opt and fp16), or None when it knows none.
        ov_int8_mode: ``static`` (NNCF post-training quantization, calibrated) or ``weight_only``
            (NNCF compress_weights, activations in float).
        cls_head_classes: The ``*ForSequenceClassification`` classes whose head reads position 0
            of the last hidden state and nothing else: the [CLS]-only last layer of
            onnxrank.export.prune applies to them (BERT's pooler reads hidden[:, 0]).
        checkpoint: How its random-weight test (tiny) and bench (full) checkpoints are made
            (onnxrank.bench.family_checkpoints); None for families without them.
        known: False for the fallback of an unknown model_type (fp32 only).
        uses_recipe: True for decoder rerankers, which score through a prompt recipe
            (``--recipe``; LoadedModel.recipe); a recipe given for any other family is an error.
        direct_openvino: True when the family's graphs convert straight from PyTorch to
            OpenVINO (`convert_graph`): an export of its weight-only ``ov_int8`` alone then
            loads the checkpoint in its own dtype and writes no fp32 file
            (onnxrank.export.direct_openvino). The decoders, whose 4B and 8B shapes would not
            fit in memory as fp32.
        exporters: The torch exporters that write its fp32 graph (onnxrank.export.onnx), its
            default first: TorchScript, whose graphs onnxruntime's optimizer fuses, then dynamo
            (``--exporter dynamo``).
    """

    name = "bert"
    model_types: tuple[str, ...] = ("bert",)
    examples: tuple[str, ...] = ()
    ort_model_type: str | None = "bert"
    ov_int8_mode: OvInt8Mode = "static"
    cls_head_classes: tuple[str, ...] = ("BertForSequenceClassification",)
    checkpoint: CheckpointConfig | None = None
    known = True
    uses_recipe = False
    direct_openvino = False
    exporters: tuple[Exporter, ...] = EXPORTERS

    # -- loading ----------------------------------------------------------------------------
    def model_class(self, task: ExportTask) -> Any:
        """The transformers Auto class that loads the checkpoint for `task` (the task's own)."""
        return task.auto_class()

    def input_names(self, tokenizer: Any, config: Any) -> tuple[str, ...]:
        """Graph inputs: ids and mask always, token_type_ids only when the tokenizer returns them
        (XLM-R, ModernBERT and DeBERTa-v3 tokenizers do not)."""
        given = (*tokenizer.model_input_names, "input_ids", "attention_mask")
        return tuple(name for name in GRAPH_INPUT_ORDER if name in given)

    def position_offset(self, config: Any) -> int:
        """Positions the embeddings reserve before the first token (RoBERTa: padding_idx + 1)."""
        return 0

    def max_positions(self, config: Any) -> int:
        """The longest row the position embeddings allow."""
        return int(config.max_position_embeddings) - self.position_offset(config)

    def max_length(self, config: Any, tokenizer: Any) -> int:
        """The default max_length: the position limit, or the tokenizer's own limit when lower
        (bge-reranker-base's tokenizer says 512 on 514 positions)."""
        limit = self.max_positions(config)
        declared = getattr(tokenizer, "model_max_length", None)
        if isinstance(declared, int) and 8 <= declared < limit:
            return declared
        return limit

    # -- the graph ----------------------------------------------------------------------------
    def graph_module(self, loaded: LoadedModel, model: Any, task: ExportTask) -> torch.nn.Module:
        """The module torch.onnx.export traces: the graph inputs positionally -> the task's
        output (``logits`` [batch, 1] or the pooled embedding).

        Args:
            loaded: The checkpoint (tokenizer, config, input names).
            model: `loaded.model` or its [CLS]-only copy.
            task: The export's task.
        """
        return task.graph_module(model, loaded.input_names)

    def export_graph(self, module: torch.nn.Module, out_path: Path, *, task: ExportTask,
                     input_names: tuple[str, ...], opset: int,
                     exporter: Exporter = "torchscript") -> tuple[str, ...]:
        """Write the fp32 graph with `exporter` (one of `exporters`); returns the external data
        files written beside it."""
        from onnxrank.export.onnx import export_module

        export_module(module, out_path, output_name=task.output_name, input_names=input_names,
                      opset=opset, exporter=exporter)
        return ()

    def export_prefix_graph(self, loaded: LoadedModel, model: Any, out_path: Path, *,
                            opset: int) -> tuple[str, ...] | None:
        """Write the prefix graph (onnxrank.engine.prefix) of a family whose rows share a
        prompt head; returns the external data files written beside it, or None for a family
        without one (every family but the decoders)."""
        return None

    def convert_graph(self, loaded: LoadedModel) -> Any:
        """Families with `direct_openvino`: the graph `graph_module` describes, converted by
        openvino.convert_model from `loaded.model` in its own dtype (an ``openvino.Model``)."""
        raise NotImplementedError(f"the {self.name} family does not convert to OpenVINO directly")

    def convert_prefix_graph(self, loaded: LoadedModel) -> Any:
        """Families with `direct_openvino`: the prefix graph converted the same way, or None for
        a family without one."""
        raise NotImplementedError(f"the {self.name} family does not convert to OpenVINO directly")

    def fp32_ops(self, model: Any) -> list[str]:
        """Ops of a converted ``openvino.Model`` that the int8 IR keeps in float, as `fp32_nodes`
        names them in an ONNX graph (default: none)."""
        return []

    def reference_runner(self, loaded: LoadedModel) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
        """The unpruned PyTorch rerank model as run(feeds) -> [batch, 1]: the reference every
        variant meets (embedding references are sentence-transformers' own)."""
        from onnxrank.export.tasks import RERANK

        torch = require("torch", extra="export")
        wrapper = self.graph_module(loaded, sdpa_twin(loaded.model), RERANK)
        input_names = loaded.input_names

        def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
            with torch.inference_mode():
                return wrapper(*[torch.from_numpy(feeds[name]) for name in input_names]).float().numpy()

        return run

    # -- the [CLS]-only last layer ------------------------------------------------------------
    def cls_only_support(self, model: Any) -> str | None:
        """Why the last layer cannot be computed for the [CLS] row only, or None when it can."""
        from onnxrank.export.prune import cls_only_support

        return cls_only_support(model, self.cls_head_classes)

    def cls_only_model(self, model: Any) -> Any:
        """A copy of `model` whose last layer computes the [CLS] row only (exact)."""
        from onnxrank.export.prune import cls_only_model

        return cls_only_model(model, self.cls_head_classes)

    # -- variants and encoding ----------------------------------------------------------------
    def variant_reasons(self, config: Any) -> dict[str, str]:
        """Variants that do not apply to this family, each with the reason (default: none)."""
        reasons = {}
        if self.ort_model_type is None:
            reasons["opt"] = (f"onnxruntime's transformer optimizer has no fusions for "
                              f"{self.name} (model_type {config.model_type!r})")
        return reasons

    def int8_recipes(self, recipes: tuple[Int8Settings, ...]) -> tuple[Int8Settings, ...]:
        """The onnxruntime int8 recipes worth trying on this family's graph (default: all)."""
        return recipes

    def reads_position_0(self, config: Any, task: ExportTask) -> bool:
        """Whether the graph's output reads position 0 of the last hidden state alone, where
        per-row int8 keeps that row float (Int8Settings.cls_row_ratio); default: a task with a
        classification head does ([CLS] pooling), a pooled embedding does not."""
        return task.has_head

    def prompt(self, loaded: LoadedModel) -> dict[str, Any] | None:
        """A prompt recipe (ModelSpec.prompt) for decoder rerankers; None = the tokenizer's own
        pair template through onnxrank.engine.tokenize.PairEncoder."""
        return None

    def activation(self, loaded: LoadedModel, task: ExportTask) -> Activation:
        """The manifest's activation: what turns the graph's output into the score the model
        card reports: a rerank checkpoint's own sentence-transformers activation where it stores
        one, else the task's (a decoder's is its recipe's score kind's)."""
        if task.name == "rerank" and loaded.stored_activation is not None:
            return loaded.stored_activation
        return task.activation

    def fp32_nodes(self, model_path: Path) -> list[str]:
        """Nodes of the fp32 graph at `model_path` that every int8 and fp16 variant keeps in
        fp32 (default: none; a decoder's score head)."""
        return []

    def num_labels(self, config: Any, task: ExportTask) -> int:
        """The graph's outputs per row (the manifest's num_labels): the task's (a rerank head's
        labels; an embedding graph's is unused, 1)."""
        return task.num_labels(config)

    def describe(self, config: Any) -> dict[str, Any]:
        """The manifest's ``family`` entry."""
        return {"name": self.name, "model_type": getattr(config, "model_type", None),
                "known": self.known, "ort_model_type": self.ort_model_type,
                "ov_int8_mode": self.ov_int8_mode}


def sdpa_twin(model: Any) -> Any:
    """`model` with PyTorch's scaled-dot-product attention, sharing its weights and buffers (no
    copy), or `model` itself when its class has no SDPA path (DeBERTa-v2 in transformers 5).

    The export loads a checkpoint with eager attention, which the traced graph and the [CLS]-only
    rewrite need; the reference needs only the same arithmetic, which SDPA runs faster on a CPU
    (the stand-in export's reference stage: 39 s eager, 21 s SDPA; docs/export.md).
    """
    if not getattr(model, "_supports_sdpa", False):
        return model
    import copy

    torch = require("torch", extra="export")
    with torch.device("meta"):  # modules without storage: load_state_dict(assign=True) gives it
        twin = type(model)._from_config(copy.deepcopy(model.config), attn_implementation="sdpa")
    twin.load_state_dict(model.state_dict(), assign=True, strict=True)
    for name, buffer in model.named_buffers():  # the non-persistent ones are not in state_dict
        owner, _, attribute = name.rpartition(".")
        setattr(twin.get_submodule(owner), attribute, buffer)
    return twin.eval()


def applicable_variants(family: Family, config: Any, wanted: tuple[str, ...]) -> tuple[
        tuple[str, ...], dict[str, str]]:
    """The wanted variants this family builds, and the others with the reason each is left out."""
    reasons = family.variant_reasons(config)
    kept = tuple(name for name in wanted if name not in reasons)
    return kept, {name: reasons[name] for name in wanted if name in reasons}


__all__ = ["GRAPH_INPUT_ORDER", "VARIANT_NAMES", "Family", "OvInt8Mode", "applicable_variants",
           "sdpa_twin"]
