"""DeBERTa-v2 and -v3 (mixedbread-ai/mxbai-rerank-base-v1, -large-v1): disentangled relative
attention (content->position and position->content terms), no absolute positions in v3, a
ContextPooler head reading position 0, sentencepiece Unigram tokenizers (``[CLS] q [SEP] d
[SEP]``; v3 tokenizers return token types, mxbai's do not).

onnxruntime's transformer optimizer has no DeBERTa fusions (opt is left out). The [CLS]-only
rewrite is not applied: transformers' ``query_states`` path broadcasts the position->content term
of every query row onto a single-row query, so a row-0 layer built on it would not be exact.

transformers compiles DeBERTa's position helpers with ``torch.jit.script``; traced, they become
ONNX ``If`` nodes of dynamic rank that OpenVINO's CPU plugin cannot compile and NNCF cannot
quantize (the ov_int8 crash of issue 19). The export traces the library's own helpers as plain
Python instead (same source, decorator removed), which gives static ops."""

from __future__ import annotations

import ast
import contextlib
import inspect
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onnxrank.export.families.base import Family
from onnxrank.export.families.checkpoint_config import CheckpointConfig, TokenizerKind

if TYPE_CHECKING:
    import torch

    from onnxrank.export.onnx import Exporter
    from onnxrank.export.tasks import ExportTask

MODELING_MODULES = ("transformers.models.deberta_v2.modeling_deberta_v2",
                    "transformers.models.deberta.modeling_deberta")


def _is_jit_script(decorator: ast.expr) -> bool:
    return ast.unparse(decorator) in ("torch.jit.script", "jit.script")


@contextlib.contextmanager
def plain_python_helpers() -> Iterator[None]:
    """Within the block, the modeling modules' ``torch.jit.script`` functions are the same
    functions compiled from their source without the decorator (so the tracer records ops)."""
    patched: list[tuple[Any, str, Any]] = []
    try:
        for name in MODELING_MODULES:
            module = sys.modules.get(name)
            if module is None:
                continue
            tree = ast.parse(inspect.getsource(module))
            scripted: list[ast.stmt] = [
                node for node in tree.body if isinstance(node, ast.FunctionDef)
                and any(_is_jit_script(d) for d in node.decorator_list)]
            names = []
            for node in scripted:
                assert isinstance(node, ast.FunctionDef)
                node.decorator_list = [d for d in node.decorator_list if not _is_jit_script(d)]
                names.append(node.name)
            namespace = dict(vars(module))
            exec(compile(ast.Module(body=scripted, type_ignores=[]), str(module.__file__), "exec"),  # noqa: S102
                 namespace)
            for function in names:
                patched.append((module, function, getattr(module, function)))
                setattr(module, function, namespace[function])
        yield
    finally:
        for module, attribute, original in reversed(patched):
            setattr(module, attribute, original)


class DebertaV2Family(Family):
    name = "deberta-v2"
    model_types = ("deberta-v2", "deberta")
    examples = ("mixedbread-ai/mxbai-rerank-base-v1", "mixedbread-ai/mxbai-rerank-large-v1",
                "mixedbread-ai/mxbai-rerank-xsmall-v1")
    ort_model_type = None
    # microsoft/deberta-v3-base's shape
    checkpoint = CheckpointConfig(
        published_model="mixedbread-ai/mxbai-rerank-base-v1", config_class="DebertaV2Config",
        architecture="DebertaV2ForSequenceClassification",
        full={"vocab_size": 128100, "hidden_size": 768, "num_hidden_layers": 12,
              "num_attention_heads": 12, "intermediate_size": 3072,
              "max_position_embeddings": 512, "relative_attention": True,
              "position_buckets": 256, "norm_rel_ebd": "layer_norm", "share_att_key": True,
              "pos_att_type": ["p2c", "c2p"], "position_biased_input": False,
              "type_vocab_size": 0, "max_relative_positions": -1, "layer_norm_eps": 1e-7,
              "pooler_hidden_size": 768},
        tiny={"pooler_hidden_size": None},
        tokenizer=TokenizerKind("unigram", ("[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"), "bert",
                                "DebertaV2TokenizerFast"))

    def input_names(self, tokenizer: Any, config: Any) -> tuple[str, ...]:
        """The tokenizer's inputs, less token_type_ids when the model has no token type
        embeddings (DeBERTa-v3: type_vocab_size 0): the model never reads them, and the exporter
        would drop them from the graph."""
        names = super().input_names(tokenizer, config)
        if int(getattr(config, "type_vocab_size", 0) or 0) > 0:
            return names
        return tuple(name for name in names if name != "token_type_ids")

    def max_positions(self, config: Any) -> int:
        # relative attention alone (v3: position_biased_input false) has no absolute table, but
        # the checkpoints were trained to max_position_embeddings: keep that as the limit
        return int(config.max_position_embeddings)

    def export_graph(self, module: torch.nn.Module, out_path: Path, *, task: ExportTask,
                     input_names: tuple[str, ...], opset: int,
                     exporter: Exporter = "torchscript") -> tuple[str, ...]:
        with plain_python_helpers():
            return super().export_graph(module, out_path, task=task, input_names=input_names,
                                        opset=opset, exporter=exporter)

    def cls_only_support(self, model: Any) -> str | None:
        return ("DeBERTa's disentangled attention: the position->content term of a row-0 query "
                "needs every row's relative positions; no exact [CLS]-only rewrite yet")


FAMILY = DebertaV2Family()
