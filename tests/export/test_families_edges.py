"""The family machinery's edges: the [CLS]-only last layer against the full model, the reference's
SDPA twin against the eager model, a model_type with no family module (fp32 only, said why), one
that cannot be traced (fails naming what is missing), and a long-context family (its max_length
kept, its windows working)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from child_process import in_child_process
from family_cases import CROSS_ENCODERS, PAIRS, TINY_PAIRS

from onnxrank.bench.family_checkpoints import build_family_checkpoint
from onnxrank.cli import main
from onnxrank.engine.spec import load_model_spec
from onnxrank.export.families import family_for
from onnxrank.export.families.base import sdpa_twin

pytestmark = pytest.mark.costly(15)


def _eager_model(checkpoint: Path) -> Any:
    import transformers

    return transformers.AutoModelForSequenceClassification.from_pretrained(
        checkpoint, attn_implementation="eager").eval()


def _agree(checkpoint: Path, model: Any, other: Any) -> None:
    """`other` scores PAIRS (one padded batch) as `model` does, within 1e-5 of the score range."""
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    batch = tokenizer([q for q, _ in PAIRS], [p for _, p in PAIRS], padding=True,
                      return_tensors="pt")
    with torch.inference_mode():
        expected, scores = model(**batch).logits, other(**batch).logits
    spread = float(expected.max() - expected.min())
    assert spread > 0
    assert float((expected - scores).abs().max()) <= 1e-5 * max(spread, 1.0)


@pytest.mark.parametrize("family", CROSS_ENCODERS)
def test_reads_position_0_says_whether_the_score_moves_with_the_other_rows(
        family: str, family_checkpoints: dict[str, Path]) -> None:
    # what per-row int8 keeps float (Int8Settings.cls_row_ratio) must be the row the score reads:
    # move every other row of the last layer's output and see whether the score follows
    import torch

    from onnxrank.export.tasks import EMBEDDING, RERANK

    checkpoint = family_checkpoints[family]
    model = _eager_model(checkpoint)
    family_module = family_for(model.config)
    base = model.base_model
    last = (base.encoder.layer if hasattr(base, "encoder") else base.layers)[-1]

    def move_other_rows(module: Any, args: Any, output: Any) -> Any:
        hidden = output[0] if isinstance(output, tuple) else output
        moved = torch.cat([hidden[:, :1], hidden[:, 1:] * 3.0 + 1.0], dim=1)
        return (moved, *output[1:]) if isinstance(output, tuple) else moved

    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    batch = tokenizer([q for q, _ in PAIRS], [p for _, p in PAIRS], padding=True,
                      return_tensors="pt")
    with torch.inference_mode():
        expected = model(**batch).logits
        handle = last.register_forward_hook(move_other_rows)
        moved = model(**batch).logits
        handle.remove()
    unmoved = bool(torch.allclose(expected, moved, atol=1e-6))
    assert family_module.reads_position_0(model.config, RERANK) is unmoved
    assert family_module.reads_position_0(model.config, EMBEDDING) is False


@pytest.mark.parametrize("family", CROSS_ENCODERS)
def test_cls_only_last_layer_matches_the_full_model_where_applied(
        family: str, family_checkpoints: dict[str, Path]) -> None:
    model = _eager_model(family_checkpoints[family])
    family_module = family_for(model.config)
    reason = family_module.cls_only_support(model)
    if reason is not None:
        assert family in ("modernbert", "deberta-v2"), reason
        return
    _agree(family_checkpoints[family], model, family_module.cls_only_model(model))


@pytest.mark.parametrize("family", CROSS_ENCODERS)
def test_the_reference_twin_runs_sdpa_on_the_same_weights_and_scores_alike(
        family: str, family_checkpoints: dict[str, Path]) -> None:
    model = _eager_model(family_checkpoints[family])
    twin = sdpa_twin(model)
    assert model.config._attn_implementation == "eager"  # the traced model is left as it was
    if not type(model)._supports_sdpa:  # transformers 4.57 has no SDPA path for these two
        assert family in ("deberta-v2", "electra") and twin is model
        return
    assert twin.config._attn_implementation == "sdpa"
    assert all(mine.data_ptr() == its.data_ptr() for mine, its in
               zip(model.state_dict(keep_vars=True).values(),
                   twin.state_dict(keep_vars=True).values(), strict=True))
    assert not any(buffer.is_meta for buffer in twin.buffers())
    _agree(family_checkpoints[family], model, twin)


def test_unknown_family_exports_fp32_only_and_says_why(
        family_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    import torch
    import transformers

    from onnxrank.export.pipeline import ExportRequest, export_model

    checkpoint = tmp_path / "distilbert"
    tokenizer = transformers.AutoTokenizer.from_pretrained(family_checkpoints["bert"])
    config = transformers.DistilBertConfig(vocab_size=len(tokenizer), dim=32, n_layers=2, n_heads=2,
                                           hidden_dim=64, num_labels=1, initializer_range=0.2)
    torch.manual_seed(0)
    transformers.DistilBertForSequenceClassification(config).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    spec = in_child_process(export_model, ExportRequest(
        model=str(checkpoint), out_dir=tmp_path / "out", validation_pairs=TINY_PAIRS)).spec
    assert list(spec.variants) == ["fp32"]
    assert spec.family["known"] is False and spec.family["model_type"] == "distilbert"
    for variant in ("opt", "int8", "fp16", "ov_int8"):
        assert spec.failed_variants[variant] == {
            "stage": "not applicable",
            "reason": "model_type 'distilbert' has no family module in onnxrank.export.families: "
                      "only the plain fp32 graph is exported"}
    assert spec.graph_rewrites["cls_only_last_layer"]["applied"] is False


def test_family_that_cannot_be_traced_fails_naming_the_family_and_what_is_missing(
        family_checkpoints: dict[str, Path], tmp_path: Path) -> None:
    import torch
    import transformers

    from onnxrank.errors import ExportError
    from onnxrank.export.pipeline import ExportRequest, export_model

    # FNet mixes tokens with a Fourier transform (torch.fft) that the ONNX exporter cannot trace,
    # and its config has no attention heads
    checkpoint = tmp_path / "fnet"
    tokenizer = transformers.AutoTokenizer.from_pretrained(family_checkpoints["bert"])
    config = transformers.FNetConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                     intermediate_size=64, num_labels=1)
    torch.manual_seed(0)
    transformers.FNetForSequenceClassification(config).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    out = tmp_path / "out"
    with pytest.raises(ExportError) as raised:
        in_child_process(export_model, ExportRequest(model=str(checkpoint), out_dir=out,
                                                     validation_pairs=TINY_PAIRS))
    message = str(raised.value)
    assert "(unknown (fnet) family, model_type 'fnet'" in message
    assert "fft" in message and "needs a family module in onnxrank.export.families" in message
    assert not (out / "manifest.json").exists()


def test_long_context_family_keeps_its_max_length_and_windows_work(tmp_path: Path) -> None:
    from onnxrank.engine.config import EngineConfig
    from onnxrank.engine.reranker import Reranker

    # twice BERT's 512 is long enough to show it; at 2048 the export's eager attention over the
    # tiny tokenizer's 2,000-token validation rows took 4.5 GB
    checkpoint = build_family_checkpoint("modernbert", tmp_path / "long", size="tiny",
                                         max_position_embeddings=1024)
    out = tmp_path / "long-model"
    assert in_child_process(main, ["export", "--model", str(checkpoint), "--out", str(out),
                                   "--variants", "fp32", "--validation-pairs", "16", "--quiet"]) == 0
    spec = load_model_spec(out)
    assert spec.max_length == 1024
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model_config"]["max_position_embeddings"] == 1024
    long_document = " ".join(["the lift of a thin wing in supersonic flow"] * 400)
    pairs = [("thin wing lift", long_document), ("thin wing lift", "heat transfer")]
    reranker = Reranker.from_dir(out, EngineConfig(device="cpu", threads=1, max_batch_tokens=4096))
    whole = reranker.score_detailed(pairs)
    # the long document is read whole: one row longer than a BERT-sized model's 512, in a
    # batch of the token-budget batcher
    assert int(whole.token_counts[0]) > 512
    assert max(length for _, length in whole.batches) > 512
    chunked = Reranker.from_dir(out, EngineConfig(device="cpu", threads=1, max_batch_tokens=4096,
                                                  long_documents="max_chunk", window_tokens=256))
    chunked_run = chunked.score_detailed(pairs)
    windows = chunked_run.scores
    assert len(chunked_run.batches) >= 1 and max(length for _, length in chunked_run.batches) <= 512
    assert whole.scores.shape == windows.shape == (2,)
    assert np.isfinite(windows).all()
    # the short document fits one window: its score is the same either way
    assert abs(float(windows[1]) - float(whole.scores[1])) < 1e-4
