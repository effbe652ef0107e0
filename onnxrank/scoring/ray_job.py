"""`score_file_on_ray`: the scoring job as a Ray Data pipeline, for inputs that outgrow one machine.

read (``read_text`` for JSONL, ``read_parquet``) -> ``map_batches`` with RayScorer, a callable class
that loads the model once per actor -> ``write_parquet`` into a directory. Ray Data keeps the input
order (``preserve_order``), so row i of the output files, read in file-name order, is row i of the
input.

JSONL is read with ``read_text`` rather than ``read_json`` on purpose: ``read_json`` parses blocks
with Arrow and fails the whole job on one malformed line, while here each line is checked by the
same rules as the local job (onnxrank.scoring.records) and a bad line becomes an output row with a
null ``score`` and the reason in ``error``.

Privacy: Ray reports usage statistics by default. `start_ray` sets ``RAY_USAGE_STATS_ENABLED=0``
unless the caller set it, starts a local instance without the dashboard and on the loopback address
only. A cluster decides for itself when it is started: start it with ``--disable-usage-stats``.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onnxrank._optional import require
from onnxrank.scoring.records import (
    DOCUMENT_FIELD,
    QUERY_FIELD,
    BadRow,
    PairRow,
    check_line,
    check_record,
    file_format,
)

logger = logging.getLogger(__name__)

DEFAULT_BATCH_ROWS = 1024
ERROR_COLUMN = "error"
SCORE_COLUMN = "score"
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class RaySummary:
    """What a Ray scoring run did.

    Attributes:
        rows: Input rows (one output row each, bad rows included with a null score).
        seconds: Wall time, Ray start-up included.
        output: The output directory (or URI) of Parquet files.
        address: The cluster used ("local" for an instance started here).
        actors: Model replicas that ran.
    """

    rows: int
    seconds: float
    output: str
    address: str
    actors: int


class RayScorer:
    """Ray Data callable class: loads the model once per actor, scores pyarrow batches.

    Output columns: the id columns (text for JSONL input, the input's type for Parquet),
    ``score`` (float32 raw logit, null for a bad row) and ``error`` (null for a good row).
    """

    def __init__(self, model_dir: str, options: dict[str, Any], id_columns: Sequence[str],
                 input_format: str) -> None:
        from onnxrank.engine.reranker import Reranker

        self._reranker = Reranker.from_dir(model_dir, **options)
        self._id_columns = tuple(id_columns)
        self._input_format = input_format

    def __call__(self, batch: Any) -> Any:
        arrow = require("pyarrow", extra="score")
        if self._input_format == "jsonl":
            lines = batch.column("text").to_pylist()
            checked = [check_line(row, line, self._id_columns) for row, line in enumerate(lines)]
        else:
            records = batch.to_pylist()
            checked = [check_record(row, record, self._id_columns)
                       for row, record in enumerate(records)]
        good = [index for index, item in enumerate(checked) if isinstance(item, PairRow)]
        scores: list[float | None] = [None] * len(checked)
        if good:
            pairs = [(item.query, item.document) for item in checked if isinstance(item, PairRow)]
            values = self._reranker.score(pairs)
            for index, value in zip(good, values):
                scores[index] = float(value)
        columns: dict[str, Any] = {}
        for position, name in enumerate(self._id_columns):
            if self._input_format == "parquet" and name in batch.schema.names:
                columns[name] = batch.column(name)
            else:
                columns[name] = arrow.array(
                    [_id_text(item, position, name) for item in checked], type=arrow.string()
                )
        columns[SCORE_COLUMN] = arrow.array(scores, type=arrow.float32())
        columns[ERROR_COLUMN] = arrow.array(
            [item.reason if isinstance(item, BadRow) else None for item in checked],
            type=arrow.string(),
        )
        return arrow.table(columns)


def _id_text(item: PairRow | BadRow, position: int, name: str) -> str | None:
    """An id as text; a bad row's too, when its record has one (so that it can be found)."""
    if isinstance(item, PairRow):
        value = item.ids[position]
    else:
        value = item.record.get(name) if isinstance(item.record, dict) else None
    return None if value is None else str(value)


def _is_uri(location: str) -> bool:
    return "://" in location


def _location(path: str | Path) -> str:
    """A URI as given (s3://, gs://, ...), a local path made absolute: every node must read it."""
    text = str(path)
    return text if _is_uri(text) else str(Path(text).resolve())


def start_ray(address: str | None, *, num_cpus: int | None = None) -> tuple[Any, bool]:
    """Connect to the cluster at `address`, or start a local instance; returns (ray, started_here).

    A local instance gets no dashboard, listens on the loopback address only, and reports no
    usage statistics (``RAY_USAGE_STATS_ENABLED=0`` unless the caller set the variable).
    """
    # Must be set before ray is imported and started: it is read when the instance starts.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray = require("ray", extra="ray")
    require("ray.data", extra="ray")
    if ray.is_initialized():
        return ray, False
    if address is None:
        ray.init(num_cpus=num_cpus, include_dashboard=False, _node_ip_address=LOOPBACK,
                 configure_logging=False, log_to_driver=False)
    else:
        ray.init(address=address, configure_logging=False, log_to_driver=False)
    return ray, True


def score_file_on_ray(
    model_dir: str | Path,
    input_path: str | Path,
    output_dir: str | Path,
    *,
    engine_options: dict[str, Any] | None = None,
    id_columns: Sequence[str] = ("id",),
    actors: int = 1,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    address: str | None = None,
    overwrite: bool = False,
    show_progress: bool = False,
) -> RaySummary:
    """Score a JSONL or Parquet file of pairs with Ray Data into a directory of Parquet files.

    Args:
        model_dir: An exported model directory, at the same path on every node of the cluster.
        input_path: JSONL or Parquet input, at the same path on every node (shared storage) or
            a URI Ray Data reads (s3://, gs://, ...).
        output_dir: Directory (created) or URI for the Parquet output.
        engine_options: EngineConfig overrides for each actor. ``threads`` is per actor and
            defaults to 1 here (each actor reserves that many CPUs from Ray).
        id_columns: Input columns copied to the output.
        actors: Model replicas (Ray actors); actors x threads should not exceed the cores.
        batch_rows: Rows per map_batches call (one `Reranker.score` call each).
        address: A running cluster ("ray://host:10001" or "host:6379"); None starts a local
            instance with max(cores, actors x threads + 1) CPUs.
        overwrite: Replace an existing output directory.
        show_progress: Ray Data's progress bars.

    Returns:
        A RaySummary.

    Raises:
        ValueError: Bad arguments or an existing output.
        MissingDependencyError: ray[data] (extra ``ray``) or pyarrow is missing.
    """
    started = time.perf_counter()
    input_format = file_format(str(input_path), flag="--input")
    source, target = _location(input_path), _location(output_dir)
    if not _is_uri(source) and not Path(source).exists():
        raise ValueError(f"--input {input_path} does not exist")
    for name, value in (("actors", actors), ("batch_rows", batch_rows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    local_output = None if _is_uri(target) else Path(target)
    if local_output is not None and local_output.exists() and not overwrite:
        raise ValueError(f"--output {output_dir} already exists; pass --overwrite to replace it")
    options = dict(engine_options or {})
    if options.get("threads") is None:
        options["threads"] = 1
    threads = options["threads"]
    ray, started_here = start_ray(
        address, num_cpus=max(os.cpu_count() or 1, actors * threads + 1) if address is None else None
    )
    try:
        data = ray.data
        context = data.DataContext.get_current()
        context.execution_options.preserve_order = True
        context.enable_progress_bars = show_progress
        if input_format == "jsonl":
            dataset = data.read_text(source, drop_empty_lines=False)
        else:
            dataset = data.read_parquet(source)
            missing = [name for name in (QUERY_FIELD, DOCUMENT_FIELD) if name not in dataset.schema().names]
            if missing:
                raise ValueError(f"--input {input_path} has no {' or '.join(map(repr, missing))} "
                                 f"column; its columns are {dataset.schema().names}")
        if local_output is not None and local_output.exists():
            shutil.rmtree(local_output)
        dataset.map_batches(
            RayScorer,
            fn_constructor_kwargs={"model_dir": str(Path(model_dir).resolve()), "options": options,
                                   "id_columns": list(id_columns), "input_format": input_format},
            batch_size=batch_rows, batch_format="pyarrow",
            compute=data.ActorPoolStrategy(size=actors), num_cpus=threads,
        ).write_parquet(target)
        # from the files' metadata: the scores streamed to storage and are not held anywhere
        rows = data.read_parquet(target).count()
    finally:
        if started_here:
            ray.shutdown()
    return RaySummary(rows=rows, seconds=time.perf_counter() - started, output=target,
                      address=address or "local", actors=actors)
