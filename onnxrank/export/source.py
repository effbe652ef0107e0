"""Where a model comes from: registry names, Hugging Face Hub ids and local checkpoint directories."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from onnxrank._optional import require
from onnxrank.engine.spec import Activation
from onnxrank.errors import ExportError
from onnxrank.export.colbert_checkpoint import TASK as LATE_INTERACTION_TASK
from onnxrank.export.colbert_checkpoint import is_late_interaction
from onnxrank.export.direct_openvino import takes_direct_route
from onnxrank.export.families import Family, family_for
from onnxrank.export.loaded import LoadedModel
from onnxrank.export.memory import check_fits, estimate_memory, route_estimate
from onnxrank.export.recipes import answer_token_ids, resolve_recipe
from onnxrank.export.st_checkpoint import ST_IDENTITY, ST_SIGMOID, stored_activation_fn
from onnxrank.export.standin import read_marker

if TYPE_CHECKING:
    from onnxrank.export.tasks import ExportTask

logger = logging.getLogger(__name__)

DEFAULT_REGISTRY = Path("models/registry.json")
SourceKind = Literal["hub", "local", "standin"]


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A resolved --model argument.

    Attributes:
        kind: ``hub`` (Hub id), ``local`` (checkpoint directory) or ``standin`` (built offline).
        location: Hub id, directory path, or the stand-in builder (``rerank``/``embedding``).
        task: ``rerank`` or ``embedding``.
        name: Default directory name under models/.
        registry_entry: The registry entry when the argument was a registry name.
    """

    kind: SourceKind
    location: str
    task: str
    name: str
    registry_entry: dict[str, Any] = field(default_factory=dict)


def load_registry(path: Path) -> dict[str, dict[str, Any]]:
    """The ``models`` table of models/registry.json; empty when the file does not exist.

    Raises:
        ExportError: The file exists but is not valid registry JSON.
    """
    if not Path(path).is_file():
        return {}
    try:
        models: dict[str, dict[str, Any]] = json.loads(Path(path).read_text("utf-8"))["models"]
    except (OSError, ValueError, KeyError) as err:
        raise ExportError(f"could not read the model registry {path}: {err}") from err
    return models


def resolve_source(model: str, *, task: str | None, registry_path: Path) -> ModelSource:
    """Turn the --model argument into a ModelSource.

    1. A name in the registry: its entry (stand-in builder or Hub id) and task.
    2. An existing directory: a local checkpoint.
    3. A path-like argument (starts with ``/``, ``.`` or ``~``) that does not exist: ExportError.
    4. ``org/name``: a Hugging Face Hub id.

    Raises:
        ExportError: The argument is none of these, or --task contradicts the registry.
    """
    registry = load_registry(registry_path)
    if model in registry:
        entry = registry[model]
        entry_task = entry.get("task", "rerank")
        if task is not None and task != entry_task:
            raise ExportError(
                f"registry model {model!r} has task {entry_task} but --task {task} was given; "
                f"drop --task or pass --task {entry_task}"
            )
        if entry["kind"] == "standin":
            return ModelSource("standin", entry["builder"], entry_task, model, entry)
        return ModelSource("hub", entry["model_id"], entry_task, model, entry)
    path = Path(model).expanduser()
    if path.is_dir():
        return ModelSource("local", str(path.resolve()), task or _local_task(path),
                           path.resolve().name)
    if model.startswith(("/", ".", "~")) or path.exists():
        raise ExportError(
            f"model directory {model} does not exist or is not a directory; pass a checkpoint "
            "directory, a Hugging Face Hub id (org/name) or a registry name"
            + (f" ({', '.join(sorted(registry))})" if registry else "")
        )
    if model.count("/") == 1 and all(model.split("/")):
        return ModelSource("hub", model, task or "rerank", model.split("/")[1].lower())
    raise ExportError(
        f"--model {model!r} is not a registry name, an existing directory or a Hub id (org/name); "
        + (f"registry names in {registry_path}: {', '.join(sorted(registry))}" if registry
           else f"no registry found at {registry_path}")
    )


def _local_task(directory: Path) -> str:
    """The task of a checkpoint directory without --task: ``late_interaction`` for a ColBERT
    layout (onnxrank.export.colbert_checkpoint), else ``rerank``."""
    return LATE_INTERACTION_TASK if is_late_interaction(directory) else "rerank"


def content_sha256(directory: Path) -> str:
    """Hash of a directory's files (relative paths and bytes), identifying a local checkpoint."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(directory).rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(directory)).encode("utf-8") + b"\0")
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _hub_error(model_id: str, err: Exception) -> ExportError:
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return ExportError(
        f"could not load {model_id} from the Hugging Face Hub ({first_line}). Without internet "
        "access, download it on another machine (hf download "
        f"{model_id} --local-dir DIR), copy DIR here and pass it: onnxrank export --model DIR"
    )


def _check_checkpoint_dir(directory: Path) -> None:
    if not (directory / "config.json").is_file():
        raise ExportError(
            f"{directory} is not a Hugging Face checkpoint directory: config.json is missing; "
            "expected config.json, the weights (model.safetensors or pytorch_model.bin) and the "
            "tokenizer files (tokenizer.json or vocab.txt)"
        )


def _source_record(location: str, directory: Path | None,
                   config: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The manifest's ``source`` entry of a checkpoint, and its stand-in marker (or None)."""
    marker = read_marker(directory) if directory is not None else None
    if directory is not None:
        source: dict[str, Any] = {"kind": "local", "path": str(directory),
                                  "content_sha256": content_sha256(directory)}
    else:
        source = {"kind": "hub", "model_id": location,
                  "revision": getattr(config, "_commit_hash", None)}
    if marker is not None:
        source["standin"] = marker
    return source, marker


