"""Tiny late-interaction checkpoints of every layout (colbert_checkpoints.py), exported with the
real CLI once per run, and their sentence-transformers MultiVectorEncoder references."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from built_once import built_once

sys.path.insert(0, str(Path(__file__).resolve().parent))
from colbert_checkpoints import BUILDERS, LAYOUTS  # noqa: E402

from onnxrank.cli import main  # noqa: E402

# as the suite's other tiny exports (tests/conftest.py): a random 2-layer, 32-wide encoder's
# int8 rounding reorders near-ties that the default int8 gate is not meant for
TINY_INT8_GATE = ["--int8-min-spearman", "0.8", "--int8-min-spearman-per-query", "0.8",
                  "--int8-min-top10-overlap", "0.7"]
VALIDATION_PAIRS = "48"


@pytest.fixture(scope="session", params=LAYOUTS)
def layout(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def checkpoint(factory: pytest.TempPathFactory, name: str) -> Path:
    return built_once(factory, f"colbert-checkpoints/{name}", BUILDERS[name])


def exported(factory: pytest.TempPathFactory, name: str, *, variants: str = "fp32,int8",
             gate: tuple[str, ...] = tuple(TINY_INT8_GATE), suffix: str = "") -> Path:
    """Checkpoint `name` exported with the CLI (`suffix` names an export with other settings)."""
    source = checkpoint(factory, name)

    def export(out_dir: Path) -> None:
        code = main(["export", "--model", str(source), "--out", str(out_dir), "--variants",
                     variants, "--validation-pairs", VALIDATION_PAIRS, "--quiet", *gate])
        if code != 0:
            raise RuntimeError(f"onnxrank export of {source} exited with {code}")

    return built_once(factory, f"colbert-models/{name}{suffix}", export)


@pytest.fixture(scope="session")
def checkpoint_dir(layout: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoint(tmp_path_factory, layout)


@pytest.fixture(scope="session")
def model_dir(layout: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return exported(tmp_path_factory, layout)


@pytest.fixture(scope="session")
def bert_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The PyLate-layout BERT export ([unused0]/[unused1], punctuation skiplist)."""
    return exported(tmp_path_factory, "pylate_bert")


@pytest.fixture(scope="session")
def bert_checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return checkpoint(tmp_path_factory, "pylate_bert")


@pytest.fixture(scope="session")
def multi_vector_checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sentence-transformers 6's own save of a MultiVectorEncoder stack."""
    return checkpoint(tmp_path_factory, "multi_vector_bert")


@pytest.fixture(scope="session")
def multi_vector_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return exported(tmp_path_factory, "multi_vector_bert")


@pytest.fixture(scope="session")
def bf16_failed_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The PyLate-layout BERT's fp32 export under a top-10 overlap no run reaches (> 1), so its
    OpenVINO bf16 record fails whatever this CPU's bf16 rounds."""
    return exported(tmp_path_factory, "pylate_bert", variants="fp32",
                    gate=("--int8-min-top10-overlap", "1.01"), suffix="-bf16-failed")
