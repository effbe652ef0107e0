"""Decoder-only rerankers (Qwen3-Reranker, bge-reranker-v2-gemma, mxbai-rerank-v2): a causal LM
that scores a pair by its answer tokens' logits at the last position of a fixed prompt
(onnxrank.export.recipes; the score kinds are onnxrank.engine.recipe.SCORES).

What the exported graph computes, and why it is exact and small:

* inputs ``input_ids`` and ``attention_mask`` [batch, sequence], rows right-padded (the engine's
  `pad_rows`), so a row's positions are 0..n-1 whatever its batch mates: its score equals the
  score of the row alone. (The model card pads on the left without position ids, which shifts a
  short row's positions by its padding; our reference is each row alone.)
* the causal LM's body (embeddings, decoder layers, final norm) with a 4-D additive causal mask
  built in the graph from `attention_mask` (transformers' own mask builder uses vmap, which the
  TorchScript exporter cannot trace; the mask is the same: causal and padding keys masked), its
  attention traced as `decoder_attention.grouped_attention` (eager attention's arithmetic,
  without a copy of each key/value head per query head).
* the hidden state of each row's last real token (``sum(attention_mask) - 1``), then ONE output
  row of the vocabulary projection, the score head: the score kind's weighted sum of its answer
  tokens' rows (``W[yes] - W[no]``, or ``W[yes]`` alone), plus the same sum of their biases, if
  any. For Qwen3-0.6B that drops a 151,936 x 1,024 matmul per token. Output ``logits``
  [batch, 1]; the manifest's activation is the score kind's (sigmoid of yes - no is p(yes) for
  Qwen3; the raw logit or logit difference for the others). No KV cache, no generation.
* the score head is the module ``score_head`` (graph nodes ``/score_head/...``): the int8 and
  fp16 variants keep it in fp32 (`fp32_nodes`), as a quantized head collapses the scores.
* beside it, the prefix graph (`prefix_cache_graph`, model_prefix.onnx): ``prefix_cache``, the
  keys and values of a prefix shared by every row of a batch, then ``input_ids`` /
  ``attention_mask`` [batch, D] of each row's own tokens; the body runs on the rows at positions
  P..P+D-1 against the cache (transformers' DynamicCache, keys and values expanded to the batch).
  Its scores are the score graph's on the whole rows (the export gates it at 1e-4 x their
  spread); run on a prefix alone with an empty cache, its second output is that prefix's cache
  (onnxrank.engine.prefix runs it: each query's prefix once).

The PyTorch reference is the unmodified model: full vocabulary logits at each row's last real
token, the score kind's weighted sum of the answer logits taken from them.
"""

from __future__ import annotations

import inspect
import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxrank._optional import require
from onnxrank.engine.prefix import CACHE_INPUT, CACHE_OUTPUT
from onnxrank.errors import ExportError
from onnxrank.export.dependency_logs import dependency_logs_quieted
from onnxrank.export.families.base import Family
from onnxrank.export.families.decoder_attention import (
    grouped_attention_for,
    outer_product_rotary,
)
from onnxrank.export.memory import meta_model, weight_count
from onnxrank.export.onnx import EXTERNAL_DATA_SUFFIX, PROTOBUF_LIMIT_BYTES, Exporter
from onnxrank.export.tasks import RERANK

if TYPE_CHECKING:
    import torch

    from onnxrank.engine.recipe import PromptRecipe
    from onnxrank.engine.spec import Activation
    from onnxrank.export.loaded import LoadedModel
    from onnxrank.export.quantize import Int8Settings
    from onnxrank.export.tasks import ExportTask

logger = logging.getLogger(__name__)

INPUT_NAMES = ("input_ids", "attention_mask")
# The model card's max_length; rows are as long as their text, this only caps them.
DEFAULT_MAX_LENGTH = 8192
OUTPUT_NAME = "logits"
# where OpenVINO's 16-bit tracing patch keeps each module's own forward while it is patched
_PATCHED_FORWARD = "_onnxrank_16bit_patch_forward"
# the score head's module name: its nodes stay fp32 in every quantized and fp16 variant
SCORE_HEAD = "score_head"


