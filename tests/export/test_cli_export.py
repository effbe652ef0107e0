"""`onnxrank export` flags, their scoped environment twins, and replacing an existing export."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest

from onnxrank.cli import main
from onnxrank.engine.spec import load_model_spec

pytestmark = pytest.mark.costly(50)

QUICK = ["--validation-pairs", "16", "--calibration-pairs", "32", "--quiet"]
# what a 16-pair subset holds (onnxrank.export.validate.load_validation_pairs): one group per part
PART_REGIMES = (("tuning", "short"), ("held-out", "short"))


def _leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name == name or p.name.startswith(f".{name}."))


def test_task_max_length_opset_from_flags_and_scoped_env_twins(
    tiny_embedder_checkpoint_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "models" / "embedder"
    monkeypatch.setenv("ONNXRANK_EXPORT_MODEL", str(tiny_embedder_checkpoint_dir))
    monkeypatch.setenv("ONNXRANK_EXPORT_OUT", str(out))
    # the engine's global twins mean something else (the rerank model, bench/eval reports): the
    # export command must not read them
    monkeypatch.setenv("ONNXRANK_MODEL", "no-such-model")
    monkeypatch.setenv("ONNXRANK_OUT", str(tmp_path / "wrong"))
    code = main(["export", "--task", "embedding", "--max-length", "128", "--opset", "18",
                 "--variants", "fp32", *QUICK])
    assert code == 0, capsys.readouterr().err
    spec = load_model_spec(out)
    assert (spec.task, spec.max_length, spec.variants["fp32"].opset) == ("embedding", 128, 18)
    opsets = {entry.domain: entry.version for entry in onnx.load(str(out / "model.onnx")).opset_import}
    assert opsets[""] == 18
    assert not (tmp_path / "wrong").exists()


def test_bad_max_length_and_task_are_reported(
    tiny_embedder_checkpoint_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "models" / "x"
    assert main(["export", "--model", str(tiny_embedder_checkpoint_dir), "--out", str(out),
                 "--task", "embedding", "--max-length", "600", "--variants", "fp32", *QUICK]) == 2
    assert capsys.readouterr().err.strip() == (
        "onnxrank export: error: --max-length 600 exceeds the model's 512 position embeddings; "
        "pass --max-length 512 or less")
    assert main(["export", "--model", str(tiny_embedder_checkpoint_dir), "--out", str(out),
                 "--task", "rerank", "--variants", "fp32", *QUICK]) == 2
    assert "has no sequence-classification head (architectures: BertModel)" in (
        capsys.readouterr().err)
    with pytest.raises(SystemExit):
        main(["export", "--task", "classify"])
    assert "argument --task: invalid choice: 'classify'" in capsys.readouterr().err
    assert _leftovers(out.parent, "x") == []


@pytest.mark.parametrize(("flags", "expected"), [
    (["--int8-method", "per_row"],
     {"method": "per_row", "block_size": 32, "source_variant": "fp32"}),
    (["--int8-method", "dynamic"],
     {"method": "dynamic", "per_channel": True, "source_variant": "opt"}),
    (["--int8-method", "dynamic", "--int8-per-tensor"],
     {"method": "dynamic", "per_channel": False, "source_variant": "opt"}),
    (["--int8-method", "static", "--int8-per-tensor"],
     {"method": "static", "per_channel": False, "source_variant": "fp32"}),
])
def test_int8_method_flags_force_one_recipe(
    tiny_checkpoint_dir: Path, tmp_path: Path, flags: list[str], expected: dict[str, object],
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "models" / "int8"
    # static MinMax QDQ wrecks rankings (docs/export.md): the gate is opened to look at the recipe
    code = main(["export", "--model", str(tiny_checkpoint_dir), "--out", str(out), *flags,
                 "--variants", "fp32,int8", "--int8-min-spearman", "-1",
                 "--int8-min-spearman-per-query", "-1", "--int8-min-top10-overlap", "0", *QUICK])
    assert code == 0, capsys.readouterr().err
    quantization = load_model_spec(out).variants["int8"].quantization
    assert {key: quantization[key] for key in expected} == expected
    assert len(quantization["attempts"]) == 1
    if expected["method"] == "static":
        # calibrated on the calibration pairs (--calibration-pairs 32: one whole group of 30, in
        # batches of 16), not on validation pairs
        assert quantization["calibration"] == {"method": "MinMax", "batches": 2, "rows": 30}


@pytest.mark.parametrize(("flag", "pairs"), [("--validation-pairs", "validation"),
                                             ("--calibration-pairs", "calibration")])
def test_pair_counts_below_one_fail_before_loading(flag: str, pairs: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # "x/y" is neither a directory nor a reachable Hub id: only a check before loading says this
    assert main(["export", "--model", "x/y", flag, "0"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"onnxrank export: error: {pairs} pairs must be >= 1, got 0")


def test_int8_per_tensor_needs_an_explicit_method(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "--model", "x/y", "--int8-per-tensor"]) == 2
    assert capsys.readouterr().err.strip() == (
        "onnxrank export: error: --int8-per-tensor needs --int8-method dynamic or static; 'auto' "
        "tries its own fixed recipes (see docs/export.md)")


def test_every_rerank_threshold_flag_is_enforced(
    tiny_checkpoint_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a variant beyond its threshold is left out with the message; fp32 passing keeps the export
    out = tmp_path / "models" / "strict"
    code = main(["export", "--model", str(tiny_checkpoint_dir), "--out", str(out),
                 "--variants", "fp32,opt,int8,fp16",
                 "--opt-max-abs-diff", "-1", "--fp16-max-abs-diff", "-1",
                 "--int8-min-spearman", "1.5", "--int8-min-spearman-per-query", "1.5",
                 "--int8-min-top10-overlap", "1.5",
                 "--validation-pairs", "16"])
    assert code == 0
    spec = load_model_spec(out)
    assert list(spec.variants) == ["fp32"]
    for variant, metric, threshold, flag in (
            ("opt", "max_abs_diff", "<= -1", "--opt-max-abs-diff"),
            ("fp16", "max_abs_diff", "<= -1", "--fp16-max-abs-diff"),
            ("int8", "spearman", ">= 1.5", "--int8-min-spearman"),
            ("int8", "spearman_per_query_mean", ">= 1.5", "--int8-min-spearman-per-query"),
            ("int8", "top10_overlap", ">= 1.5", "--int8-min-top10-overlap")):
        reason = spec.failed_variants[variant]["reason"]
        assert spec.failed_variants[variant]["stage"] == "validation"
        for part, regime in PART_REGIMES:
            assert re.search(rf"variant {variant} \({part}, {regime} pairs\): {metric} = [-0-9.e]+, "
                             rf"threshold {re.escape(threshold)} \({flag}\)", reason), (flag, reason)
    summary = capsys.readouterr().out
    for variant in ("opt", "fp16", "int8"):
        assert re.search(rf"  {variant} +left out \(validation\): variant {variant} ", summary)
    # fp32 is the reference graph: its gate failing fails the export
    code = main(["export", "--model", str(tiny_checkpoint_dir), "--out", str(out),
                 "--variants", "fp32,opt", "--fp32-max-abs-diff", "-1", *QUICK])
    assert code == 2
    error = capsys.readouterr().err
    for part, regime in PART_REGIMES:
        assert re.search(rf"variant fp32 \({part}, {regime} pairs\): max_abs_diff_scaled = [-0-9.e]+, "
                         r"threshold <= -1 \(--fp32-max-abs-diff\)", error), error
    assert load_model_spec(out).failed_variants["opt"]["stage"] == "validation"  # untouched


def test_embedding_threshold_flags_are_enforced(
    tiny_embedder_checkpoint_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "models" / "strict"
    code = main(["export", "--model", str(tiny_embedder_checkpoint_dir), "--out", str(out),
                 "--task", "embedding", "--variants", "fp32,int8", "--int8-min-cosine", "1.5",
                 *QUICK])
    assert code == 0
    assert re.search(r"variant int8 \(held-out, short pairs\): cosine_min = [0-9.]+, threshold >= 1\.5 "
                     r"\(--int8-min-cosine\)", load_model_spec(out).failed_variants["int8"]["reason"])
    code = main(["export", "--model", str(tiny_embedder_checkpoint_dir), "--out", str(out),
                 "--task", "embedding", "--variants", "fp32", "--embedding-min-cosine", "1.5",
                 *QUICK])
    assert code == 2
    error = capsys.readouterr().err
    assert re.search(r"variant fp32 \(tuning, short pairs\): cosine_min = [0-9.]+, threshold >= 1\.5 "
                     r"\(--embedding-min-cosine\)", error), error


def test_export_replaces_an_earlier_export(
    tiny_checkpoint_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "models" / "tiny"
    assert main(["export", "--model", str(tiny_checkpoint_dir), "--out", str(out),
                 "--variants", "fp32,opt", *QUICK]) == 0
    first = load_model_spec(out)
    monkeypatch.setenv("ONNXRANK_EXPORT_QUIET", "yes")  # the one boolean parser: yes = true
    assert main(["export", "--model", str(tiny_checkpoint_dir), "--out", str(out),
                 "--variants", "fp32", "--max-length", "64", "--validation-pairs", "16"]) == 0
    assert capsys.readouterr().out == ""  # quiet came from the twin
    second = load_model_spec(out)
    assert (first.max_length, second.max_length) == (512, 64)
    assert set(second.variants) == {"fp32"} and not (out / "model_opt.onnx").exists()
    assert _leftovers(out.parent, "tiny") == ["tiny"]
    # a directory that is not an export is never replaced
    stranger = tmp_path / "models" / "notes"
    stranger.mkdir()
    (stranger / "keep.txt").write_text("mine")
    assert main(["export", "--model", str(tiny_checkpoint_dir), "--out", str(stranger),
                 "--variants", "fp32", "--validation-pairs", "16"]) == 2
    assert f"output directory {stranger} is not empty and holds no manifest.json" in (
        capsys.readouterr().err)
    assert (stranger / "keep.txt").read_text() == "mine"
