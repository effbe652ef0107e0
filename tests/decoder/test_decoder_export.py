"""`onnxrank export --recipe`: the decoder graph equals the model card's p(yes), rows do not depend
on their batch mates, the default variant keeps the ranking, and a wrong recipe is refused."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
from decoder_commands import uncapped_pairs
from decoder_reference import ModelCardReranker

from onnxrank.cli import main
from onnxrank.engine.reranker import Reranker
from onnxrank.engine.spec import load_model_spec, sha256_file, verify_files
from onnxrank.export.recipes import QWEN3_RERANKER

LONG = " ".join(["Flutter of swept wings was measured at transonic speeds in a tunnel."] * 30)


def _spearman(left: np.ndarray, right: np.ndarray) -> float:
    ranks = [np.argsort(np.argsort(values, kind="stable"), kind="stable") for values in (left, right)]
    return float(np.corrcoef(*ranks)[0, 1])


def test_the_manifest_records_the_recipe(decoder_model_dir: Path) -> None:
    spec = load_model_spec(decoder_model_dir)
    assert spec.prompt is not None and spec.prompt["name"] == "qwen3-reranker"
    tokenizer = json.loads((decoder_model_dir / "tokenizer.json").read_text())["model"]["vocab"]
    assert (spec.prompt["yes_token_id"], spec.prompt["no_token_id"]) == (tokenizer["yes"],
                                                                         tokenizer["no"])
    assert (spec.task, spec.num_labels, spec.activation) == ("rerank", 1, "sigmoid")
    assert spec.relevance_trained is False and "fp32" in spec.variants
    assert spec.variants["fp32"].fidelity["max_abs_diff"] <= 1e-4
    # parsed once into the typed recipe; the manifest keeps its own keys and values
    assert spec.recipe == QWEN3_RERANKER
    on_disk = json.loads((decoder_model_dir / "manifest.json").read_text())
    assert "recipe" not in spec.to_dict() and spec.to_dict() == on_disk


def test_fp32_equals_the_model_cards_p_yes(fp32_decoder: Reranker,
                                           model_card: ModelCardReranker) -> None:
    pairs = uncapped_pairs(fp32_decoder.tokenizer, QWEN3_RERANKER, 16)
    pairs += [("wing flutter", LONG), ("flutter", "")]
    expected = model_card.p_yes(pairs)
    scores = fp32_decoder.activate(fp32_decoder.score(pairs))
    assert np.abs(scores - expected).max() <= 1e-4, (
        f"qwen3-tiny fp32 vs the model card: {scores} vs {expected}")
    custom = "Find reports on aircraft structures"
    assert np.abs(fp32_decoder.activate(fp32_decoder.score(pairs[:4], instruction=custom))
                  - model_card.p_yes(pairs[:4], custom)).max() <= 1e-4


def test_a_rows_score_does_not_depend_on_its_batch(fp32_decoder: Reranker,
                                                   decoder_model_dir: Path) -> None:
    pairs = [("wing flutter", LONG), ("q", "short"), ("boundary layer", "laminar flow " * 9)]
    together = fp32_decoder.score(pairs)
    alone = np.concatenate([fp32_decoder.score([pair]) for pair in pairs])
    assert np.abs(together - alone).max() <= 1e-5
    unsorted = Reranker.from_dir(decoder_model_dir, device="cpu", backend="onnxruntime",
                                 precision="fp32", sort_by_length=False, pad_to_multiple=64)
    assert np.abs(unsorted.score(pairs) - alone).max() <= 1e-5


def test_the_default_variant_keeps_the_held_out_ranking(decoder_model_dir: Path,
                                                        model_card: ModelCardReranker) -> None:
    reranker = Reranker.from_dir(decoder_model_dir, device="cpu")
    # the card cuts each row's tail, so a query longer than its share leaves no document; the
    # engine shortens such a query instead: compare the rows both build alike
    pairs = uncapped_pairs(reranker.tokenizer, QWEN3_RERANKER, part="held_out")
    encoder = type(reranker).row_encoder(reranker.tokenizer, reranker.max_length, reranker.spec.recipe)
    assert [list(row.ids) for row in encoder.encode(pairs)] == [
        model_card.token_ids(query, document) for query, document in pairs]
    scores = reranker.activate(reranker.score(pairs))
    spearman = _spearman(scores, model_card.p_yes(pairs))
    assert spearman >= 0.98, (f"{reranker.device_info.backend}/{reranker.device_info.precision}: "
                              f"held-out Spearman {spearman:.4f} vs the model card")


def test_a_graph_over_the_protobuf_limit_keeps_its_weights_beside_it(
    decoder_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    model_card: ModelCardReranker,
) -> None:
    # a 0.6B model is 2.4 GB in fp32; a tiny limit takes the same path with the tiny model
    import onnxrank.export.families.decoder as decoder

    monkeypatch.setattr(decoder, "PROTOBUF_LIMIT_BYTES", 1000)
    out = tmp_path / "models" / "external"
    assert main(["export", "--model", str(decoder_checkpoint), "--recipe", "qwen3-reranker",
                 "--out", str(out), "--variants", "fp32", "--max-length", str(model_card.max_length),
                 "--validation-pairs", "16", "--quiet"]) == 0
    spec = load_model_spec(out)
    data = out / "model.onnx.data"
    assert spec.variants["fp32"].extra_files == {"model.onnx.data": sha256_file(data)}
    assert (out / "model.onnx").stat().st_size < data.stat().st_size
    verify_files(spec, out)
    reranker = Reranker.from_dir(out, device="cpu", backend="onnxruntime", precision="fp32")
    pairs = [("wing flutter", LONG), ("boundary layer", "laminar flow on a flat plate")]
    assert np.abs(reranker.activate(reranker.score(pairs)) - model_card.p_yes(pairs)).max() <= 1e-4


@pytest.mark.parametrize(("change", "message"), [
    ({"yes_token": "maybe"}, "recipe 'broken': yes_token 'maybe' is not a single token of this "
                             "tokenizer (it encodes to {n} tokens {ids}); the score needs the logit "
                             "of one token: pick a recipe whose yes_token is in the vocabulary "
                             "(--recipe NAME or FILE.json)"),
    ({"template": "<Query>: {query}\n<Document>: {document}"},
     "recipe file {path}: template must contain {{instruction}} exactly once, found it 0 times; "
     "slots: {{instruction}}, {{query}}, {{document}}"),
])
def test_a_wrong_recipe_is_a_clear_export_error(
    decoder_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    change: dict[str, str], message: str,
) -> None:
    from tokenizers import Tokenizer

    path = tmp_path / "broken.json"
    path.write_text(json.dumps({**asdict(replace(QWEN3_RERANKER, name="broken")), **change}))
    out = tmp_path / "models" / "broken"
    code = main(["export", "--model", str(decoder_checkpoint), "--recipe", str(path),
                 "--out", str(out), "--variants", "fp32", "--validation-pairs", "16", "--quiet"])
    ids = Tokenizer.from_file(str(decoder_checkpoint / "tokenizer.json")).encode(
        "maybe", add_special_tokens=False).ids
    assert code == 2
    assert capsys.readouterr().err.strip() == "onnxrank export: error: " + message.format(
        n=len(ids), ids=ids, path=path)
    assert not out.exists()


def test_onnxruntime_int8_is_left_out_over_protobufs_limit() -> None:
    # its quantizer was OOM-killed on Qwen3-0.6B's shape, which no failed_variants entry survives
    import transformers

    from onnxrank.export.families.decoder import FAMILY

    full = transformers.Qwen3Config(vocab_size=151669, hidden_size=1024, num_hidden_layers=28,
                                    num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                                    intermediate_size=3072)
    reason = FAMILY.variant_reasons(full)["int8"]
    assert reason.startswith("onnxruntime's dynamic quantizer holds several copies of a graph "
                             "over protobuf's 2 GB in memory (this one: 2.4 GB in fp32)")
    tiny = transformers.Qwen3Config(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    intermediate_size=128)
    assert "int8" not in FAMILY.variant_reasons(tiny)
