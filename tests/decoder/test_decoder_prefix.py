"""Prefix reuse on every built-in recipe's tiny export: the prefix graph passed its gate, its
scores equal the whole-row graph's and the model card's, a row's score does not depend on its
batch mates, each query's prefix cache is computed once, long documents' windows and
rerank_many reuse the prefix, prefix_reuse=False runs the whole rows, and a prefix graph from
before the cache leaves the whole rows serving."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from decoder_commands import uncapped_pairs

from onnxrank.engine.batch_invariance import BATCH_DEPENDENCE_BOUND
from onnxrank.engine.prefix import CACHE_INPUT, CACHE_OUTPUT, PREFIX_INPUT
from onnxrank.engine.reranker import Reranker, planned_batches, planned_feeds
from onnxrank.engine.spec import MANIFEST_NAME, load_model_spec, sha256_file
from onnxrank.engine.variants import VARIANTS
from onnxrank.export.validate import load_validation_pairs

pytestmark = pytest.mark.costly(55)

QUERY = "what is known about wing flutter at high speeds"
LONG = " ".join(["Flutter of swept wings was measured at transonic speeds in a tunnel."] * 40)


@pytest.fixture(scope="session")
def whole_rows(recipe_model_dir: Path) -> Reranker:
    """The same export and variant as recipe_fp32, with prefix reuse off."""
    return Reranker.from_dir(recipe_model_dir, device="cpu", backend="onnxruntime",
                             precision="fp32", threads=1, prefix_reuse=False)


def prefix_pairs(reranker: Reranker) -> list[tuple[str, str]]:
    """Validation pairs whose query `reranker` keeps whole (rows the model card builds alike), a
    document longer than the tiny decoders' rows and an empty one."""
    assert reranker.spec.recipe is not None
    pairs = uncapped_pairs(reranker.tokenizer, reranker.spec.recipe, 16)
    return pairs + [("wing flutter", LONG), ("flutter", "")]


def test_the_prefix_graph_passed_its_gate(recipe_name: str, recipe_model_dir: Path) -> None:
    graph = load_model_spec(recipe_model_dir).prefix_graphs["fp32"]
    record = graph.fidelity
    assert graph.file == VARIANTS["fp32"].prefix_file == "model_prefix.onnx"
    assert (recipe_model_dir / graph.file).is_file()
    assert record["passed"] is True, f"{recipe_name}: {record}"
    assert record["max_abs_diff_limit"] == pytest.approx(1e-4 * record["score_std"])
    assert record["max_abs_diff"] <= record["max_abs_diff_limit"]
    assert record["prefix_tokens"][0] > 0 and record["vs_pytorch"]["spearman"] >= 0.999


def test_the_weight_only_int8_variant_has_its_own_prefix_graph(recipe_name: str,
                                                              recipe_model_dir: Path) -> None:
    spec = load_model_spec(recipe_model_dir)
    assert "ov_int8" in spec.variants, f"{recipe_name}: ov_int8 was not built"
    graph = spec.prefix_graphs["ov_int8"]
    assert graph.fidelity["passed"] is True and graph.precision == "int8"
    assert graph.file == VARIANTS["ov_int8"].prefix_file == "model_prefix_ov_int8.xml"
    assert graph.extra_files.keys() == {"model_prefix_ov_int8.bin"}
    assert graph.fidelity["compared_with"].startswith("model_ov_int8.xml")
    options = {"device": "cpu", "backend": "openvino", "precision": "int8", "threads": 1}
    reused = Reranker.from_dir(recipe_model_dir, **options)
    whole = Reranker.from_dir(recipe_model_dir, prefix_reuse=False, **options)
    assert reused.uses_prefix_graph and not whole.uses_prefix_graph
    pairs = prefix_pairs(whole)
    expected = whole.score(pairs)
    assert np.abs(reused.score(pairs) - expected).max() <= 1e-4 * expected.std()


