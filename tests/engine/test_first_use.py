"""Export on first use: a checkpoint directory that is not exported yet is exported once into the
user cache (here always under tmp_path), and loaded from there afterwards."""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from onnxrank import Reranker
from onnxrank.cli import build_parser, main
from onnxrank.cli.options import locate_model
from onnxrank.engine import runtime
from onnxrank.engine.embedder import Embedder
from onnxrank.engine.first_use import cache_entry, exportable
from onnxrank.errors import ExportError, MissingDependencyError, ModelLoadError

PAIRS = [("wing flutter", "flutter of a wing in a slipstream"), ("heat", "heat transfer in slabs"),
         ("boundary layer", "the laminar boundary layer on a flat plate at zero incidence")]
VALIDATION_PAIRS = 48  # the first-use export validates on as many pairs as the tiny fixtures


def models_cache(tmp_path: Path) -> Path:
    return tmp_path / "xdg" / "onnxrank" / runtime.EXPORT_CACHE_DIR


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """XDG_CACHE_HOME under tmp_path; returns the first-use exports' directory."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return models_cache(tmp_path)


def export_records(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name.startswith(("onnxrank.export", "onnxrank.engine.first_use"))]


def test_a_checkpoint_is_exported_once_then_loaded_from_the_cache(
    tiny_checkpoint_dir: Path, tiny_model_dir: Path, cache_home: Path, tmp_path: Path,
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from onnxrank.export import pipeline

    # The first use asks for `onnxrank export --model NAME --task rerank` with every default; the
    # request is checked as asked, then the real pipeline runs it for the fp32 variant on the
    # fixtures' validation pairs. Building and gating every variant is tests/export's (and the
    # tiny_model_dir fixture's); the ov_int8 and int8 ladders of the default request, all missed
    # by a tiny random model, took about 50 of this test's 60 s of CPU.
    requests: list[pipeline.ExportRequest] = []
    export_model = pipeline.export_model

    def export_fp32(request: pipeline.ExportRequest, *,
                    show_progress: bool) -> pipeline.ExportResult:
        requests.append(request)
        return export_model(replace(request, variants=("fp32",),
                                    validation_pairs=VALIDATION_PAIRS),
                            show_progress=show_progress)

    monkeypatch.setattr(pipeline, "export_model", export_fp32)
    caplog.set_level(logging.INFO)
    # one backend for every load: with backend="auto" each manifest is probed on its own, and two
    # runtimes give the same graph scores that differ in the last float bits
    pinned = {"device": "cpu", "backend": "onnxruntime", "precision": "fp32"}
    first = Reranker.from_pretrained(tiny_checkpoint_dir, **pinned)
    entry = first.model_dir
    assert entry.parent == cache_home and entry.name.startswith("tiny-reranker-")
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["source"]["kind"] == "local"
    assert manifest["source"]["path"] == str(tiny_checkpoint_dir.resolve())
    # the same request as `onnxrank export --model NAME --task rerank`: every variant, every default
    [request] = requests
    assert request.out_dir is not None and request.out_dir.name == entry.name
    assert replace(request, out_dir=None) == pipeline.ExportRequest(
        model=str(tiny_checkpoint_dir), task="rerank")
    assert set(request.variants) == {"fp32", "opt", "int8", "fp16", "ov_int8"}
    assert list(manifest["variants"]) == ["fp32"]
    for variant in manifest["variants"].values():
        assert (entry / variant["file"]).is_file()
    logged = export_records(caplog)
    assert any(message.startswith(f"{tiny_checkpoint_dir} is not exported yet: exporting it "
                                  f"once as a rerank model into {entry}") for message in logged)
    assert "export step: manifest" in logged
    assert sorted(path.name for path in cache_home.iterdir()) == [entry.name]  # no staging left

    before = ((entry / "manifest.json").read_bytes(), entry.stat().st_mtime_ns)
    caplog.clear()
    second = Reranker.from_pretrained(str(tiny_checkpoint_dir), **pinned)
    assert second.model_dir == entry
    assert export_records(caplog) == []
    assert ((entry / "manifest.json").read_bytes(), entry.stat().st_mtime_ns) == before
    # the fp32 graph is the explicit export's, byte for byte, and so are its scores
    explicit = Reranker.from_dir(tiny_model_dir, **pinned)
    assert second.spec.variants["fp32"].sha256 == explicit.spec.variants["fp32"].sha256
    np.testing.assert_array_equal(second.score(PAIRS), explicit.score(PAIRS))

    # a command that loads a model by name finds the same entry without exporting
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"id": f"p{index}", "query": query, "document": text})
                             + "\n" for index, (query, text) in enumerate(PAIRS)), "utf-8")
    caplog.clear()
    assert main(["score", "--input", str(pairs), "--output", str(tmp_path / "scores.jsonl"),
                 "--model", str(tiny_checkpoint_dir), "--backend", "onnxruntime", "--precision", "fp32",
                 "--device", "cpu",
                 "--no-progress"]) == 0
    assert export_records(caplog) == []
    scores = [json.loads(line)["score"] for line in
              (tmp_path / "scores.jsonl").read_text("utf-8").splitlines()]
    np.testing.assert_allclose(scores, explicit.score(PAIRS), rtol=1e-6)
    assert sorted(path.name for path in cache_home.iterdir()) == [entry.name]
    capsys.readouterr()


def test_an_exported_model_directory_loads_directly(tiny_model_dir: Path, cache_home: Path) -> None:
    reranker = Reranker.from_pretrained(tiny_model_dir, device="cpu", precision="fp32")
    assert reranker.model_dir == tiny_model_dir
    assert not cache_home.exists()
    assert not exportable(tiny_model_dir)  # it holds a manifest.json


def test_export_on_first_use_can_be_refused(tiny_checkpoint_dir: Path, cache_home: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    refusal = re.escape("or let it be exported on first use (export_on_first_use=True, "
                        "--export-on-first-use)")
    with pytest.raises(ModelLoadError, match=refusal):
        Reranker.from_pretrained(tiny_checkpoint_dir, export_on_first_use=False)
    query = ["score", "--input", "in.jsonl", "--output", "out.jsonl",
             "--model", str(tiny_checkpoint_dir)]
    with pytest.raises(ModelLoadError, match=refusal):
        locate_model(build_parser().parse_args([*query, "--no-export-on-first-use"]),
                     str(tiny_checkpoint_dir))
    monkeypatch.setenv("ONNXRANK_EXPORT_ON_FIRST_USE", "0")  # the generated twin
    with pytest.raises(ModelLoadError, match=refusal):
        locate_model(build_parser().parse_args(query), str(tiny_checkpoint_dir))
    assert not cache_home.exists()


def test_each_command_exports_its_kind(tiny_checkpoint_dir: Path, tiny_model_dir: Path,
                                      tiny_embedder_dir: Path, cache_home: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, str, Path]] = []
    exported = {"rerank": tiny_model_dir, "embedding": tiny_embedder_dir}

    def fake_export(name: str | Path, task: str, cache_root: Path) -> Path:
        calls.append((str(name), task, cache_root))
        return exported[task]

    monkeypatch.setattr(runtime, "export_once", fake_export)
    checkpoint = str(tiny_checkpoint_dir)
    assert Embedder.from_pretrained(checkpoint, device="cpu").model_dir == tiny_embedder_dir
    assert Reranker.from_pretrained(checkpoint, device="cpu").model_dir == tiny_model_dir
    serve = build_parser().parse_args(["serve", "--model", checkpoint])
    assert locate_model(serve, checkpoint) == tiny_model_dir
    index = build_parser().parse_args(["index", "--source", "docs", "--index", "idx",
                                       "--embedder", checkpoint])
    assert locate_model(index, checkpoint, task="embedding") == tiny_embedder_dir
    assert calls == [(checkpoint, "embedding", cache_home), (checkpoint, "rerank", cache_home),
                     (checkpoint, "rerank", cache_home), (checkpoint, "embedding", cache_home)]


def test_a_failed_export_leaves_the_cache_clean(tiny_embedder_checkpoint_dir: Path,
                                                cache_home: Path) -> None:
    # a sentence-transformers checkpoint has no sequence-classification head: no reranker
    with pytest.raises(ExportError, match="has no sequence-classification head"):
        Reranker.from_pretrained(tiny_embedder_checkpoint_dir, device="cpu")
    assert list(cache_home.iterdir()) == []


def test_without_the_export_extra(tiny_checkpoint_dir: Path, cache_home: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    with pytest.raises(MissingDependencyError, match=re.escape('pip install "onnxrank[export]"')):
        Reranker.from_pretrained(tiny_checkpoint_dir, device="cpu")
    assert not cache_home.exists()


def test_a_concurrent_export_keeps_the_first_published_entry(
    tiny_checkpoint_dir: Path, tiny_model_dir: Path, cache_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from onnxrank.export import pipeline

    entry = cache_entry(tiny_checkpoint_dir, "rerank", cache_home)

    def export_while_another_process_publishes(request: pipeline.ExportRequest, *,
                                               show_progress: bool) -> None:
        shutil.copytree(tiny_model_dir, request.out_dir)  # this process's export
        shutil.copytree(tiny_model_dir, entry)  # the other one's, renamed into place first
        (entry / "published-by").write_text("the other process")

    monkeypatch.setattr(pipeline, "export_model", export_while_another_process_publishes)
    assert runtime.export_once(tiny_checkpoint_dir, "rerank", cache_home) == entry
    assert (entry / "published-by").read_text() == "the other process"
    assert sorted(path.name for path in cache_home.iterdir()) == [entry.name]


def test_cache_entries_follow_the_checkpoint_and_the_task(tiny_checkpoint_dir: Path,
                                                          tmp_path: Path) -> None:
    root = tmp_path / "cache"
    entry = cache_entry(tiny_checkpoint_dir, "rerank", root)
    assert entry == cache_entry(str(tiny_checkpoint_dir), "rerank", root)
    assert entry != cache_entry(tiny_checkpoint_dir, "embedding", root)
    copy = tmp_path / "copy" / "tiny-reranker"
    shutil.copytree(tiny_checkpoint_dir, copy)
    assert cache_entry(copy, "rerank", root) != entry  # another directory, another export
    hub = cache_entry("cross-encoder/ms-marco-MiniLM-L-6-v2", "rerank", root)
    assert re.fullmatch(r"cross-encoder--ms-marco-minilm-l-6-v2-[0-9a-f]{12}", hub.name)
    assert exportable("cross-encoder/ms-marco-MiniLM-L-6-v2")
    assert not exportable("minilm-standin") and not exportable("a/b/c")