def score_graph(model: Any, *, answer_ids: tuple[int, ...],
                weights: tuple[float, ...]) -> torch.nn.Module:
    """The module torch.onnx.export traces: (input_ids, attention_mask) -> the score,
    sum(weight * logit(answer token)) at each row's last real token.

    Args:
        model: A transformers ``*ForCausalLM`` in eval mode with eager attention, whose body is
            ``model.model`` (hidden states after the final norm) and head ``model.lm_head``.
        answer_ids: Vocabulary rows of the recipe's answer tokens.
        weights: The score kind's weight of each answer token.
    """
    torch = require("torch", extra="export")
    head = model.get_output_embeddings()
    rows = head.weight.detach().to(torch.float32)[list(answer_ids)]
    coefficients = torch.tensor(weights, dtype=torch.float32)
    direction = coefficients @ rows
    bias = None
    if getattr(head, "bias", None) is not None:
        bias = (coefficients @ head.bias.detach().to(torch.float32)[list(answer_ids)]).reshape(1)

    class DecoderScoreGraph(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.body = model.model
            head = torch.nn.Linear(direction.shape[0], 1, bias=bias is not None)
            with torch.no_grad():
                head.weight.copy_(direction.reshape(1, -1))
                if bias is not None:
                    head.bias.copy_(bias)
            self.add_module(SCORE_HEAD, head)

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            with grouped_attention_for(self.body.config), outer_product_rotary(self.body):
                hidden = self.body(input_ids=input_ids,
                                   attention_mask=causal_mask(attention_mask),
                                   use_cache=False).last_hidden_state
            last = attention_mask.sum(dim=1) - 1
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            return getattr(self, SCORE_HEAD)(hidden[rows, last].float())

    return DecoderScoreGraph().eval()


def prefix_cache_graph(model: Any, *, answer_ids: tuple[int, ...],
                       weights: tuple[float, ...]) -> torch.nn.Module:
    """The module of the prefix graph: (prefix_cache, input_ids, attention_mask) -> (the score
    of each row ``prefix + continuation``, equal to `score_graph` on the whole row; the keys and
    values of row 0's tokens).

    ``prefix_cache`` [2 x layers, kv_heads, P, head_dim] holds every layer's keys then values of
    a prefix of P tokens; they are expanded (not copied) to the batch, and the body runs on the
    right-padded continuations [batch, D] at positions P..P+D-1 with a [batch, 1, D, P+D] mask:
    every prefix key visible, causal and padding on the continuation. The second output,
    ``present_cache`` [2 x layers, kv_heads, D, head_dim], is row 0's own keys and values: run
    on a prefix alone as one row with an empty cache (P = 0), it is that prefix's cache. So one
    graph (one copy of the weights) computes a query's prefix once and then scores its rows
    against it. The score head is `score_graph`'s module (the same ``score_head`` node names,
    kept fp32 by the int8 variants).
    """
    torch = require("torch", extra="export")
    scorer = score_graph(model, answer_ids=answer_ids, weights=weights)

    class DecoderPrefixCacheGraph(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.body = model.model
            self.add_module(SCORE_HEAD, getattr(scorer, SCORE_HEAD))

        def forward(self, prefix_cache: Any, input_ids: Any, attention_mask: Any) -> Any:
            batch, length = input_ids.shape
            past = prefix_cache.shape[2]
            cache = _cache_of(prefix_cache, self.body.config, batch)
            positions = torch.arange(length, device=input_ids.device) + past
            mask = causal_mask(attention_mask)
            prefix_columns = torch.zeros((batch, 1, length, past), dtype=mask.dtype,
                                         device=mask.device)
            # every continuation token sees the whole prefix (padding positions too: their
            # outputs are never read, and a row of only masked keys would give NaN)
            with grouped_attention_for(self.body.config), outer_product_rotary(self.body):
                hidden = self.body(input_ids=input_ids,
                                   attention_mask=torch.cat([prefix_columns, mask], dim=3),
                                   position_ids=positions[None, :].expand(batch, -1),
                                   use_cache=True, **{_cache_keyword(self.body): cache}
                                   ).last_hidden_state
            last = attention_mask.sum(dim=1) - 1
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            present = torch.stack([tensor[0, :, past:, :] for layer in cache.layers
                                   for tensor in (layer.keys, layer.values)])
            return getattr(self, SCORE_HEAD)(hidden[rows, last].float()), present.float()

    return DecoderPrefixCacheGraph().eval()


def _cache_keyword(body: Any) -> str:
    """The name `body.forward` takes its KV cache by: ``cache`` from transformers 5.24 (which
    deprecates ``past_key_values``), ``past_key_values`` before; an unknown keyword would land
    in its **kwargs and be ignored."""
    return "cache" if "cache" in inspect.signature(body.forward).parameters else "past_key_values"


def _cache_of(prefix_cache: torch.Tensor, config: Any, batch: int) -> Any:
    """A DynamicCache holding `prefix_cache`'s keys and values (every layer's keys, then values,
    [2 x layers, kv_heads, P, head_dim]), each expanded (not copied) to `batch` rows. Its layers
    hold 4-D tensors from the start: transformers starts them as 1-D empty tensors, which the
    first update concatenates on the sequence axis, fine in PyTorch and the ONNX exporter, a
    rank error in openvino.convert_model."""
    transformers = require("transformers", extra="export")
    cache = transformers.DynamicCache(config=config)
    for index, layer in enumerate(cache.layers):
        keys = prefix_cache[2 * index][None].expand(batch, -1, -1, -1)
        values = prefix_cache[2 * index + 1][None].expand(batch, -1, -1, -1)
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
    return cache


def causal_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[batch, 1, sequence, sequence] additive mask: 0 where a query may attend, float32 min
    where the key is later than the query or padding (what transformers builds from a 2-D mask)."""
    torch = require("torch", extra="export")
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    allowed = (positions[None, :] <= positions[:, None])[None, None, :, :] \
        & attention_mask[:, None, None, :].bool()
    blocked = torch.zeros(allowed.shape, dtype=torch.float32, device=attention_mask.device)
    return blocked.masked_fill(~allowed, torch.finfo(torch.float32).min)


def reference_runner(model: Any, *, answer_ids: tuple[int, ...],
                     weights: tuple[float, ...]) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """The unmodified causal LM as run(feeds) -> [batch, 1] sum(weight * logit(answer token)).

    Feeds are right-padded, so each row's last real token is at sum(attention_mask) - 1 and its
    positions are those of the row alone; the vocabulary projection runs at that token only
    (the model card's ``logits[:, -1, :]`` for the row alone), for the answer tokens' rows.
    Arithmetic is float32 whatever the checkpoint's dtype, as in the exported graphs: a 16-bit
    model's modules run on their weights upcast while each runs (`_float32_modules`), so the
    reference needs no float32 copy of the whole model and carries no bfloat16 rounding (a
    bfloat16 logit of 10 has a step of 0.06, coarser than the int8 error the gates judge).
    """
    torch = require("torch", extra="export")
    coefficients = torch.tensor(weights, dtype=torch.float32)
    head = model.get_output_embeddings()
    rows = head.weight.detach()[list(answer_ids)].to(torch.float32)
    bias = None if getattr(head, "bias", None) is None else \
        head.bias.detach()[list(answer_ids)].to(torch.float32)

    def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
        input_ids = torch.from_numpy(feeds["input_ids"])
        attention_mask = torch.from_numpy(feeds["attention_mask"])
        with torch.inference_mode(), _float32_modules(model.model):
            hidden = model.model(input_ids=input_ids, attention_mask=attention_mask,
                                 use_cache=False).last_hidden_state
            last = attention_mask.sum(dim=1) - 1
            logits = torch.nn.functional.linear(
                hidden[torch.arange(hidden.shape[0]), last].to(torch.float32), rows, bias)
            return (logits @ coefficients).reshape(-1, 1).numpy()

    return run


def export_score_graph(graph: torch.nn.Module, out_path: Path, *, opset: int) -> tuple[str, ...]:
    """torch.onnx.export `graph` to `out_path` (dynamic batch and sequence axes).

    A graph over protobuf's 2 GB limit (a 0.6B model in fp32 is 2.4 GB) keeps its weights in one
    external data file beside it, ``<out_path name>.data``.

    Returns:
        The external data file names written beside `out_path` (empty for a self-contained file).
    """
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    return _export(graph, out_path, _score_dummy(), INPUT_NAMES, axes, opset=opset)


def export_prefix_graph(graph: torch.nn.Module, out_path: Path, *,
                        opset: int) -> tuple[str, ...]:
    """torch.onnx.export a `prefix_cache_graph` to `out_path` (dynamic cache length, batch and
    continuation length), its weights kept like `export_score_graph`'s.

    Returns:
        The external data file names written beside `out_path`.
    """
    axes = {CACHE_INPUT: {2: "prefix"}, CACHE_OUTPUT: {2: "sequence"},
            **{name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}}
    return _export(graph, out_path, _prefix_dummy(graph.get_submodule("body").config),
                   (CACHE_INPUT, *INPUT_NAMES), axes, opset=opset,
                   output_names=(OUTPUT_NAME, CACHE_OUTPUT))


def cache_shape(config: Any) -> list[int]:
    """A prefix cache's shape with -1 for its length: [2 x layers, kv_heads, -1, head_dim]."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return [2 * config.num_hidden_layers, config.num_key_value_heads, -1, head_dim]


def _score_dummy() -> tuple[torch.Tensor, ...]:
    torch = require("torch", extra="export")
    # batch 2 x sequence 16: distinct sizes so the exporter cannot confuse the two axes
    return torch.ones((2, 16), dtype=torch.long), torch.ones((2, 16), dtype=torch.long)


def _prefix_dummy(config: Any) -> tuple[torch.Tensor, ...]:
    torch = require("torch", extra="export")
    layers, heads, _, head_dim = cache_shape(config)
    # cache length 5, batch 2, continuation 16: three distinct sizes
    return (torch.zeros((layers, heads, 5, head_dim)), *_score_dummy())


def convert_score_graph(graph: torch.nn.Module) -> Any:
    """openvino.convert_model of a `score_graph` (dynamic batch and sequence; the weights shared
    with PyTorch, in their dtype): the ``openvino.Model`` of the score graph's ONNX file."""
    openvino = require("openvino", extra="openvino")
    return _convert(graph, _score_dummy(),
                    {name: ([-1, -1], openvino.Type.i64) for name in INPUT_NAMES})


def convert_prefix_graph(graph: torch.nn.Module) -> Any:
    """openvino.convert_model of a `prefix_cache_graph` (a float32 cache of dynamic length)."""
    openvino = require("openvino", extra="openvino")
    config = graph.get_submodule("body").config
    return _convert(graph, _prefix_dummy(config),
                    {CACHE_INPUT: (cache_shape(config), openvino.Type.f32),
                     **{name: ([-1, -1], openvino.Type.i64) for name in INPUT_NAMES}},
                    outputs=(OUTPUT_NAME, CACHE_OUTPUT))


def _convert(graph: torch.nn.Module, dummy: tuple[Any, ...],
             inputs: dict[str, tuple[list[int], Any]], *,
             outputs: tuple[str, ...] = (OUTPUT_NAME,)) -> Any:
    torch = require("torch", extra="export")
    openvino = require("openvino", extra="openvino")
    with torch.inference_mode(), warnings.catch_warnings(), _float32_arithmetic(graph), \
            dependency_logs_quieted("transformers", floor=logging.ERROR):
        warnings.simplefilter("ignore")  # TorchScript tracer warnings, as for the ONNX export
        model = openvino.convert_model(graph, example_input=dummy, input=[
            (name, shape, element_type) for name, (shape, element_type) in inputs.items()])
    # the converter may add a traced value's name beside an input's: the engine reads the one
    for port, name in zip(model.inputs, inputs, strict=True):
        port.get_tensor().set_names({name})
    for port, name in zip(model.outputs, outputs, strict=True):
        port.get_tensor().set_names({name})
    return model


def _is_16bit(tensor: torch.Tensor) -> bool:
    torch = require("torch", extra="export")
    return tensor.dtype in (torch.float16, torch.bfloat16)


def _has_16bit_weights(module: torch.nn.Module, *, recurse: bool = True) -> bool:
    return any(_is_16bit(parameter) for parameter in module.parameters(recurse))


@contextmanager
def _float32_arithmetic(graph: torch.nn.Module) -> Iterator[None]:
    """Trace a 16-bit model as 16-bit weights feeding float32 arithmetic, the form NNCF and
    the CPU plugin know as compressed weights, and leave it as it was.

    Converted as it is, a bfloat16 model computes in bfloat16: NNCF's int8 weights then end in
    a bfloat16 Convert that the CPU plugin does not fuse, so it decompresses every weight at
    compile time (a Qwen3-4B-shaped IR took 21 GiB under the f32 hint and 10 GiB under bf16,
    for 4.4 GB of int8). OpenVINO's own patch (what optimum-intel uses for 16-bit models) makes
    the Linear and Embedding modules emit their 16-bit weights as constants, and casts the
    other modules' parameters (the norms') to float32; undoing it restores their dtypes.
    """
    if not _has_16bit_weights(graph):
        yield
        return
    from openvino.frontend.pytorch.patch_model import __make_16bit_traceable, unpatch_model

    dtypes = {name: tensor.dtype for name, tensor in
              (*graph.named_parameters(), *graph.named_buffers())}
    __make_16bit_traceable(graph, orig_forward_name=_PATCHED_FORWARD)
    try:
        yield
    finally:
        unpatch_model(graph, _PATCHED_FORWARD)
        for name, tensor in (*graph.named_parameters(), *graph.named_buffers()):
            if tensor.dtype != dtypes[name]:
                tensor.data = tensor.data.to(dtypes[name])


@contextmanager
def _float32_modules(model: torch.nn.Module) -> Iterator[None]:
    """Run a 16-bit model in float32 arithmetic: each module's 16-bit parameters are upcast
    while it runs and put back after, so one module's weights at a time are float32."""
    torch = require("torch", extra="export")
    modules = [module for module in model.modules() if _has_16bit_weights(module, recurse=False)]
    upcast: dict[Any, list[tuple[Any, Any]]] = {}

    def before(module: Any, args: Any) -> None:
        upcast[module] = [(parameter, parameter.data) for parameter in module.parameters(False)
                          if _is_16bit(parameter)]
        for parameter, data in upcast[module]:
            parameter.data = data.to(torch.float32)

    def after(module: Any, args: Any, output: Any) -> None:
        for parameter, data in upcast.pop(module):
            parameter.data = data

    handles = [handle for module in modules for handle in (
        module.register_forward_pre_hook(before), module.register_forward_hook(after))]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def score_head_ops(model: Any) -> list[str]:
    """The score head's MatMul in an `openvino.Model` converted from PyTorch (its friendly
    name is the module path, ``__module.score_head/aten::linear/MatMul``)."""
    return [op.get_friendly_name() for op in model.get_ops()
            if op.get_type_name() == "MatMul" and f".{SCORE_HEAD}/" in op.get_friendly_name()]


def _export(graph: torch.nn.Module, out_path: Path, dummy: tuple[Any, ...],
            input_names: tuple[str, ...], axes: dict[str, dict[int, str]], *,
            opset: int, output_names: tuple[str, ...] = (OUTPUT_NAME,)) -> tuple[str, ...]:
    torch = require("torch", extra="export")
    onnx = require("onnx", extra="export")
    out_path = Path(out_path)
    staging = out_path.parent / f".{out_path.stem}-export"
    staging.mkdir(parents=True, exist_ok=True)
    traced = staging / out_path.name
    axes = {**axes, OUTPUT_NAME: {0: "batch"}}
    with torch.inference_mode(), warnings.catch_warnings():
        # the TorchScript exporter, as for cross-encoders (onnxrank.export.onnx); its
        # deprecation notice and tracer warnings are not something the user can act on
        warnings.simplefilter("ignore")
        torch.onnx.export(graph, dummy, str(traced), input_names=list(input_names),
                          output_names=list(output_names), dynamic_axes=axes, opset_version=opset,
                          do_constant_folding=True, dynamo=False)
    # the exporter spreads large weights over one file per tensor: gather them into one
    proto = onnx.load(str(traced))
    # summed per tensor: protobuf cannot even size a message past 2 GB
    external = sum(tensor.ByteSize() for tensor in proto.graph.initializer) > PROTOBUF_LIMIT_BYTES
    data_name = out_path.name + EXTERNAL_DATA_SUFFIX
    onnx.save_model(proto, str(out_path), save_as_external_data=external,
                    all_tensors_to_one_file=True, location=data_name, size_threshold=1024)
    for leftover in staging.iterdir():
        leftover.unlink()
    staging.rmdir()
    return (data_name,) if external else ()


class DecoderFamily(Family):
    """Causal LMs scored with a prompt recipe (``--recipe``; a built-in one is chosen by Hub id).

    Tested on Qwen3 (Qwen3ForCausalLM), Gemma (GemmaForCausalLM) and Qwen2 (Qwen2ForCausalLM)
    against their model cards' PyTorch code. Other Llama-shaped decoders (Mistral, Llama) have the
    same ``model.model`` / ``lm_head`` layout, but are not claimed until a test checks them.
    """

    name = "decoder"
    model_types: tuple[str, ...] = ("qwen3", "qwen2", "gemma")
    examples: tuple[str, ...] = (
        "Qwen/Qwen3-Reranker-0.6B", "Qwen/Qwen3-Reranker-4B", "Qwen/Qwen3-Reranker-8B",
        "BAAI/bge-reranker-v2-gemma", "mixedbread-ai/mxbai-rerank-base-v2",
        "mixedbread-ai/mxbai-rerank-large-v2")
    ort_model_type = None  # onnxruntime's transformer optimizer has no fusions for these graphs
    ov_int8_mode = "weight_only"
    uses_recipe = True
    direct_openvino = True
    # the score and prefix graphs' own trace (export_score_graph, export_prefix_graph)
    exporters: tuple[Exporter, ...] = ("torchscript",)
    # the score graph and its PyTorch reference, each (model, *, answer_ids, weights) -> ...
    score_graph = staticmethod(score_graph)
    score_reference = staticmethod(reference_runner)

    def model_class(self, task: ExportTask) -> Any:
        transformers = require("transformers", extra="export")
        return transformers.AutoModelForCausalLM

    def input_names(self, tokenizer: Any, config: Any) -> tuple[str, ...]:
        return INPUT_NAMES

    def max_length(self, config: Any, tokenizer: Any) -> int:
        return min(DEFAULT_MAX_LENGTH, self.max_positions(config))

    def graph_module(self, loaded: LoadedModel, model: Any, task: ExportTask) -> torch.nn.Module:
        return self.score_graph(model, answer_ids=self.answer_ids(loaded),
                                weights=self.recipe(loaded).score_kind.weights)

    def export_graph(self, module: torch.nn.Module, out_path: Path, *, task: ExportTask,
                     input_names: tuple[str, ...], opset: int,
                     exporter: Exporter = "torchscript") -> tuple[str, ...]:
        return export_score_graph(module, out_path, opset=opset)

    def export_prefix_graph(self, loaded: LoadedModel, model: Any, out_path: Path, *,
                            opset: int) -> tuple[str, ...] | None:
        return export_prefix_graph(self._prefix_module(loaded, model), out_path, opset=opset)

    def convert_graph(self, loaded: LoadedModel) -> Any:
        return convert_score_graph(self.graph_module(loaded, loaded.model, RERANK))

    def convert_prefix_graph(self, loaded: LoadedModel) -> Any:
        return convert_prefix_graph(self._prefix_module(loaded, loaded.model))

    def _prefix_module(self, loaded: LoadedModel, model: Any) -> torch.nn.Module:
        return prefix_cache_graph(model, answer_ids=self.answer_ids(loaded),
                                  weights=self.recipe(loaded).score_kind.weights)

    def fp32_ops(self, model: Any) -> list[str]:
        return score_head_ops(model)

    def reference_runner(self, loaded: LoadedModel) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
        return self.score_reference(loaded.model, answer_ids=self.answer_ids(loaded),
                                    weights=self.recipe(loaded).score_kind.weights)

    def cls_only_support(self, model: Any) -> str | None:
        return ("a decoder reranker reads the last token, not [CLS]: its vocabulary projection is "
                "pruned to the answer tokens' rows instead (see the manifest's prompt)")

    def variant_reasons(self, config: Any) -> dict[str, str]:
        reasons = super().variant_reasons(config)
        # the graph holds the body (embeddings and layers): the head is pruned to two rows
        fp32_bytes = 4 * weight_count(meta_model(self.model_class(RERANK), config).model)
        if fp32_bytes > PROTOBUF_LIMIT_BYTES:
            # an OOM kill cannot be caught and recorded: it would take every variant with it
            reasons["int8"] = (
                f"onnxruntime's dynamic quantizer holds several copies of a graph over protobuf's "
                f"2 GB in memory (this one: {fp32_bytes / 1e9:.1f} GB in fp32); on Qwen3-0.6B's "
                "shape it was killed at 24 GB RSS; ov_int8 (weight-only) is the int8 variant here")
        return reasons

    def int8_recipes(self, recipes: tuple[Int8Settings, ...]) -> tuple[Int8Settings, ...]:
        # The ladder's later steps keep GELU up-projections in fp32 or quantize only fused
        # Attention: this graph has neither, so they would repeat the first file or quantize
        # nothing and pass as "int8". Only the recipes on every op apply.
        return tuple(recipe for recipe in recipes
                     if recipe.op_types is None and recipe.fp32_ffn_up_layers == 0)

    def reads_position_0(self, config: Any, task: ExportTask) -> bool:
        return False  # the last prompt token (a seq2seq one: the first decoder step)

    def num_labels(self, config: Any, task: ExportTask) -> int:
        # one output (yes - no) whatever the config's num_labels says
        return 1

    def prompt(self, loaded: LoadedModel) -> dict[str, Any] | None:
        return self.recipe(loaded).to_manifest(answer_token_ids=self.answer_ids(loaded))

    def activation(self, loaded: LoadedModel, task: ExportTask) -> Activation:
        return self.recipe(loaded).score_kind.activation

    def fp32_nodes(self, model_path: Path) -> list[str]:
        onnx = require("onnx", extra="export")
        graph = onnx.load(str(model_path), load_external_data=False).graph
        return [node.name for node in graph.node if node.name.startswith(f"/{SCORE_HEAD}/")]

    def recipe(self, loaded: LoadedModel) -> PromptRecipe:
        """The export's recipe (``--recipe``, or the built-in one for a known Hub id).

        Raises:
            ExportError: No recipe was given or found for this checkpoint.
        """
        from onnxrank.export.recipes import BUILTIN_RECIPES

        recipe = getattr(loaded, "recipe", None)
        if recipe is None:
            where = loaded.source.get("model_id") or loaded.source.get("path")
            raise ExportError(
                f"{where} is a {self.name} model ({loaded.config.model_type}, "
                f"{', '.join(loaded.config.architectures or [])}): it scores pairs through a "
                f"prompt recipe; pass --recipe NAME (built-in: {', '.join(BUILTIN_RECIPES)}) "
                "or --recipe FILE.json"
            )
        return recipe

    def answer_ids(self, loaded: LoadedModel) -> tuple[int, ...]:
        """The ids of the recipe's answer tokens in the checkpoint's tokenizer (its score kind's
        answer_tokens, in order).

        Raises:
            ExportError: An answer word is not a single token, or the template lacks a slot.
        """
        from onnxrank.export.recipes import answer_token_ids

        return answer_token_ids(self.recipe(loaded), loaded.tokenizer.backend_tokenizer)

    def describe(self, config: Any) -> dict[str, Any]:
        return {**super().describe(config), "graph": "logits = the recipe's score kind (weighted "
                "answer-token logits) at each row's last real token; vocabulary projection pruned "
                "to that one row, kept fp32; no KV cache; model_prefix.onnx computes a query's "
                "shared prompt head once and scores its rows against it (prefix_graphs)"}


FAMILY = DecoderFamily()