def test_prefix_scores_equal_the_whole_rows_and_the_model_card(
        recipe_name: str, recipe_fp32: Reranker, whole_rows: Reranker, recipe_card: Any) -> None:
    assert recipe_fp32.uses_prefix_graph and not whole_rows.uses_prefix_graph
    pairs = prefix_pairs(recipe_fp32)
    reused, whole = recipe_fp32.score(pairs), whole_rows.score(pairs)
    assert np.abs(reused - whole).max() <= 1e-4 * whole.std(), f"{recipe_name}: {reused} vs {whole}"
    expected = recipe_card.score(pairs)
    assert np.abs(recipe_fp32.activate(reused) - expected).max() <= 1e-4


def test_a_rows_score_does_not_depend_on_its_batch_mates(recipe_fp32: Reranker) -> None:
    pairs = prefix_pairs(recipe_fp32)[:6] + [(QUERY, "wings"), ("boundary layer", "a flat plate")]
    together = recipe_fp32.score(pairs)
    alone = np.array([recipe_fp32.score([pair])[0] for pair in pairs])
    assert np.abs(alone - together).max() <= 1e-5 * max(1.0, float(np.abs(together).max()))


def test_the_defaults_scores_do_not_depend_on_their_batch_mates(recipe_model_dir: Path) -> None:
    """The default variant here (bf16 on CPUs with BF16) with its prefix graph: each query's
    prefix is its prompt head whether a row runs alone or with others, and batches are padded
    to the load's measured multiple."""
    default = Reranker.from_dir(recipe_model_dir, device="cpu")
    pairs = prefix_pairs(default)[:6] + [(QUERY, "wings"), (QUERY, "the wings of a swept aircraft fluttered")]
    together = default.score(pairs)
    alone = np.array([default.score([pair])[0] for pair in pairs])
    assert np.abs(alone - together).max() <= BATCH_DEPENDENCE_BOUND * together.std()


def test_long_documents_windows_reuse_the_prefix(recipe_model_dir: Path) -> None:
    options = {"device": "cpu", "backend": "onnxruntime", "precision": "fp32", "threads": 1,
               "long_documents": "max_chunk", "window_tokens": 32, "window_overlap_tokens": 8}
    reused = Reranker.from_dir(recipe_model_dir, **options)
    whole = Reranker.from_dir(recipe_model_dir, prefix_reuse=False, **options)
    pairs = [(QUERY, LONG), ("speed", LONG[:300]), (QUERY, "wings")]
    left, right = reused.score_detailed(pairs), whole.score_detailed(pairs)
    assert np.abs(left.scores - right.scores).max() <= 1e-4 * max(1e-3, float(right.scores.std()))
    assert left.spans == right.spans and left.spans[0] != (0, len(LONG))
    # every window of a query's documents runs with that query's prefix
    feeds = planned_feeds(reused, pairs)
    assert all(PREFIX_INPUT in feed for feed in feeds)
    assert sum(len(feed["input_ids"]) for feed in feeds) == sum(row for row, _ in left.batches)


def test_rerank_many_feeds_each_batch_its_querys_prefix(recipe_fp32: Reranker,
                                                       whole_rows: Reranker) -> None:
    requests = [(QUERY, ["wings", "Boundary layer transition.", LONG[:200]]),
                ("boundary layer", ["a flat plate", "wings"])]
    reused, whole = recipe_fp32.rerank_many(requests), whole_rows.rerank_many(requests)
    for left, right in zip(reused, whole):
        assert [r.index for r in left] == [r.index for r in right]
        assert np.allclose([r.score for r in left], [r.score for r in right], atol=1e-6)
    pairs = [(query, document) for query, documents in requests for document in documents]
    feeds = planned_feeds(recipe_fp32, pairs)
    rows = planned_batches(recipe_fp32, pairs).rows
    # every batch holds one query's rows, fed its prefix once and each row's tokens past it
    rows_per_prefix: dict[tuple[int, ...], list[int]] = {}
    for feed in feeds:
        prefix = feed[PREFIX_INPUT][0].tolist()
        lengths = feed["attention_mask"].sum(axis=1) + len(prefix)
        rows_per_prefix.setdefault(tuple(prefix), []).extend(lengths.tolist())
    assert len(rows_per_prefix) == 2
    for (first, count), (prefix, lengths) in zip([(0, 3), (3, 2)], rows_per_prefix.items()):
        own = rows[first:first + count]
        assert all(row.ids[:len(prefix)].tolist() == list(prefix) for row in own)
        assert sorted(lengths) == sorted(len(row.ids) for row in own)


