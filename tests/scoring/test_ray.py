"""`onnxrank score --ray` on a local Ray instance (tiny data, 2 actors): the same scores, ids and
bad-row reasons as the local run, in input order."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.dataset as arrow_dataset
import pyarrow.parquet as pq
import pytest
from scoring_fixtures import make_lines

from onnxrank.cli import main

pytestmark = pytest.mark.costly(20)

ROWS = 45


def test_ray_run_writes_the_local_runs_scores_in_input_order(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("RAY_USAGE_STATS_ENABLED", raising=False)
    lines = make_lines(ROWS, bad_every=7)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(lines) + "\n", encoding="utf-8")
    engine = ["--model", str(tiny_model_dir), "--precision", "fp32", "--device", "cpu",
              "--no-progress"]
    assert main(["score", "--input", str(pairs), "--output", str(tmp_path / "local.parquet"),
                 *engine]) == 0
    # batch_rows 8: six blocks over two actors, so order and the actor pool are both exercised
    assert main(["score", "--input", str(pairs), "--output", str(tmp_path / "ray-out"), "--ray",
                 "--actors", "2", "--threads", "1", "--batch-rows", "8", *engine]) == 0
    assert os.environ["RAY_USAGE_STATS_ENABLED"] == "0"
    assert f"scored {ROWS} rows on Ray (local, 2 actors) -> " in capsys.readouterr().out

    files = sorted((tmp_path / "ray-out").glob("*.parquet"))
    ray_table = arrow_dataset.dataset([str(path) for path in files], format="parquet").to_table()
    assert ray_table.column_names == ["id", "score", "error"]
    assert ray_table.num_rows == ROWS
    local = pq.read_table(tmp_path / "local.parquet")
    good = [row for row in range(ROWS) if row % 7 != 6]
    errors = ray_table.column("error").to_pylist()
    assert [row for row in range(ROWS) if errors[row] is None] == good
    assert ray_table.column("id").take(good).to_pylist() == local.column("id").to_pylist()
    # fp32 on the same rows: only the batch composition differs (a batch effect of ~1e-6)
    np.testing.assert_allclose(ray_table.column("score").take(good).to_numpy(),
                               local.column("score").to_numpy(), rtol=0, atol=1e-4)
    local_bad = [json.loads(line) for line in
                 (tmp_path / "local.bad_rows.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [errors[record["row"]] for record in local_bad] == [record["reason"] for record in local_bad]
