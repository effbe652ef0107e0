"""Commands the decoder tests run: `onnxrank export` of a tiny checkpoint with the suite's length
and validation pairs, and an index for `onnxrank query --rerank` (a plain module: test files
import it by name, which is ambiguous for conftest.py when several test folders run together)."""

from __future__ import annotations

import sys
from pathlib import Path

from child_process import in_child_process
from tokenizers import Tokenizer

from onnxrank.engine.prompt import PromptEncoder
from onnxrank.engine.recipe import PromptRecipe
from onnxrank.export.validate import load_validation_pairs

# the tiny tokenizer spends about 180 tokens on the recipe's fixed text, so rows need room
MAX_LENGTH = 320
VALIDATION_PAIRS = "48"
# a tiny random model's int8 keeps 0.9 of a held-out top ten (the shipped gate asks 0.95 of a
# real model's): these exports test the routes and the variants, not a checkpoint's ranking
TINY_INT8_GATE = ("--int8-min-top10-overlap", "0.9")


def export_decoder(checkpoint: Path, recipe: str | None, out: Path, *options: str) -> None:
    """`onnxrank export` of a tiny checkpoint with `recipe` (None: no --recipe, the checkpoint's
    own) into `out`, in a child process (whose memory goes back when it ends), with the suite's
    length and validation pairs."""
    from onnxrank.cli import main

    chosen = ["--recipe", recipe] if recipe is not None else []
    code = in_child_process(main, ["export", "--model", str(checkpoint), *chosen,
                                   "--out", str(out), "--max-length", str(MAX_LENGTH),
                                   "--validation-pairs", VALIDATION_PAIRS, "--quiet", *TINY_INT8_GATE,
                                   *options])
    assert code == 0, f"the {recipe} export of {checkpoint} failed (see the captured stderr)"


def uncapped_pairs(tokenizer: Tokenizer, recipe: PromptRecipe, limit: int | None = None, *,
                   part: str | None = None,
                   instruction: str | None = None) -> list[tuple[str, str]]:
    """The shipped validation pairs (as `load_validation_pairs(limit, part=part)`) whose query
    the engine keeps whole in a MAX_LENGTH row of `recipe` with `instruction` (None: the
    recipe's default): a longer query the engine caps at the
    recipe's query share, while the model cards and sentence-transformers keep it and cut the
    document away (docs/decoders.md), so only these rows compare token for token."""
    cap = PromptEncoder(tokenizer, MAX_LENGTH, recipe).max_query_tokens(instruction)
    return [(pair.query, pair.passage) for pair in load_validation_pairs(limit, part=part)
            if len(tokenizer.encode(pair.query, add_special_tokens=False).ids) <= cap]


def index_with_reranker(directory: Path, model_dir: Path, name: str) -> tuple[Path, Path]:
    """(index, models directory) under `directory`: the retrieval tests' corpus indexed with their
    embedder, and `model_dir` linked as the reranker `name`, for `onnxrank query --rerank`."""
    from onnxrank.cli import main

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "retrieval"))
    from retrieval_fixtures import CORPUS, write_model_dir

    models = directory / "models"
    models.mkdir()
    write_model_dir(models / "minilm-embedder", task="embedding", name="bow-embedder")
    (models / name).symlink_to(model_dir)
    docs = directory / "docs"
    docs.mkdir()
    for record in CORPUS:
        (docs / f"{record['id']}.md").write_text(f"# {record['title']}\n\n{record['text']}\n")
    index = directory / "index"
    assert main(["index", "--source", str(docs), "--index", str(index), "--models-dir",
                 str(models), "--no-progress"]) == 0
    return index, models