def test_each_querys_prefix_cache_is_computed_once_for_all_its_batches(
        recipe_model_dir: Path, whole_rows: Reranker, monkeypatch: pytest.MonkeyPatch) -> None:
    """One batch per row: the graph runs each query's prefix alone once (its cache), then every
    batch of the query against that cache; the scores are the whole rows'."""
    reranker = Reranker.from_dir(recipe_model_dir, device="cpu", backend="onnxruntime",
                                 precision="fp32", threads=1, max_batch_size=1)
    graph = reranker._prefix_graph
    assert graph is not None
    runner, asked = graph.runner, []
    real_run = runner.run

    def run(feeds: dict[str, np.ndarray], output: str | None = None) -> np.ndarray:
        asked.append((output, feeds[CACHE_INPUT].shape[2], len(feeds["input_ids"])))
        return real_run(feeds, output)

    monkeypatch.setattr(runner, "run", run)
    requests = [(QUERY, ["wings", "Boundary layer transition.", LONG[:200]]),
                ("boundary layer", ["a flat plate", "wings"])]
    for _ in range(2):  # a second call computes each cache again: none outlives its call
        asked.clear()
        reused = reranker.rerank_many(requests)
        caches = [(length, rows) for output, length, rows in asked if output == CACHE_OUTPUT]
        assert len(caches) == 2 and all(length == 0 and rows == 1 for length, rows in caches)
        # five batches of one row, each against a cache of its query's prefix
        assert [(length > 0, rows) for output, length, rows in asked
                if output is None] == [(True, 1)] * 5
    for left, right in zip(reused, whole_rows.rerank_many(requests)):
        assert np.allclose([r.score for r in left], [r.score for r in right], atol=1e-6)


