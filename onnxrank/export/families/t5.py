"""Seq2seq rerankers scored at the first decoder step (monoT5, InRanker, mT5 mMARCO): a T5 or mT5
``*ForConditionalGeneration`` reading a prompt recipe (onnxrank.export.recipes: ``monot5``,
``mt5-mmarco``), the decoder-reranker contract of onnxrank.export.families.decoder with an
encoder in front.

What the exported graph computes:

* inputs ``input_ids`` and ``attention_mask`` [batch, sequence]: the recipe's rows, right-padded
  as every model's (T5's relative position bias makes a row's encoding independent of padding:
  padded keys are masked, and each row's positions start at 0). No token_type_ids.
* the encoder over the rows, then ONE decoder step from ``decoder_start_token_id`` (T5's pad id)
  cross-attending to them: the step pygaggle and the rerankers library run (their
  ``decoder_input_ids`` is that one token). No KV cache, no generation.
* the score head (module ``score_head``, kept fp32 by the int8 variants like a decoder's): the
  score kind's weighted sum of the answer tokens' rows of ``lm_head`` (``W[true] - W[false]``),
  times T5's ``d_model ** -0.5`` where the config scales the decoder's output before the head
  (original T5 checkpoints such as monoT5; not T5 v1.1 or mT5). Output ``logits`` [batch, 1]; sigmoid of it is
  softmax over the two answer tokens, p(true).

Prefix reuse (model_prefix.onnx) does not apply: every encoder token attends to the whole row, so
no part of a row's encoding is shared with another row's (the query's tokens see the document).

The PyTorch reference is the unmodified model's forward with ``decoder_input_ids`` of the start
token: the full vocabulary logits at step 0, the answer tokens' taken from them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxrank._optional import require
from onnxrank.export.families.base import Family
from onnxrank.export.families.decoder import SCORE_HEAD, DecoderFamily
from onnxrank.export.onnx import Exporter

if TYPE_CHECKING:
    import torch

    from onnxrank.export.loaded import LoadedModel
    from onnxrank.export.tasks import ExportTask

# monoT5's and the mT5 mMARCO models' max_length (pygaggle, the rerankers library): T5's relative
# positions set no limit of their own
DEFAULT_MAX_LENGTH = 512
# the --max-length an export accepts: a cap on the attention's memory, not on positions
NO_POSITION_LIMIT = 1 << 16


def score_graph(model: Any, *, answer_ids: tuple[int, ...],
                weights: tuple[float, ...]) -> torch.nn.Module:
    """The module torch.onnx.export traces: (input_ids, attention_mask) -> the score,
    sum(weight * logit(answer token)) at the first decoder step.

    Args:
        model: A transformers T5 or mT5 ``*ForConditionalGeneration`` in eval mode.
        answer_ids: Vocabulary rows of the recipe's answer tokens.
        weights: The score kind's weight of each answer token.
    """
    torch = require("torch", extra="export")
    config = model.config
    rows = model.get_output_embeddings().weight.detach().to(torch.float32)[list(answer_ids)]
    direction = torch.tensor(weights, dtype=torch.float32) @ rows
    # what T5 does before lm_head where its config says so (transformers 5's T5Config; MT5Config
    # has no such flag and mT5 never scales); the export's fp32 gate holds it to the model
    if getattr(config, "scale_decoder_outputs", False):
        direction = direction * config.d_model ** -0.5

    class Seq2SeqScoreGraph(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.encoder = model.get_encoder()
            self.decoder = model.get_decoder()
            head = torch.nn.Linear(direction.shape[0], 1, bias=False)
            with torch.no_grad():
                head.weight.copy_(direction.reshape(1, -1))
            self.add_module(SCORE_HEAD, head)

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            encoded = self.encoder(input_ids=input_ids,
                                   attention_mask=attention_mask).last_hidden_state
            start = torch.full((input_ids.shape[0], 1), config.decoder_start_token_id,
                               dtype=input_ids.dtype, device=input_ids.device)
            hidden = self.decoder(input_ids=start, encoder_hidden_states=encoded,
                                  encoder_attention_mask=attention_mask,
                                  use_cache=False).last_hidden_state
            return getattr(self, SCORE_HEAD)(hidden[:, 0].float())

    return Seq2SeqScoreGraph().eval()


def reference_runner(model: Any, *, answer_ids: tuple[int, ...],
                     weights: tuple[float, ...]) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
    """The unmodified model as run(feeds) -> [batch, 1] sum(weight * logit(answer token)) at the
    first decoder step."""
    torch = require("torch", extra="export")
    coefficients = torch.tensor(weights, dtype=torch.float32)

    def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
        input_ids = torch.from_numpy(feeds["input_ids"])
        start = torch.full((input_ids.shape[0], 1), model.config.decoder_start_token_id,
                           dtype=input_ids.dtype)
        with torch.inference_mode():
            logits = model(input_ids=input_ids,
                           attention_mask=torch.from_numpy(feeds["attention_mask"]),
                           decoder_input_ids=start, use_cache=False).logits
        return (logits[:, 0, list(answer_ids)].float() @ coefficients).reshape(-1, 1).numpy()

    return run


class T5Family(DecoderFamily):
    """T5 and mT5 encoder-decoders scored with a prompt recipe (``--recipe monot5``; a built-in
    one is chosen by Hub id). Recipes, answer tokens, the score head kept fp32 and the int8
    recipes are the decoder family's; the graph and its reference are this module's.

    Tested on tiny random T5ForConditionalGeneration and MT5ForConditionalGeneration checkpoints
    with a Unigram vocabulary against transformers' forward.
    """

    name = "t5"
    model_types: tuple[str, ...] = ("t5", "mt5")
    examples: tuple[str, ...] = (
        "castorini/monot5-base-msmarco", "castorini/monot5-base-msmarco-10k",
        "unicamp-dl/InRanker-small", "unicamp-dl/mt5-base-mmarco-v2")
    direct_openvino = False
    exporters: tuple[Exporter, ...] = ("torchscript",)
    score_graph = staticmethod(score_graph)
    score_reference = staticmethod(reference_runner)

    def model_class(self, task: ExportTask) -> Any:
        transformers = require("transformers", extra="export")
        return transformers.AutoModelForSeq2SeqLM

    def max_positions(self, config: Any) -> int:
        # no position table: the bucketed relative bias takes a row of any length
        return NO_POSITION_LIMIT

    def max_length(self, config: Any, tokenizer: Any) -> int:
        return DEFAULT_MAX_LENGTH

    # the cross-encoders' export (one self-contained file), not the decoders' own trace
    export_graph = Family.export_graph

    def export_prefix_graph(self, loaded: LoadedModel, model: Any, out_path: Path, *,
                            opset: int) -> tuple[str, ...] | None:
        return None

    def cls_only_support(self, model: Any) -> str | None:
        return ("a seq2seq reranker reads the first decoder step, not [CLS]: its vocabulary "
                "projection is pruned to the answer tokens' rows instead (see the manifest's prompt)")

    def variant_reasons(self, config: Any) -> dict[str, str]:
        # the base's reasons: the decoder's protobuf-size guard measures a causal LM's body
        return Family.variant_reasons(self, config)

    def describe(self, config: Any) -> dict[str, Any]:
        return {**Family.describe(self, config), "graph": (
            "logits = the recipe's score kind (weighted answer-token logits) at the first decoder "
            "step from decoder_start_token_id over the encoded rows; vocabulary projection pruned "
            "to that one row, kept fp32; no KV cache; no prefix graph (the encoder attends both "
            "ways, so rows share no encoding)")}


FAMILY = T5Family()
