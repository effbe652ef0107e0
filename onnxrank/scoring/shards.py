"""Shard files of a scoring job and the manifest that makes a killed run resumable.

Layout beside the output (``scores.parquet``): ``scores.parquet.parts/`` holds ``manifest.json``
and, for shard k (input rows ``[k * shard_rows, (k + 1) * shard_rows)``), ``shard-0000k.parquet``
(or ``.jsonl``: the output's format) and ``shard-0000k.bad.jsonl``.

Crash safety, in write order:
1. Each file is written to a temporary name, flushed, fsynced and renamed over its final name:
   a reader sees a whole file or none.
2. The shard's score file and bad-row file are written first, then the manifest entry (itself an
   atomic rewrite). A shard is done only once the manifest lists it, so a kill between steps
   leaves a shard that is simply scored again and overwritten: never scored twice into the output.
3. The final merge reads only the shards the manifest lists, in shard order.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
from numpy.typing import NDArray

from onnxrank._optional import require
from onnxrank.scoring.records import BadRow, FileFormat

MANIFEST_FORMAT = 1
MANIFEST_NAME = "manifest.json"
ROW_COLUMN = "row"
SCORE_COLUMN = "score"


@dataclass
class ShardManifest:
    """What the parts directory holds and which run settings it belongs to.

    Attributes:
        settings: Input, model, shard size, id columns and output format; a resume must match.
        shards: Done shards by number: rows read, rows scored, bad rows, sha256 of the input rows.
    """

    settings: dict[str, Any]
    shards: dict[str, dict[str, Any]] = field(default_factory=dict)
    format: int = MANIFEST_FORMAT


def parts_dir_for(output: Path) -> Path:
    """The parts directory of an output file."""
    return output.with_name(output.name + ".parts")


def shard_name(index: int, fmt: FileFormat) -> str:
    return f"shard-{index:06d}.{'parquet' if fmt == 'parquet' else 'jsonl'}"


def bad_shard_name(index: int) -> str:
    return f"shard-{index:06d}.bad.jsonl"


def write_atomic(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write through `write` to a temporary file, fsync it, and rename it over `path`."""
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with temporary.open("wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    # the rename itself must reach the disk before the manifest says the shard exists
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_manifest(parts_dir: Path) -> ShardManifest | None:
    """The manifest in `parts_dir`, or None when there is none yet.

    Raises:
        ValueError: An unreadable manifest or an unknown format.
    """
    path = parts_dir / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        manifest = ShardManifest(**data)
    except (json.JSONDecodeError, TypeError) as err:
        raise ValueError(f"{path} is not a scoring manifest ({err}); delete {parts_dir} to start "
                         "over") from err
    if manifest.format != MANIFEST_FORMAT:
        raise ValueError(f"{path} has format {manifest.format}, expected {MANIFEST_FORMAT}; "
                         f"delete {parts_dir} to start over")
    return manifest


def save_manifest(parts_dir: Path, manifest: ShardManifest) -> None:
    text = json.dumps(asdict(manifest), indent=1, sort_keys=True) + "\n"
    write_atomic(parts_dir / MANIFEST_NAME, lambda handle: handle.write(text.encode("utf-8")))


def remove_stale_temporaries(parts_dir: Path) -> None:
    """Delete temporary files a killed run left behind (they were never renamed into place)."""
    for path in parts_dir.glob(".*.tmp-*"):
        path.unlink(missing_ok=True)


class ShardWriter:
    """Writes score shards in the output's format, with a fixed column layout.

    Columns: ``row`` (0-based input row), the id columns, ``score`` (float32). In Parquet, id
    columns keep a Parquet input's types; ids read from JSONL are written as text.
    """

    def __init__(self, fmt: FileFormat, id_columns: Sequence[str],
                 id_types: dict[str, Any] | None = None) -> None:
        self.fmt = fmt
        self.id_columns = tuple(id_columns)
        self._schema: Any = None
        if fmt == "parquet":
            arrow = require("pyarrow", extra="score")
            id_types = id_types or {}
            self._schema = arrow.schema(
                [(ROW_COLUMN, arrow.int64())]
                + [(name, id_types.get(name, arrow.string())) for name in self.id_columns]
                + [(SCORE_COLUMN, arrow.float32())]
            )

    def write(self, path: Path, rows: Sequence[int], ids: Sequence[tuple[Any, ...]],
              scores: Sequence[float] | NDArray[np.float32]) -> None:
        """Write one shard atomically."""
        if self.fmt == "jsonl":
            lines = []
            for row, id_values, score in zip(rows, ids, scores):
                record = {ROW_COLUMN: row, **dict(zip(self.id_columns, id_values)),
                          SCORE_COLUMN: float(score)}
                lines.append(json.dumps(record, ensure_ascii=False, default=str) + "\n")
            payload = "".join(lines).encode("utf-8")
            write_atomic(path, lambda handle: handle.write(payload))
            return
        arrow = require("pyarrow", extra="score")
        parquet = require("pyarrow.parquet", extra="score")
        columns: dict[str, list[Any]] = {ROW_COLUMN: list(rows)}
        for position, name in enumerate(self.id_columns):
            values = [id_values[position] for id_values in ids]
            if arrow.types.is_string(self._schema.field(name).type):
                values = [None if value is None else str(value) for value in values]
            columns[name] = values
        columns[SCORE_COLUMN] = [float(score) for score in scores]
        table = arrow.table(columns, schema=self._schema)
        write_atomic(path, lambda handle: parquet.write_table(table, handle))

    def merge(self, shard_paths: Iterable[Path], output: Path) -> None:
        """Concatenate shards, in the given order, into `output` (atomically)."""
        if self.fmt == "jsonl":
            def copy_all(handle: IO[bytes]) -> None:
                for path in shard_paths:
                    with path.open("rb") as source:
                        shutil.copyfileobj(source, handle)
            write_atomic(output, copy_all)
            return
        parquet = require("pyarrow.parquet", extra="score")

        def write_all(handle: IO[bytes]) -> None:
            with parquet.ParquetWriter(handle, self._schema) as writer:
                for path in shard_paths:
                    writer.write_table(parquet.read_table(path, schema=self._schema))
        write_atomic(output, write_all)


def write_bad_rows(path: Path, bad_rows: Sequence[BadRow]) -> None:
    """One JSON line per bad row: row, reason, and the record as read."""
    payload = "".join(
        json.dumps({ROW_COLUMN: bad.row, "reason": bad.reason, "record": bad.record},
                   ensure_ascii=False, default=str) + "\n"
        for bad in bad_rows
    ).encode("utf-8")
    write_atomic(path, lambda handle: handle.write(payload))


def merge_bad_rows(paths: Iterable[Path], output: Path) -> None:
    def copy_all(handle: IO[bytes]) -> None:
        for path in paths:
            with path.open("rb") as source:
                shutil.copyfileobj(source, handle)
    write_atomic(output, copy_all)
