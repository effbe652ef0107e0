"""Input rows of a scoring job: file formats, reading, and the per-row check that sorts out bad rows.

A row is good when it has a non-empty text ``query`` and a text ``document`` (an empty document is
scored like any other), and every id column it carries is text, a number or null. Anything else is
a bad row with a reason; the job writes bad rows to a side file instead of failing.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from onnxrank._optional import require

FileFormat = Literal["jsonl", "parquet"]
SUFFIXES: dict[str, FileFormat] = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".parquet": "parquet", ".pq": "parquet",
}
QUERY_FIELD = "query"
DOCUMENT_FIELD = "document"
# Parquet is read in record batches of this many rows; it bounds memory, not the shard size.
PARQUET_READ_ROWS = 4096


@dataclass(frozen=True, slots=True)
class PairRow:
    """A good input row: its 0-based position in the input, the pair and its id values."""

    row: int
    query: str
    document: str
    ids: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class BadRow:
    """An input row that cannot be scored, with the reason and the record as read."""

    row: int
    reason: str
    record: Any


@dataclass(frozen=True, slots=True)
class InputRow:
    """One input row as read: `raw` (the exact line, or the row as canonical JSON) and its check."""

    raw: str
    checked: PairRow | BadRow


def file_format(path: str | Path, *, flag: str) -> FileFormat:
    """The format a file name says: JSON lines (.jsonl, .ndjson, .json) or Parquet (.parquet, .pq).

    Raises:
        ValueError: Any other suffix (the message names `flag`).
    """
    suffix = Path(path).suffix.lower()
    if suffix not in SUFFIXES:
        raise ValueError(
            f"{flag} {path} has suffix {suffix or '(none)'!r}; use one of "
            f"{', '.join(SUFFIXES)} (JSON lines or Parquet)"
        )
    return SUFFIXES[suffix]


def check_record(row: int, record: Any, id_columns: Sequence[str]) -> PairRow | BadRow:
    """Check one input record; a missing id column is a null id, never a bad row."""
    if not isinstance(record, dict):
        return BadRow(row, f"not a JSON object (got {type(record).__name__})", record)
    for name in (QUERY_FIELD, DOCUMENT_FIELD):
        if record.get(name) is None:
            return BadRow(row, f"missing field {name!r}", record)
        if not isinstance(record[name], str):
            return BadRow(row, f"field {name!r} must be text, got {type(record[name]).__name__}",
                          record)
    if not record[QUERY_FIELD].strip():
        return BadRow(row, f"field {QUERY_FIELD!r} is empty", record)
    ids = tuple(record.get(name) for name in id_columns)
    for name, value in zip(id_columns, ids):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
            return BadRow(row, f"id column {name!r} must be text or a number, got "
                               f"{type(value).__name__}", record)
    return PairRow(row, record[QUERY_FIELD], record[DOCUMENT_FIELD], ids)


def check_line(row: int, line: str, id_columns: Sequence[str]) -> PairRow | BadRow:
    """Parse and check one JSONL line (blank and unparsable lines are bad rows)."""
    if not line.strip():
        return BadRow(row, "blank line", line)
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        return BadRow(row, f"not valid JSON: {err}", line)
    return check_record(row, record, id_columns)


def count_rows(path: Path, fmt: FileFormat) -> int | None:
    """Rows in the input (JSONL: lines), or None when it cannot be known without consuming it (a pipe)."""
    if not stat.S_ISREG(path.stat().st_mode):
        return None
    if fmt == "parquet":
        parquet = require("pyarrow.parquet", extra="score")
        return int(parquet.ParquetFile(path).metadata.num_rows)
    lines, last = 0, b"\n"
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def read_rows(path: Path, fmt: FileFormat, id_columns: Sequence[str]) -> Iterator[InputRow]:
    """Every input row in order, checked.

    JSONL rows are lines (a blank or unparsable line is a bad row, so row numbers are line
    numbers counted from 0). Parquet rows are table rows.

    Raises:
        ValueError: A Parquet input without a ``query`` or ``document`` column.
    """
    if fmt == "jsonl":
        yield from _read_jsonl(path, id_columns)
    else:
        yield from _read_parquet(path, id_columns)


def _read_jsonl(path: Path, id_columns: Sequence[str]) -> Iterator[InputRow]:
    # newline="\n": a stray "\r" inside a line must not split it (row numbers are line numbers)
    with path.open(encoding="utf-8", errors="replace", newline="\n") as handle:
        for row, line in enumerate(handle):
            raw = line.rstrip("\n").rstrip("\r")
            yield InputRow(raw, check_line(row, raw, id_columns))


def _read_parquet(path: Path, id_columns: Sequence[str]) -> Iterator[InputRow]:
    parquet = require("pyarrow.parquet", extra="score")
    handle = parquet.ParquetFile(path)
    names = handle.schema_arrow.names
    missing = [name for name in (QUERY_FIELD, DOCUMENT_FIELD) if name not in names]
    if missing:
        raise ValueError(f"--input {path} has no {' or '.join(map(repr, missing))} column; "
                         f"its columns are {names}")
    row = 0
    for batch in handle.iter_batches(batch_size=PARQUET_READ_ROWS):
        for record in batch.to_pylist():
            raw = json.dumps(record, sort_keys=True, default=str, ensure_ascii=False)
            yield InputRow(raw, check_record(row, record, id_columns))
            row += 1


def parquet_id_types(path: Path, fmt: FileFormat, id_columns: Sequence[str]) -> dict[str, Any]:
    """Arrow types of the id columns in a Parquet input (kept as is in Parquet output); {} for JSONL."""
    if fmt != "parquet":
        return {}
    parquet = require("pyarrow.parquet", extra="score")
    schema = parquet.ParquetFile(path).schema_arrow
    return {name: schema.field(name).type for name in id_columns if name in schema.names}
