"""The export's memory check (onnxrank.export.memory): a checkpoint too large for the machine
fails before its weights load, saying how much memory it needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onnxrank.cli import main

# Qwen/Qwen3-Reranker-8B's published config (Qwen3-8B's shape)
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
    "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
    "torch_dtype": "bfloat16",
}


def qwen3_weights(config: dict[str, int]) -> int:
    """Qwen3's parameters by its architecture: embeddings, untied head, and per layer the
    attention projections, the q/k norms, the gated feed-forward block and two norms."""
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    queries = config["num_attention_heads"] * head_dim
    keys = config["num_key_value_heads"] * head_dim
    layer = (2 * hidden * queries + 2 * hidden * keys + 2 * head_dim
             + 3 * hidden * config["intermediate_size"] + 2 * hidden)
    return 2 * config["vocab_size"] * hidden + config["num_hidden_layers"] * layer + hidden


def test_the_weight_count_needs_no_weights() -> None:
    import transformers

    from onnxrank.export.memory import estimate_memory

    config = transformers.Qwen3Config(**{key: value for key, value in QWEN3_8B.items()
                                         if key not in ("architectures", "model_type")})
    found = estimate_memory(transformers.AutoModelForCausalLM, config)
    assert found.weights == qwen3_weights(QWEN3_8B)
    assert found.needed_bytes > 4 * found.weights


def test_the_weight_count_is_the_loaded_models(decoder_checkpoint: Path) -> None:
    import transformers

    from onnxrank.export.memory import meta_model, weight_count

    model = transformers.AutoModelForCausalLM.from_pretrained(decoder_checkpoint)
    config = transformers.AutoConfig.from_pretrained(decoder_checkpoint)
    assert weight_count(meta_model(transformers.AutoModelForCausalLM, config)) == sum(
        parameter.numel() for parameter in model.parameters())


def _config_only(tmp_path: Path) -> Path:
    checkpoint = tmp_path / "qwen3-8b-config-only"
    checkpoint.mkdir()
    # no weights and no tokenizer: the check must come before either loads
    (checkpoint / "config.json").write_text(json.dumps(QWEN3_8B))
    return checkpoint


def test_an_8b_decoder_on_a_small_machine_fails_before_loading(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import psutil

    from onnxrank.export.memory import (
        DIRECT_PEAK_PER_WEIGHT_BYTE,
        PEAK_BASE_BYTES,
        PEAK_PER_WEIGHT_BYTE,
    )

    needed = PEAK_BASE_BYTES + PEAK_PER_WEIGHT_BYTE * 4 * qwen3_weights(QWEN3_8B)
    if psutil.virtual_memory().available >= needed:
        pytest.skip(f"this machine has the {needed / 2**30:.0f} GiB an 8B export needs")
    checkpoint = _config_only(tmp_path)
    out = tmp_path / "models" / "qwen3-8b"
    code = main(["export", "--model", str(checkpoint), "--recipe", "qwen3-reranker",
                 "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith(f"onnxrank export: error: exporting {checkpoint} needs about "
                          f"{needed / 2**30:.0f} GiB of memory (8.19B weights, 30.5 GiB in "
                          "float32, which the export traces and validates in)")
    assert "GiB available: export it on a machine with at least" in err
    # the weight-compressed route converts the published checkpoint's bfloat16 weights
    direct = PEAK_BASE_BYTES + DIRECT_PEAK_PER_WEIGHT_BYTE * 2 * qwen3_weights(QWEN3_8B)
    assert err.endswith("or export the weight-only int8 IR alone (--variants ov_int8), which "
                        f"converts the weights in bfloat16 and needs about "
                        f"{direct / 2**30:.0f} GiB")
    assert not out.exists()


def test_the_weight_compressed_route_checks_its_own_need(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import psutil

    from onnxrank.export.memory import DIRECT_PEAK_PER_WEIGHT_BYTE, PEAK_BASE_BYTES

    needed = PEAK_BASE_BYTES + DIRECT_PEAK_PER_WEIGHT_BYTE * 2 * qwen3_weights(QWEN3_8B)
    if psutil.virtual_memory().available >= needed:
        pytest.skip(f"this machine has the {needed / 2**30:.0f} GiB the 8B shape's "
                    "weight-compressed export needs")
    checkpoint = _config_only(tmp_path)
    code = main(["export", "--model", str(checkpoint), "--recipe", "qwen3-reranker",
                 "--variants", "ov_int8", "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert f"needs about {needed / 2**30:.0f} GiB of memory (8.19B weights, 15.3 GiB in " \
           "bfloat16, which the weight-compressed route converts and validates from)" in err
    assert "--variants ov_int8" not in err
