"""`score_file`: score a JSONL or Parquet file of (query, document) pairs, resumably.

The input is cut into shards of `shard_rows` input rows. Each shard is scored with
`Reranker.score` in chunks of CHUNK_PAIRS pairs (the engine's planner batches each chunk), then
written atomically, then recorded in the manifest (onnxrank.scoring.shards). A run that finds a
manifest from the same input, model and settings skips the shards it lists (after checking
that their input rows are unchanged), so a killed run resumes without scoring a row twice. The
last step merges the shards, in input order, into the output and the bad-row side file.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from onnxrank._optional import require
from onnxrank.scoring.records import (
    BadRow,
    InputRow,
    PairRow,
    count_rows,
    file_format,
    parquet_id_types,
    read_rows,
)
from onnxrank.scoring.shards import (
    ShardManifest,
    ShardWriter,
    bad_shard_name,
    load_manifest,
    merge_bad_rows,
    parts_dir_for,
    remove_stale_temporaries,
    save_manifest,
    shard_name,
    write_bad_rows,
)

logger = logging.getLogger(__name__)

DEFAULT_SHARD_ROWS = 10_000
# Pairs per Reranker.score call: large enough that the planner fills several batches of its
# default size (64 rows), small enough that the progress bar moves often.
CHUNK_PAIRS = 512


@dataclass(frozen=True, slots=True)
class ScoreSummary:
    """What a scoring run did.

    Attributes:
        rows: Input rows read.
        scored: Rows scored (written to the output).
        bad_rows: Rows written to the side file instead.
        shards: Shards in the input.
        resumed_shards: Shards a previous, interrupted run had already finished (not re-scored).
        seconds: Wall time of this run.
        output: The scores file.
        bad_rows_path: The side file.
    """

    rows: int
    scored: int
    bad_rows: int
    shards: int
    resumed_shards: int
    seconds: float
    output: Path
    bad_rows_path: Path


def default_bad_rows_path(output: Path) -> Path:
    """``scores.parquet`` -> ``scores.bad_rows.jsonl``."""
    return output.with_name(output.stem + ".bad_rows.jsonl")


def score_file(
    reranker: Any,
    input_path: str | Path,
    output_path: str | Path,
    *,
    bad_rows_path: str | Path | None = None,
    id_columns: Sequence[str] = ("id",),
    shard_rows: int = DEFAULT_SHARD_ROWS,
    overwrite: bool = False,
    show_progress: bool = False,
) -> ScoreSummary:
    """Score every (query, document) row of a JSONL or Parquet file into a JSONL or Parquet file.

    Args:
        reranker: A loaded onnxrank Reranker (its raw logits are written, as `Reranker.score`).
        input_path: JSONL (.jsonl/.ndjson/.json) or Parquet (.parquet/.pq) with ``query`` and
            ``document`` fields and, optionally, the id columns.
        output_path: Where the scores go, format by suffix: columns ``row`` (0-based input row),
            the id columns, ``score``; one row per good input row, in input order.
        bad_rows_path: JSONL side file for rows that cannot be scored; default
            ``<output stem>.bad_rows.jsonl`` beside the output.
        id_columns: Input columns copied to the output (a row without one gets null).
        shard_rows: Input rows per shard: the unit of resumption, so the most work a kill can
            lose. Keep it between a run and its resumption (it is checked).
        overwrite: Replace an existing output (without it, an existing output is an error unless
            an interrupted run of it is being resumed).
        show_progress: A tqdm progress bar on stderr (pairs and pairs/s).

    Returns:
        A ScoreSummary.

    Raises:
        ValueError: Bad arguments, an existing output, or a parts directory from another input,
            model or settings.
        MissingDependencyError: Parquet in or out without pyarrow (extra ``score``).
        InferenceError: The model failed (the finished shards stay for a resume).
    """
    started = time.perf_counter()
    input_path, output_path = Path(input_path), Path(output_path)
    input_format = file_format(input_path, flag="--input")
    output_format = file_format(output_path, flag="--output")
    if not input_path.exists():
        raise ValueError(f"--input {input_path} does not exist")
    if isinstance(shard_rows, bool) or not isinstance(shard_rows, int) or shard_rows < 1:
        raise ValueError(f"shard_rows must be a positive int, got {shard_rows!r}")
    id_columns = tuple(id_columns)
    bad_path = Path(bad_rows_path) if bad_rows_path is not None else default_bad_rows_path(output_path)
    if bad_path.resolve() == output_path.resolve():
        raise ValueError(f"the bad-rows file {bad_path} must differ from --output {output_path}")

    parts_dir = parts_dir_for(output_path)
    settings = {
        "input": str(input_path.resolve()),
        "model": _model_identity(reranker),
        "shard_rows": shard_rows,
        "id_columns": list(id_columns),
        "output_format": output_format,
    }
    manifest = _open_parts_dir(parts_dir, settings, output_path, overwrite=overwrite)
    writer = ShardWriter(output_format, id_columns,
                         parquet_id_types(input_path, input_format, id_columns))
    total = count_rows(input_path, input_format)
    progress = _progress_bar(total, show_progress)
    shards = resumed = rows_read = 0
    try:
        for index, shard in enumerate(_shards(read_rows(input_path, input_format, id_columns),
                                              shard_rows)):
            shards += 1
            rows_read += len(shard)
            digest = _digest(shard)
            done = manifest.shards.get(str(index))
            if done is not None:
                if done["sha256"] != digest:
                    raise ValueError(
                        f"input rows {index * shard_rows}-{index * shard_rows + len(shard) - 1} "
                        f"of {input_path} differ from the interrupted run's (shard {index}); "
                        f"delete {parts_dir} to score the new input from the start"
                    )
                resumed += 1
                progress.update(len(shard))
                continue
            manifest.shards[str(index)] = _score_shard(
                reranker, shard, index, parts_dir, writer, progress
            ) | {"sha256": digest}
            save_manifest(parts_dir, manifest)
    finally:
        progress.close()
    if resumed:
        logger.info("resumed: %d of %d shards were already scored", resumed, shards)
    listed = sorted(int(key) for key in manifest.shards)
    if listed != list(range(shards)):
        raise ValueError(
            f"{parts_dir} lists shards {listed[shards:]} beyond the {shards} shards of "
            f"{input_path}: the input shrank since the interrupted run; delete {parts_dir}"
        )
    writer.merge([parts_dir / shard_name(index, output_format) for index in range(shards)],
                 output_path)
    merge_bad_rows([parts_dir / bad_shard_name(index) for index in range(shards)], bad_path)
    shutil.rmtree(parts_dir)
    bad = sum(entry["bad_rows"] for entry in manifest.shards.values())
    return ScoreSummary(rows=rows_read, scored=rows_read - bad, bad_rows=bad, shards=shards,
                        resumed_shards=resumed, seconds=time.perf_counter() - started,
                        output=output_path, bad_rows_path=bad_path)


def _model_identity(reranker: Any) -> dict[str, Any]:
    """What must match for a resumed run to write the same scores: the model's files and variant."""
    return {"manifest_sha256": reranker.spec.manifest_hash(),
            "variant": reranker.device_info.variant,
            "max_length": reranker.config.max_length,
            "long_documents": reranker.config.long_documents}