def test_a_prefix_graph_from_before_the_cache_leaves_the_whole_rows_serving(
        recipe_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A prefix graph that takes no prefix cache (here the whole-row graph in its place, as an
    older export's took prefix_ids instead) is refused with how to fix it; the engine then runs
    the whole rows, logged, and scores as before."""
    from onnxrank.engine.prefix import PrefixGraph
    from onnxrank.engine.runtime import open_model_file
    from onnxrank.errors import ModelLoadError

    whole_file = recipe_model_dir / VARIANTS["fp32"].file
    with pytest.raises(ModelLoadError, match="not prefix_cache .*export the model again"):
        PrefixGraph(open_model_file(whole_file, backend="onnxruntime", precision="fp32"))
    older = tmp_path / "older"
    shutil.copytree(recipe_model_dir, older)
    prefix_file = older / VARIANTS["fp32"].prefix_file
    shutil.copyfile(whole_file, prefix_file)
    manifest = json.loads((older / MANIFEST_NAME).read_text())
    manifest["prefix_graphs"]["fp32"]["sha256"] = sha256_file(prefix_file)
    (older / MANIFEST_NAME).write_text(json.dumps(manifest))
    options = {"device": "cpu", "backend": "onnxruntime", "precision": "fp32", "threads": 1}
    with caplog.at_level(logging.WARNING):
        reranker = Reranker.from_dir(older, **options)
    assert not reranker.uses_prefix_graph
    assert "prefix reuse is off" in caplog.text and "export the model again" in caplog.text
    pairs = prefix_pairs(reranker)[:4]
    expected = Reranker.from_dir(recipe_model_dir, prefix_reuse=False, **options).score(pairs)
    assert np.array_equal(reranker.score(pairs), expected)


def test_prefix_reuse_off_runs_whole_rows_and_fits_fewer_rows(recipe_model_dir: Path,
                                                              whole_rows: Reranker) -> None:
    pairs = [(QUERY, f"passage {index} about wings and flutter") for index in range(12)]
    assert not any(PREFIX_INPUT in feed for feed in planned_feeds(whole_rows, pairs))
    # one whole row short of all twelve: without the prefix graph they take two runs; with it,
    # each row's tokens past its shared prompt head fit one (the head is over 1/11 of a row in
    # every recipe here: 25 of bge-reranker-v2-gemma's 104 tokens)
    tokens = (len(pairs) - 1) * max(whole_rows.row_lengths(pairs))
    budget = {"device": "cpu", "backend": "onnxruntime", "precision": "fp32", "threads": 1,
              "max_batch_tokens": tokens}
    reused = Reranker.from_dir(recipe_model_dir, **budget)
    whole = Reranker.from_dir(recipe_model_dir, prefix_reuse=False, **budget)
    # the budget counts each row's own tokens plus the prefix once: fewer runs fit it
    feeds = planned_feeds(reused, pairs)
    assert len(feeds) < len(planned_feeds(whole, pairs))
    assert all(feed["input_ids"].size + feed[PREFIX_INPUT].size <= tokens for feed in feeds)
    assert np.abs(reused.score(pairs) - whole.score(pairs)).max() <= 1e-5


def test_the_default_variant_reuses_the_prefix_where_it_has_a_prefix_graph(
        recipe_name: str, recipe_model_dir: Path) -> None:
    default = Reranker.from_dir(recipe_model_dir, device="cpu")
    info = default.device_info
    spec = load_model_spec(recipe_model_dir)
    # onnxruntime int8 has no prefix graph; every other variant here (fp32 and OpenVINO's,
    # bf16 included where the CPU has it) has one that passed its gate
    assert default.uses_prefix_graph == (info.variant in spec.prefix_graphs), \
        f"{recipe_name}: {info.backend}/{info.precision}"
    whole = Reranker.from_dir(recipe_model_dir, device="cpu", backend=info.backend,
                              precision=info.precision, prefix_reuse=False)
    pairs = prefix_pairs(whole)
    expected = whole.score(pairs)
    # bf16 rounds differently with other shapes; fp32 and weight-only int8 are exact
    assert np.abs(default.score(pairs) - expected).max() <= 0.02 * expected.std()


def test_the_prefix_gate_compares_with_the_outputs_the_variant_measured(
        recipe_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate takes the whole-row outputs from the variant's own validation (BuiltVariant's
    outputs) and runs no whole rows again."""
    from types import SimpleNamespace

    from onnxrank.engine.runtime import open_model_file
    from onnxrank.export import gate
    from onnxrank.export.context import BuiltVariant
    from onnxrank.export.fidelity import FidelityThresholds
    from onnxrank.export.tasks import RERANK
    from onnxrank.export.validate import encode_validation, run_batches

    spec = load_model_spec(recipe_model_dir)
    inputs = encode_validation(load_validation_pairs(16), recipe_model_dir / spec.tokenizer_file,
                               task=RERANK, max_length=spec.max_length, pad_id=spec.pad_token_id,
                               prompt=spec.prompt)
    run = VARIANTS["fp32"].runs_as[0]
    whole_path = recipe_model_dir / VARIANTS["fp32"].file
    whole = run_batches(inputs.batches(), open_model_file(
        whole_path, backend=run.backend, precision=run.precision).run, len(inputs.rows))
    context = SimpleNamespace(task=RERANK, inputs=inputs, reference=whole,
                              thresholds=FidelityThresholds(), paths={"fp32": whole_path})

    def no_whole_rows(*args: Any) -> None:
        raise AssertionError("the prefix gate ran the whole rows again")

    monkeypatch.setattr(gate, "run_batches", no_whole_rows)
    opened: list[Path] = []

    def open_and_count(path: Path, **settings: Any) -> Any:
        opened.append(Path(path))
        return open_model_file(path, **settings)

    monkeypatch.setattr(gate, "open_model_file", open_and_count)
    # measured outputs one above the graph's: the gate's difference is theirs, not a new run's
    record = gate.gate_prefix_graph(context, "fp32", recipe_model_dir / spec.prefix_graphs["fp32"].file,
                                    BuiltVariant({}, outputs={run: whole + 1.0}))
    assert record["max_abs_diff"] == pytest.approx(1.0, abs=1e-4) and record["passed"] is False
    # every query's rows share a prefix here, so the whole-row graph is not even opened
    assert whole_path not in opened and len(opened) == 1


def _prefix_checks() -> dict[str, dict[str, Any]]:
    """The prefix-path entries of this session's choice cache (tests/conftest.py isolates it)."""
    from onnxrank.engine.runtime import default_choice_cache

    choices = json.loads(default_choice_cache().read_text())
    return {key: entry for key, entry in choices.items() if key.endswith("/prefix")}


def test_the_prefix_path_is_checked_once_per_machine(
        recipe_name: str, recipe_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With precision="auto" the load measures how far one query's rows move with their batch
    mates through the prefix graph, at the padding multiple its whole-row check chose, caches it
    beside that check, and the next load reads it instead of measuring again; a named precision
    is not measured."""
    from onnxrank.engine import runtime

    options = {"device": "cpu", "threads": 1}
    first = Reranker.from_dir(recipe_model_dir, **options)
    assert first.uses_prefix_graph
    info = first.device_info
    checks = [entry for entry in _prefix_checks().values()
              if entry["model"] == load_model_spec(recipe_model_dir).name
              and entry["prefix_check"] == f"{info.backend}/{info.precision}"]
    assert checks, recipe_name
    for check in checks:
        assert check["pad_to_multiple"] == first.device_info.batch_invariant_multiple
        assert 0.0 <= check["moved"] <= BATCH_DEPENDENCE_BOUND, f"{recipe_name}: {check}"

    def measured_again(*args: object, **kwargs: object) -> float:
        raise AssertionError("the cached prefix check was measured again")

    monkeypatch.setattr(runtime, "prefix_batch_movement", measured_again)
    assert Reranker.from_dir(recipe_model_dir, **options).uses_prefix_graph
    assert Reranker.from_dir(recipe_model_dir, device="cpu", threads=2, backend=info.backend,
                             precision=info.precision).uses_prefix_graph


def test_the_prefix_check_measures_one_querys_rows_alone_and_together(
        recipe_fp32: Reranker) -> None:
    from onnxrank.engine.prefix import PrefixGraph, prefix_batch_movement

    graph = recipe_fp32._prefix_graph
    assert isinstance(graph, PrefixGraph)
    pad = recipe_fp32.spec.pad_token_id
    rows = recipe_fp32.probe_rows(recipe_fp32.spec, recipe_fp32.tokenizer, 37)[:6]
    # fp32 through onnxruntime: padding and batch mates change nothing beyond rounding
    assert prefix_batch_movement(graph, rows, pad, 8, recipe_fp32.max_length) <= 1e-5
    with pytest.raises(ValueError, match="needs rows"):
        prefix_batch_movement(graph, [], pad, 8, recipe_fp32.max_length)
    with pytest.raises(ValueError, match="padding multiple must be >= 1"):
        prefix_batch_movement(graph, rows, pad, 0, recipe_fp32.max_length)


def test_prefix_reuse_is_off_where_the_prefix_path_moves_beyond_the_bound(
        recipe_name: str, recipe_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A bound no measurement meets (below 0): with precision="auto" the load logs why and the
    whole rows run; an explicit precision keeps the prefix graph, as for the whole-row check."""
    from onnxrank.engine import runtime

    monkeypatch.setattr(runtime, "BATCH_DEPENDENCE_BOUND", -1.0)
    with caplog.at_level(logging.WARNING):
        auto = Reranker.from_dir(recipe_model_dir, device="cpu", threads=1)
    assert not auto.uses_prefix_graph, recipe_name
    assert "prefix reuse is off: through the prefix graph" in caplog.text
    info = auto.device_info
    explicit = Reranker.from_dir(recipe_model_dir, device="cpu", threads=1,
                                 backend=info.backend, precision=info.precision)
    assert explicit.uses_prefix_graph, recipe_name
    pairs = prefix_pairs(explicit)[:4]
    whole = Reranker.from_dir(recipe_model_dir, device="cpu", threads=1, backend=info.backend,
                              precision=info.precision, prefix_reuse=False)
    assert np.array_equal(auto.score(pairs), whole.score(pairs))
