"""Export on first use: a Hugging Face checkpoint directory or Hub id that is not yet exported is
exported once into a cache, and every later load finds it there.

The export needs the ``export`` extra (torch, transformers) and onnxrank.export stands above the
engine, so the pipeline is imported only here and only when something must be exported, through
onnxrank._optional.require: a missing extra raises the same MissingDependencyError as every other
optional feature. A hook that the export registers would work only after something had imported
onnxrank.export, which a serving process never does; the lazy import is one path with no state.

Each cache entry is ``<safe name>-<key>``: the key hashes the task and the Hub id, or the
checkpoint directory's resolved path with the size and modification time of each file in it, so an
edited checkpoint is exported again into a new entry (a Hub id is exported once; its later
revisions need an explicit `onnxrank export`). An entry is complete or absent: the export writes a
private staging directory and renames it into place only if the entry does not exist yet
(rename-if-absent, atomic on every platform), so two processes exporting the same model at once
each finish and the second discards its copy and loads the first's. A failed export removes its
staging directory and leaves the cache as it was.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

from onnxrank._optional import require
from onnxrank.engine.spec import VARIANT_NAMES

logger = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
CHECKPOINT_CONFIG = "config.json"
KEY_CHARS = 12
# a Hub id is org/name with these characters (huggingface_hub's repo id rule)
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# extras the OpenVINO int8 variant needs: without them it is not asked for (the engine cannot run
# it anyway), as `onnxrank export --variants` without ov_int8 would
OPENVINO_INT8_MODULES = ("openvino", "nncf")


def exportable(name: str | Path) -> bool:
    """True when `name` is a checkpoint directory (config.json, no manifest.json) or a Hub id."""
    path = Path(name).expanduser()
    if path.is_dir():
        return (path / CHECKPOINT_CONFIG).is_file() and not (path / MANIFEST_FILE).is_file()
    return not path.exists() and HUB_ID.match(str(name)) is not None


def cache_entry(name: str | Path, task: str, cache_root: Path) -> Path:
    """The cache directory that holds (or will hold) the export of `name` as `task`."""
    path = Path(name).expanduser()
    if path.is_dir():
        resolved = path.resolve()
        files = sorted(file for file in resolved.rglob("*") if file.is_file())
        material: list[object] = ["local", str(resolved), task, [
            (str(file.relative_to(resolved)), file.stat().st_size, file.stat().st_mtime_ns)
            for file in files]]
        label = resolved.name
    else:
        material = ["hub", str(name), task]
        label = str(name).replace("/", "--")
    key = hashlib.sha256(json.dumps(material).encode("utf-8")).hexdigest()[:KEY_CHARS]
    safe = re.sub(r"[^a-z0-9._-]+", "-", label.lower()).strip("-.") or "model"
    return cache_root / f"{safe}-{key}"


def export_once(name: str | Path, task: str, cache_root: Path) -> Path:
    """The cached export of `name` as `task`, exporting it now when the cache has none.

    The export is `onnxrank export --model NAME --task TASK` with every default (its progress
    bar, validation and manifest), without ov_int8 when OpenVINO or NNCF is not installed.

    Returns:
        The cache entry, a model directory with manifest.json.

    Raises:
        MissingDependencyError: The ``export`` extra is not installed.
        ExportError: Loading or exporting the checkpoint failed.
        FidelityError: The fp32 graph missed its validation thresholds.
    """
    entry = cache_entry(name, task, cache_root)
    if (entry / MANIFEST_FILE).is_file():
        return entry
    require("torch", extra="export")
    pipeline = require("onnxrank.export.pipeline", extra="export")
    variants = tuple(variant for variant in VARIANT_NAMES
                     if variant != "ov_int8" or all(importlib.util.find_spec(module)
                                                    for module in OPENVINO_INT8_MODULES))
    logger.info("%s is not exported yet: exporting it once as a %s model into %s",
                name, task, entry)
    cache_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{entry.name}.export-", dir=cache_root))
    try:
        staged = staging / entry.name
        pipeline.export_model(pipeline.ExportRequest(
            model=str(name), out_dir=staged, task=task, variants=variants), show_progress=True)
        try:
            os.rename(staged, entry)  # fails when another process published the entry first
        except OSError:
            if not (entry / MANIFEST_FILE).is_file():
                raise
            logger.info("another process exported %s into %s first; using its export",
                        name, entry)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return entry
