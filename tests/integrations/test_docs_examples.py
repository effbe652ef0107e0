"""docs/integrations.md: every Python example runs as pasted and prints reranked documents.

The default run gives the examples a `models/minilm-standin` that is the tiny test model (the
examples load models by name from ./models); the slow run uses the real stand-in export in the
repository's models/.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
DOC = REPOSITORY / "docs" / "integrations.md"
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
# lines each example prints, in document order
PRINTED_LINES = [2, 2, 3, 2, 4]


def examples() -> list[str]:
    return PYTHON_BLOCK.findall(DOC.read_text(encoding="utf-8"))


# Runs each example in a fresh namespace of one interpreter (one start-up instead of five), with a
# marker line between their outputs.
RUNNER = """
import sys
for number, code in enumerate(sys.argv[1:], 1):
    print(f"=== example {number}", flush=True)
    exec(compile(code, f"<docs/integrations.md example {number}>", "exec"), {"__name__": "__main__"})
    sys.stdout.flush()
"""


def run_examples(cwd: Path) -> None:
    blocks = examples()
    assert len(blocks) == len(PRINTED_LINES), "update PRINTED_LINES when docs/integrations.md changes"
    result = subprocess.run([sys.executable, "-c", RUNNER, *blocks], cwd=cwd, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, f"an example failed:\n{result.stdout}\n{result.stderr}"
    outputs = result.stdout.split("=== example ")[1:]
    assert len(outputs) == len(blocks), result.stdout
    for number, (output, lines) in enumerate(zip(outputs, PRINTED_LINES), 1):
        printed = output.strip().splitlines()[1:]  # the first line is the example's number
        assert len(printed) == lines, f"example {number} printed {printed}"


def test_examples_run_as_pasted(tmp_path: Path, tiny_model_dir: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "minilm-standin").symlink_to(tiny_model_dir)
    run_examples(tmp_path)


@pytest.mark.slow
def test_examples_run_against_the_exported_standin() -> None:
    if not (REPOSITORY / "models" / "minilm-standin" / "manifest.json").is_file():
        pytest.fail("run `onnxrank export --model minilm-standin` first")
    run_examples(REPOSITORY)
