"""Compare two outputs of `onnxrank score` on the same input, row by row.

    python -m onnxrank.scoring.compare scores.parquet scores-ray
    python -m onnxrank.scoring.compare resumed.parquet uninterrupted.parquet --atol 0
    python -m onnxrank.scoring.compare local.parquet scores-ray --batch-effect models/minilm-standin int8

Each side is a local output (JSONL or Parquet, with input row numbers) or a `--ray` output
directory (one row per input row in input order, bad rows with a null score). The exit status is 1
when the scored rows differ or a score differs by more than the tolerance: --atol, or with
--batch-effect the variant's own batch effect from its manifest (the largest logit difference the
export measured between batch sizes 1 and 64). A Ray run batches rows differently from a local
run, and dynamically quantized int8 models quantize each batch's activations with that batch's
own range, so their scores move with the batch (over a logit for the int8 stand-in).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from onnxrank._optional import require


def read_scores(path: Path) -> tuple[list[int], np.ndarray]:
    """(input rows that were scored, their scores) of a local output file or a Ray output directory."""
    if path.is_dir():
        dataset = require("pyarrow.dataset", extra="score")
        files = sorted(str(file) for file in path.glob("*.parquet"))
        table = dataset.dataset(files, format="parquet").to_table(columns=["score", "error"])
        rows = [row for row, error in enumerate(table.column("error").to_pylist()) if error is None]
        return rows, table.column("score").take(rows).to_numpy()
    if path.suffix.lower() in (".parquet", ".pq"):
        table = require("pyarrow.parquet", extra="score").read_table(path, columns=["row", "score"])
        return table.column("row").to_pylist(), table.column("score").to_numpy()
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return ([record["row"] for record in records],
            np.asarray([record["score"] for record in records], dtype=np.float32))


def batch_effect(model_dir: Path, variant: str) -> float:
    """The variant's measured batch effect (max |logit difference|, batch 1 vs 64) from the manifest.

    Raises:
        ValueError: No manifest, no such variant, or no batch-effect figure in it.
    """
    manifest_path = model_dir / "manifest.json"
    if not manifest_path.is_file():
        raise ValueError(f"no manifest.json in {model_dir}")
    variants = json.loads(manifest_path.read_text(encoding="utf-8")).get("variants", {})
    try:
        return float(variants[variant]["fidelity"]["batch_1_vs_64_max_abs_diff"])
    except (KeyError, TypeError) as err:
        raise ValueError(f"{manifest_path} has no batch_1_vs_64_max_abs_diff for variant "
                         f"{variant!r}; variants: {sorted(variants)}") from err


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m onnxrank.scoring.compare",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path, help="an output file or a --ray output directory")
    parser.add_argument("second", type=Path, help="another output of the same input")
    parser.add_argument("--atol", type=float, default=1e-3,
                        help="largest allowed |score difference| (logits); 0 asks for equality")
    parser.add_argument("--batch-effect", nargs=2, metavar=("MODEL_DIR", "VARIANT"),
                        help="use the variant's batch_1_vs_64_max_abs_diff from MODEL_DIR's "
                             "manifest as the tolerance instead of --atol")
    args = parser.parse_args(argv)
    atol = args.atol
    if args.batch_effect is not None:
        atol = batch_effect(Path(args.batch_effect[0]), args.batch_effect[1])
    first_rows, first = read_scores(args.first)
    second_rows, second = read_scores(args.second)
    if first_rows != second_rows:
        print(f"scored rows differ: {len(first_rows)} in {args.first}, {len(second_rows)} in "
              f"{args.second}")
        return 1
    difference = (float(np.abs(first.astype(np.float64) - second).max()) if len(first) else 0.0)
    print(f"{len(first_rows)} scored rows in both, same rows; max |score difference| "
          f"{difference:.2e} (allowed {atol:.2e})")
    return 0 if difference <= atol else 1


if __name__ == "__main__":
    raise SystemExit(main())