def _open_parts_dir(parts_dir: Path, settings: dict[str, Any], output: Path, *,
                    overwrite: bool) -> ShardManifest:
    """Resume from `parts_dir` when it belongs to this job, else start one.

    1. A manifest with the same settings: resume (temporary files of the killed run removed).
    2. A manifest with other settings: ValueError naming the first difference.
    3. No parts directory but an existing output: ValueError unless `overwrite`.
    4. Otherwise a fresh parts directory.
    """
    manifest = load_manifest(parts_dir) if parts_dir.is_dir() else None
    if manifest is not None:
        for key, value in settings.items():
            if manifest.settings.get(key) != value:
                raise ValueError(
                    f"{parts_dir} belongs to an interrupted run with {key}="
                    f"{manifest.settings.get(key)!r}, this run has {key}={value!r}; rerun with "
                    f"the same settings to resume, or delete {parts_dir} to start over"
                )
        remove_stale_temporaries(parts_dir)
        return manifest
    if output.exists() and not overwrite:
        raise ValueError(f"--output {output} already exists; pass --overwrite to replace it")
    parts_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(parts_dir)
    manifest = ShardManifest(settings=settings)
    save_manifest(parts_dir, manifest)
    return manifest


def _shards(rows: Iterator[InputRow], shard_rows: int) -> Iterator[list[InputRow]]:
    while shard := list(islice(rows, shard_rows)):
        yield shard


def _digest(shard: list[InputRow]) -> str:
    digest = hashlib.sha256()
    for row in shard:
        digest.update(row.raw.encode("utf-8", errors="surrogatepass"))
        digest.update(b"\n")
    return digest.hexdigest()


def _score_shard(reranker: Any, shard: list[InputRow], index: int, parts_dir: Path,
                 writer: ShardWriter, progress: Any) -> dict[str, Any]:
    good = [row.checked for row in shard if isinstance(row.checked, PairRow)]
    bad = [row.checked for row in shard if isinstance(row.checked, BadRow)]
    progress.update(len(bad))
    scores = np.zeros(len(good), dtype=np.float32)
    for start in range(0, len(good), CHUNK_PAIRS):
        chunk = good[start:start + CHUNK_PAIRS]
        scores[start:start + len(chunk)] = reranker.score([(row.query, row.document) for row in chunk])
        progress.update(len(chunk))
    writer.write(parts_dir / shard_name(index, writer.fmt), [row.row for row in good],
                 [row.ids for row in good], scores)
    write_bad_rows(parts_dir / bad_shard_name(index), bad)
    return {"rows": len(shard), "scored": len(good), "bad_rows": len(bad)}


class _NoProgress:
    def update(self, count: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int | None, show: bool) -> Any:
    if not show:
        return _NoProgress()
    tqdm = require("tqdm", extra="score").tqdm
    return tqdm(total=total, unit=" pairs", desc="scoring", file=sys.stderr,
                smoothing=0.1)