def load_checkpoint(location: str, *, kind: SourceKind, task: ExportTask,
                    recipe: str | None = None,
                    variants: tuple[str, ...] = ()) -> tuple[LoadedModel, Family]:
    """Load a Hub id or checkpoint directory with transformers' from_pretrained.

    Args:
        task: The export's task: which checks, Auto class and reference apply.
        recipe: Decoder rerankers: ``--recipe`` (a built-in name or FILE.json); None = the
            built-in recipe of a known Hub id, if any (onnxrank.export.recipes.resolve_recipe).
        variants: The variants the export builds: on the weight-compressed route
            (onnxrank.export.direct_openvino) the weights load in the checkpoint's own dtype,
            else in float32.

    Returns:
        The loaded checkpoint and its family (onnxrank.export.families, by config.model_type).

    Raises:
        ExportError: Hub unreachable or model unknown, not a checkpoint, num_labels != 1, no
            classification head for rerank, no fast tokenizer, unsupported pooling, a recipe
            for a model that is no decoder, a bad recipe, or a checkpoint whose export would
            need more memory than the machine has available (onnxrank.export.memory).
    """
    transformers = require("transformers", extra="export")
    torch = require("torch", extra="export")
    local = kind != "hub"
    directory = Path(location) if local else None
    if directory is not None:
        _check_checkpoint_dir(directory)
    options = {"local_files_only": local}
    try:
        config = transformers.AutoConfig.from_pretrained(location, **options)
    except (OSError, ValueError) as err:
        if not local:
            raise _hub_error(location, err) from err
        raise ExportError(f"could not read the config of {location}: {err}") from err
    family = family_for(config)
    prompt_recipe = resolve_recipe(recipe, model=location) if task.takes_recipe else None
    if prompt_recipe is not None and not family.uses_recipe:
        raise ExportError(
            f"--recipe {prompt_recipe.name} is for decoder rerankers (causal LMs scored by a "
            f"prompt); {location} is a {config.model_type!r} model: drop --recipe"
        )
    task.check_checkpoint(config, directory, location, uses_recipe=family.uses_recipe)
    direct = takes_direct_route(family, variants)
    model_class = family.model_class(task)
    found = estimate_memory(model_class, config, direct=direct)
    check_fits(found, location, route_estimate(found.weights, config, direct=True)
               if family.direct_openvino and not direct else None)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(location, **options)
        if prompt_recipe is not None and tokenizer.is_fast:  # before the (large) weights load
            answer_token_ids(prompt_recipe, tokenizer.backend_tokenizer)
        # float32 unless the direct route keeps the checkpoint's own dtype: transformers 5 loads
        # dtype="auto" by default (a bf16 checkpoint would trace a bf16 graph)
        model = model_class.from_pretrained(location, attn_implementation="eager",
                                            dtype="auto" if direct else torch.float32, **options)
    except (OSError, ValueError) as err:
        if not local:
            raise _hub_error(location, err) from err
        raise ExportError(f"could not load the checkpoint in {location} ({family.name} family, "
                          f"model_type {config.model_type!r}): {err}") from err
    if not tokenizer.is_fast:
        raise ExportError(
            f"{location} has no fast (Rust) tokenizer; onnxrank needs tokenizer.json: convert it "
            "with transformers' AutoTokenizer.from_pretrained(..., use_fast=True).save_pretrained()"
        )
    model.eval()
    input_names = family.input_names(tokenizer, config)
    reference = task.load_reference(location, local=local)
    source, marker = _source_record(location, directory, config)
    relevance_trained = bool(marker["relevance_trained"]) if marker is not None else True
    return LoadedModel(model, tokenizer, config, input_names, source, reference, relevance_trained,
                       prompt_recipe, stored_activation(location, local=local)), family


# sentence-transformers' CrossEncoder activations the manifest can say
SENTENCE_TRANSFORMERS_ACTIVATIONS: dict[str, Activation] = {ST_SIGMOID: "sigmoid", ST_IDENTITY: "none"}


def stored_activation(location: str, *, local: bool) -> Activation | None:
    """The manifest's activation for the activation_fn sentence-transformers stores for this
    checkpoint (onnxrank.export.st_checkpoint.stored_activation_fn), or None when it stores none
    (the task's default).

    Raises:
        ExportError: The stored activation is neither Sigmoid nor Identity.
    """
    stored = stored_activation_fn(location, local=local)
    if stored is None:
        return None
    if stored not in SENTENCE_TRANSFORMERS_ACTIVATIONS:
        raise ExportError(
            f"{location} stores the sentence-transformers activation {stored!r}; onnxrank's "
            "manifest takes torch.nn.Sigmoid (sigmoid) or torch.nn.Identity (none)")
    return SENTENCE_TRANSFORMERS_ACTIVATIONS[stored]
