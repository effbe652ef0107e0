"""Session-wide tiny models and a temporary runtime-choice cache, shared by every area's tests.

* ``tiny_checkpoint_dir``: HF directory of a seeded random BertForSequenceClassification(num_labels=1)
  (2 layers, hidden 64, 4 heads, intermediate 128) with the real all-MiniLM-L6-v2 vocabulary and
  tokenizer, and a head fitted like the stand-in's (so its logits spread, std ~0.6).
* ``tiny_model_dir``: that checkpoint exported by onnxrank.export with fp32, opt, int8 and fp16.
* ``tiny_embedder_checkpoint_dir`` / ``tiny_embedder_dir``: the same for a sentence-transformers
  embedding model (mean pooling + Normalize).

Each is built once per run, whichever worker asks first (tests/built_once.py), and is read-only.
The fixture exports run in a child process (tests/child_process.py: the memory an export takes
goes back when it ends) and validate on 48 pairs to stay fast (onnxrank.export.validate's subset:
the first 24 pairs of a tuning and of a held-out group, both of short passages).
Their int8 thresholds are relaxed on purpose (TINY_THRESHOLDS): a random 2-layer, 64-wide
encoder separates inputs by small activation differences that int8 rounding partly erases
(measured on the Xeon with AMX on a subset with a mixed held-out group: OpenVINO int8 Spearman
0.974 on the short tuning group, 0.837 on the mixed held-out one, hence short groups only; on an
AVX2-only EPYC, whose int8 kernels need 7-bit weights
(onnxrank.export.quantize.Int8Settings.reduce_range), held-out Spearman 0.874 for onnxruntime int8
on an earlier subset of short passages). The fixture needs every variant for the
engine's tests, so its gate sits below
both; the engine's own int8 bounds are in tests/engine/test_reranker.py. The default thresholds
are tested against the full-size stand-in
(tests/export, slow) and their enforcement with deliberately strict thresholds on the tiny model.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import worker_cores

worker_cores.pin_worker()  # before torch, onnxruntime or OpenVINO size a thread pool

from built_once import built_once  # noqa: E402
from child_process import in_child_process  # noqa: E402

TINY_VALIDATION_PAIRS = 48


@pytest.fixture(autouse=True, scope="session")
def isolated_choice_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Probed runtime choices go to a temporary cache, never the user's ~/.cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        yield


def _tiny_thresholds():  # noqa: ANN202 - the type lives in an optional-dependency module
    from onnxrank.export.fidelity import FidelityThresholds

    return FidelityThresholds(int8_min_spearman=0.8, int8_min_spearman_per_query=0.8,
                              int8_min_top10_overlap=0.7, int8_min_cosine=0.9)


@pytest.fixture(scope="session")
def tiny_checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random cross-encoder checkpoint (HF format, loadable by sentence_transformers.CrossEncoder)."""
    from onnxrank.export.standin import build_reranker_checkpoint

    return built_once(tmp_path_factory, "tiny-checkpoint/tiny-reranker",
                      lambda directory: build_reranker_checkpoint(directory, size="tiny", seed=0))


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_checkpoint_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_checkpoint_dir` exported with all four variants (models/NAME layout, manifest.json)."""
    from onnxrank.export.pipeline import ExportRequest, export_model

    return built_once(tmp_path_factory, "tiny-models/tiny-reranker", lambda out_dir: in_child_process(
        export_model, ExportRequest(model=str(tiny_checkpoint_dir), out_dir=out_dir,
                                    validation_pairs=TINY_VALIDATION_PAIRS,
                                    thresholds=_tiny_thresholds())))


@pytest.fixture(scope="session")
def tiny_cuda_model_dir(tiny_checkpoint_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tiny_checkpoint_dir` exported with the variants CUDA runs (fp32, opt, fp16), for the
    gpu-marked tests: a GPU machine need not carry OpenVINO for int8 it never runs."""
    from onnxrank.engine.backends.onnxruntime import OnnxruntimeBackend
    from onnxrank.export.pipeline import ExportRequest, export_model
    from onnxrank.types import Device

    variants = tuple(OnnxruntimeBackend.variants[precision]
                     for precision in OnnxruntimeBackend.preference[Device.CUDA])
    return built_once(tmp_path_factory, "tiny-models/tiny-cuda-reranker",
                      lambda out_dir: in_child_process(
                          export_model, ExportRequest(model=str(tiny_checkpoint_dir),
                                                      out_dir=out_dir, variants=variants,
                                                      validation_pairs=TINY_VALIDATION_PAIRS)))


@pytest.fixture(scope="session")
def tiny_embedder_checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random sentence-transformers checkpoint (Transformer -> mean Pooling -> Normalize)."""
    from onnxrank.export.standin import build_embedder_checkpoint

    return built_once(tmp_path_factory, "tiny-embedder-checkpoint/tiny-embedder",
                      lambda directory: build_embedder_checkpoint(directory, size="tiny", seed=0))


@pytest.fixture(scope="session")
def tiny_embedder_dir(
    tiny_embedder_checkpoint_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """`tiny_embedder_checkpoint_dir` exported as an embedding model with all four variants."""
    from onnxrank.export.pipeline import ExportRequest, export_model

    return built_once(tmp_path_factory, "tiny-models/tiny-embedder", lambda out_dir: in_child_process(
        export_model, ExportRequest(model=str(tiny_embedder_checkpoint_dir), out_dir=out_dir,
                                    task="embedding", validation_pairs=TINY_VALIDATION_PAIRS,
                                    thresholds=_tiny_thresholds())))


# --- costliest files first ---------------------------------------------------------------------
# pytest-xdist hands whole files to its two workers in collection order (--dist loadfile
# --no-loadscope-reorder): a file that exports models, started last, keeps one worker busy for
# minutes while the other idles. Files marked costly(seconds) go first, costliest first; the rest
# keep their order.


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def cost(item: pytest.Item) -> float:
        marker = item.get_closest_marker("costly")
        return -marker.args[0] if marker else 0.0

    items.sort(key=cost)


# --- skips fail the run -------------------------------------------------------------------------
# A test that skips because something is missing hides missing behaviour behind a green run.
# Only tests marked `gpu` may skip (this machine and CI have no GPU).
_skipped: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and "gpu" not in report.keywords:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _skipped.append((report.nodeid, reason))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(f"skipped (not gpu): {len(_skipped)}")
    for nodeid, reason in _skipped:
        terminalreporter.write_line(f"  SKIP {nodeid}: {reason}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _skipped and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
