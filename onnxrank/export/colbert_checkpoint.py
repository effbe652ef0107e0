"""What a late-interaction (ColBERT) checkpoint directory stores: which layout it is, its
projections and its row settings, read once into a ColbertLayout; `row_settings` turns that into
the manifest's settings as vocabulary ids (onnxrank.export.late_interaction exports the graph).

Each layout is one entry of LAYOUT_FORMATS, tried in order (how it is recognised, its reader):

1. sentence-transformers 6 ``MultiVectorEncoder.save``: config_sentence_transformers.json with
   ``model_type`` MultiVectorEncoder; the markers are its ``prompts`` (prepended as text), the
   lengths and query expansion the Transformer's sentence_bert_config.json, the skiplist the
   ``MultiVectorMask`` module; the stack is Transformer, Dense..., MultiVectorMask, Normalize.
2. PyLate: ``modules.json`` with the Transformer and one or more ``Dense`` modules (``1_Dense/``:
   config.json and ``linear.weight``), and config_sentence_transformers.json with
   ``query_prefix``, ``document_prefix``, ``query_length``, ``document_length``,
   ``attend_to_expansion_tokens``, ``do_query_expansion`` and ``skiplist_words`` (PyLate's
   defaults where a key is absent).
3. Stanford ``HF_ColBERT``: ``linear.weight`` beside the encoder weights and
   ``artifact.metadata`` (``query_token_id``, ``doc_token_id``, ``query_maxlen``, ``doc_maxlen``,
   ``attend_to_mask_tokens``, ``mask_punctuation``); queries are always expanded.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from onnxrank._optional import require
from onnxrank.engine.late_rows import LateInteractionSettings
from onnxrank.engine.spec import Task
from onnxrank.errors import ExportError

# the task of a checkpoint directory in any of these layouts (onnxrank.export.source)
TASK: Task = "late_interaction"
ST_CONFIG = "config_sentence_transformers.json"
# PyLate's defaults for keys a config_sentence_transformers.json leaves out
PYLATE_DEFAULTS: dict[str, Any] = {
    "query_prefix": "[unused0]", "document_prefix": "[unused1]", "query_length": 32,
    "document_length": 180, "attend_to_expansion_tokens": False, "do_query_expansion": True,
    "skiplist_words": list(string.punctuation)}
# Stanford ColBERT's defaults for keys an artifact.metadata leaves out (ColBERTConfig)
STANFORD_DEFAULTS: dict[str, Any] = {
    "query_token_id": "[unused0]", "doc_token_id": "[unused1]", "query_maxlen": 32,
    "doc_maxlen": 180, "attend_to_mask_tokens": False, "mask_punctuation": True}
IDENTITY_ACTIVATIONS = ("torch.nn.modules.linear.Identity", "torch.nn.Identity")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# sentence-transformers 6: the prompt names encode_document tries, in its order
DOCUMENT_PROMPTS = ("document", "passage", "corpus")
# texts a prompt is tried before: words, punctuation, a leading space and case
PROMPT_PROBES = ("what is the lift of a wing?", " Heat-transfer, 2 results")
# sentence-transformers 6 Transformer settings that change the rows or the vectors, and the
# values this export reproduces (absent = the first)
TRANSFORMER_SETTINGS: dict[str, tuple[Any, ...]] = {
    "transformer_task": ("feature-extraction",), "do_lower_case": (False,),
    "processing_kwargs": (None, {}),
    "modality_config": (None, {"text": {"method": "forward",
                                        "method_output_name": "last_hidden_state"}})}


@dataclass(frozen=True, slots=True)
class Projection:
    """One Dense module: weight [out, in] and optional bias [out]."""

    weight: np.ndarray
    bias: np.ndarray | None


@dataclass(frozen=True, slots=True)
class ColbertLayout:
    """A late-interaction checkpoint as read: its layout, where the transformer is, its
    projections, and its row settings by name (markers and skiplist still as text).

    Attributes:
        expansion_token: The token queries are expanded with; None = the tokenizer's [MASK]
            (its eos when it has none).
        prefixes_are_prompts: The markers are prompts prepended to the text (sentence-transformers
            6), not ids inserted after [CLS]: the export checks that both make the same row.
    """

    name: str
    transformer_dir: Path
    projections: tuple[Projection, ...]
    query_prefix: str
    document_prefix: str
    query_length: int
    document_length: int
    query_expansion: bool
    attend_to_expansion_tokens: bool
    skiplist_words: tuple[str, ...]
    expansion_token: str | None = None
    prefixes_are_prompts: bool = False


@dataclass(frozen=True, slots=True)
class LayoutFormat:
    """One checkpoint layout: its name (the manifest's ``source.layout``), what recognises it
    (said by the error when none does) and its reader (directory, name -> layout)."""

    name: str
    needs: str
    recognises: Callable[[Path], bool]
    read: Callable[[Path, str], ColbertLayout]


def is_late_interaction(directory: Path) -> bool:
    """Whether a checkpoint directory is in one of the LAYOUT_FORMATS."""
    return _layout_format(Path(directory)) is not None


def read_layout(directory: Path) -> ColbertLayout:
    """Read a late-interaction checkpoint's settings and projections.

    Raises:
        ExportError: Not a late-interaction layout, or a malformed setting or module, or a module
            stack the export cannot reproduce (the message names the file, the key or module and
            what it must be).
    """
    directory = Path(directory)
    layout_format = _layout_format(directory)
    if layout_format is None:
        raise ExportError(f"{directory} is no late-interaction checkpoint: it needs "
                          + " or ".join(f"{entry.needs} ({entry.name})"
                                        for entry in LAYOUT_FORMATS))
    return layout_format.read(directory, layout_format.name)


def row_settings(layout: ColbertLayout, tokenizer: Any, max_positions: int,
                 dim: int) -> LateInteractionSettings:
    """The manifest's settings: markers and skiplist as vocabulary ids (exact token lookup; a
    skiplist word that is no single token is dropped, as sentence-transformers does).

    Raises:
        ExportError: A marker is no token (or, as a prompt, does not tokenize as that one token
            before any text), no expansion token with query expansion on, or a length beyond the
            position embeddings.
    """
    directory = layout.transformer_dir
    for name, length in (("query_length", layout.query_length),
                         ("document_length", layout.document_length)):
        if length > max_positions:
            raise ExportError(f"{name}={length} of {directory} exceeds the model's "
                              f"{max_positions} position embeddings")
    markers = {what: _token_id(tokenizer, marker, what, directory) for what, marker in (
        ("query prefix", layout.query_prefix), ("document prefix", layout.document_prefix))}
    if layout.prefixes_are_prompts:
        for (what, marker_id), prompt in zip(markers.items(),
                                             (layout.query_prefix, layout.document_prefix)):
            _check_prompt(tokenizer, prompt, marker_id, what, directory)
    if layout.expansion_token is not None:
        expansion_id = _token_id(tokenizer, layout.expansion_token, "query expansion token",
                                 directory)
    else:
        expansion_id = tokenizer.mask_token_id
        if expansion_id is None:
            expansion_id = tokenizer.eos_token_id
    if expansion_id is None and layout.query_expansion:
        raise ExportError(f"{directory}'s tokenizer has neither a mask nor an eos token to expand "
                          "queries with; set do_query_expansion to false")
    skiplist = sorted({int(token_id) for token_id in
                       (tokenizer.convert_tokens_to_ids(word) for word in layout.skiplist_words)
                       if token_id is not None and token_id != tokenizer.unk_token_id})
    return LateInteractionSettings(
        query_prefix_id=markers["query prefix"], document_prefix_id=markers["document prefix"],
        query_length=layout.query_length, document_length=layout.document_length,
        query_expansion=layout.query_expansion,
        attend_to_expansion_tokens=layout.attend_to_expansion_tokens,
        expansion_token_id=int(expansion_id if expansion_id is not None else 0),
        skiplist_ids=tuple(skiplist), dim=dim)


def _token_id(tokenizer: Any, marker: str, what: str, directory: Path) -> int:
    """The vocabulary id of a marker ("[unused0]", or an added "[Q] " token), tried as written
    and without its surrounding spaces."""
    for candidate in dict.fromkeys((marker, marker.strip())):
        token_id = tokenizer.convert_tokens_to_ids(candidate)
        if token_id is not None and token_id != tokenizer.unk_token_id:
            return int(token_id)
    raise ExportError(f"the {what} {marker!r} of {directory} is not one token of its tokenizer; "
                      "a late-interaction marker must be in the vocabulary or an added token")


def _check_prompt(tokenizer: Any, prompt: str, marker_id: int, what: str,
                  directory: Path) -> None:
    """A prompt prepended to the text (sentence-transformers 6) must make the row the engine
    makes by inserting the marker id: the tokenizer splits it off as that one token."""
    for text in PROMPT_PROBES:
        alone = tokenizer(text, add_special_tokens=False)["input_ids"]
        prompted = tokenizer(prompt + text, add_special_tokens=False)["input_ids"]
        if prompted != [marker_id, *alone]:
            raise ExportError(
                f"the {what} prompt {prompt!r} of {directory} does not tokenize as the one token "
                f"{tokenizer.convert_ids_to_tokens(marker_id)!r} before the text ({prompt + text!r} "
                f"gives {tokenizer.convert_ids_to_tokens(prompted)[:4]}...); register the marker "
                "as a special token of the tokenizer, or use a prompt that is one")


def _layout_format(directory: Path) -> LayoutFormat | None:
    return next((entry for entry in LAYOUT_FORMATS if entry.recognises(directory)), None)


def _read_json(path: Path, *, missing: Any) -> Any:
    if not path.is_file():
        return missing
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ExportError(f"could not read {path.name} in {path.parent}: {err}") from err


def _json_object(path: Path) -> dict[str, Any]:
    data = _read_json(path, missing={})
    if not isinstance(data, dict):
        raise ExportError(f"malformed late-interaction config {path}: not a JSON object")
    return data


def _module_list(directory: Path) -> list[dict[str, Any]]:
    modules = _read_json(directory / "modules.json", missing=[])
    if not isinstance(modules, list) or not modules or not all(
            isinstance(module, dict) for module in modules):
        raise ExportError(f"malformed modules.json in {directory}: a non-empty list of modules")
    return modules


def _class_name(module: dict[str, Any]) -> str:
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def _checked_settings(values: dict[str, Any], where: Path, names: dict[str, str]) -> dict[str, Any]:
    """The settings as (name -> value) with their types checked; `names` maps our names to the
    file's keys (for the messages)."""
    checks: dict[str, tuple[type, str]] = {
        "query_prefix": (str, "a str"), "document_prefix": (str, "a str"),
        "query_length": (int, "an int >= 4"), "document_length": (int, "an int >= 4"),
        "query_expansion": (bool, "true or false"),
        "attend_to_expansion_tokens": (bool, "true or false")}
    for key, (kind, wanted) in checks.items():
        value = values[key]
        bad = not isinstance(value, kind) or (
            kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 4))
        if bad:
            raise ExportError(f"malformed late-interaction config {where}: {names[key]} must be "
                              f"{wanted}, got {value!r}")
    skiplist = values["skiplist_words"]
    if not isinstance(skiplist, list) or not all(isinstance(word, str) for word in skiplist):
        raise ExportError(f"malformed late-interaction config {where}: {names['skiplist_words']} "
                          f"must be a list of str, got {skiplist!r:.80}")
    return values


def _recognises_multi_vector(directory: Path) -> bool:
    config = _read_json(directory / ST_CONFIG, missing={})
    return (directory / "modules.json").is_file() and isinstance(config, dict) and config.get(
        "model_type") == "MultiVectorEncoder"


def _read_multi_vector(directory: Path, name: str) -> ColbertLayout:
    """sentence-transformers 6's own save of a MultiVectorEncoder."""
    query_prefix, document_prefix = _prompts(directory / ST_CONFIG)
    transformer_dir, projections, mask = _module_stack(directory)
    settings_path = transformer_dir / "sentence_bert_config.json"
    settings = _json_object(settings_path)
    for key, allowed in TRANSFORMER_SETTINGS.items():
        if settings.get(key, allowed[0]) not in allowed:
            raise ExportError(f"{settings_path} sets {key} {settings[key]!r:.80}; the "
                              f"late-interaction export reproduces {' or '.join(map(repr, allowed))}")
    expansion = settings.get("query_expansion")
    if expansion is not None and (not isinstance(expansion, dict)
                                  or expansion.get("strategy") != "fixed"):
        raise ExportError(f"{settings_path} sets query_expansion {expansion!r:.80}; onnxrank "
                          "expands queries to a fixed length: strategy 'fixed', or null for none")
    if expansion is not None and mask is None:
        raise ExportError(f"{directory} expands queries without a MultiVectorMask module, so "
                          "sentence-transformers does not score the expansion; add one")
    expansion, mask = expansion or {}, mask or {}
    # a length left unset is the tokenizer's limit, as sentence-transformers truncates
    limit = settings.get("max_seq_length") or _read_json(
        transformer_dir / "tokenizer_config.json", missing={}).get("model_max_length")
    checked = _checked_settings({
        "query_prefix": query_prefix, "document_prefix": document_prefix,
        "query_length": expansion.get("length") or settings.get("query_length") or limit,
        "document_length": settings.get("document_length") or limit,
        "query_expansion": bool(expansion),
        "attend_to_expansion_tokens": expansion.get("attend", False),
        "skiplist_words": mask.get("skiplist_words", [])}, settings_path, {
        "query_prefix": f"{ST_CONFIG} prompts['query']",
        "document_prefix": f"{ST_CONFIG} prompts['document']",
        "query_length": "query_expansion['length'] (else query_length, else the tokenizer's "
                        "model_max_length)",
        "document_length": "document_length (else the tokenizer's model_max_length)",
        "query_expansion": "query_expansion", "attend_to_expansion_tokens": "query_expansion['attend']",
        "skiplist_words": "the MultiVectorMask's skiplist_words"})
    token = expansion.get("token")
    return ColbertLayout(
        name=name, transformer_dir=transformer_dir, projections=projections,
        query_prefix=checked["query_prefix"], document_prefix=checked["document_prefix"],
        query_length=checked["query_length"], document_length=checked["document_length"],
        query_expansion=checked["query_expansion"],
        attend_to_expansion_tokens=checked["attend_to_expansion_tokens"],
        skiplist_words=tuple(checked["skiplist_words"]),
        expansion_token=None if token is None else str(token), prefixes_are_prompts=True)


def _prompts(config_path: Path) -> tuple[str, str]:
    """A MultiVectorEncoder's query and document prompts (encode_document's fallbacks too), with
    a scoring function the export reproduces."""
    config = _json_object(config_path)
    similarity = config.get("similarity_fn_name") or "maxsim"
    if similarity != "maxsim":
        raise ExportError(f"{config_path} sets similarity_fn_name {similarity!r}; onnxrank scores "
                          "late interaction by MaxSim ('maxsim')")
    prompts = config.get("prompts") or {}
    if not isinstance(prompts, dict):
        raise ExportError(f"malformed late-interaction config {config_path}: prompts must be an "
                          f"object of prompt name -> text, got {prompts!r:.80}")
    query_prefix = prompts.get("query")
    document_prefix = next((prompts[key] for key in DOCUMENT_PROMPTS if prompts.get(key)), None)
    if not query_prefix or not document_prefix:
        raise ExportError(f"{config_path} has no 'query' and 'document' prompts; onnxrank's "
                          "late-interaction rows carry one marker token each (e.g. '[Q] ' and "
                          f"'[D] '), got prompts {prompts!r:.80}")
    return query_prefix, document_prefix


def _module_stack(directory: Path) -> tuple[Path, tuple[Projection, ...], dict[str, Any] | None]:
    """A MultiVectorEncoder's modules: where its Transformer is, its projections and its
    MultiVectorMask's config (None without one); only Transformer, Dense..., MultiVectorMask and
    Normalize (after the last Dense) are reproduced."""
    modules = _module_list(directory)
    if _class_name(modules[0]) != "Transformer":
        raise ExportError(f"{directory}'s modules.json starts with {modules[0].get('type')!r}; "
                          "a late-interaction stack starts with the Transformer")
    projections: list[Projection] = []
    mask: dict[str, Any] | None = None
    normalized = False
    for module in modules[1:]:
        kind, path = _class_name(module), directory / str(module.get("path", ""))
        if kind == "Dense" and not normalized:
            projections.append(_read_dense(path))
        elif kind == "MultiVectorMask":
            mask = _json_object(path / "config.json")
        elif kind == "Normalize":
            normalized = True
        else:
            raise ExportError(
                f"{directory}'s modules.json has module {module.get('type')!r} ({path.name}"
                f"{' after Normalize' if kind == 'Dense' else ''}); a late-interaction export "
                "reproduces Transformer, Dense..., MultiVectorMask and Normalize only")
    if not normalized:
        raise ExportError(f"{directory}'s modules.json has no Normalize module after its Dense "
                          "modules; onnxrank's token vectors are L2-normalised")
    if mask is not None and (mask.get("skiplist_tasks", ["document"]) != ["document"]
                             or mask.get("keep_only_token_ids") is not None):
        raise ExportError(f"{directory}'s MultiVectorMask drops rows for tasks "
                          f"{mask.get('skiplist_tasks')!r} or keeps only token ids "
                          f"{mask.get('keep_only_token_ids')!r:.40}; onnxrank drops skiplisted "
                          "document rows only (skiplist_tasks ['document'], keep_only_token_ids "
                          "null)")
    return (directory / str(modules[0].get("path", "")), _projected(projections, directory),
            mask)


def _projected(projections: list[Projection], directory: Path) -> tuple[Projection, ...]:
    if not projections:
        raise ExportError(f"{directory}'s modules.json lists no Dense module after the "
                          "Transformer; a late-interaction checkpoint projects its token vectors")
    return tuple(projections)


def _recognises_pylate(directory: Path) -> bool:
    config = _read_json(directory / ST_CONFIG, missing={})
    return (directory / "modules.json").is_file() and isinstance(config, dict) and any(
        key in config for key in ("query_prefix", "document_prefix", "query_length",
                                  "document_length", "do_query_expansion"))


def _read_pylate(directory: Path, name: str) -> ColbertLayout:
    config_path = directory / ST_CONFIG
    config = _json_object(config_path)
    values = {**PYLATE_DEFAULTS, **{key: config[key] for key in PYLATE_DEFAULTS if key in config}}
    values["query_expansion"] = values.pop("do_query_expansion")
    keys = {key: key for key in PYLATE_DEFAULTS} | {"query_expansion": "do_query_expansion"}
    settings = _checked_settings(values, config_path, keys)
    modules = _module_list(directory)
    # Normalize, MultiVectorMask: the graph always normalises and masks
    projections = _projected([_read_dense(directory / str(module.get("path", "")))
                              for module in modules[1:] if _class_name(module) == "Dense"],
                             directory)
    return ColbertLayout(
        name=name, transformer_dir=directory / str(modules[0].get("path", "")),
        projections=projections, query_prefix=settings["query_prefix"],
        document_prefix=settings["document_prefix"], query_length=settings["query_length"],
        document_length=settings["document_length"], query_expansion=settings["query_expansion"],
        attend_to_expansion_tokens=settings["attend_to_expansion_tokens"],
        skiplist_words=tuple(settings["skiplist_words"]))


def _read_dense(directory: Path) -> Projection:
    config = _read_json(directory / "config.json", missing=None)
    if not isinstance(config, dict):
        raise ExportError(f"could not find the Dense module's config.json in {directory}")
    activation = config.get("activation_function", IDENTITY_ACTIVATIONS[0])
    if activation not in IDENTITY_ACTIVATIONS:
        raise ExportError(f"the Dense module in {directory} has activation {activation!r}; "
                          "late-interaction projections are exported without one (Identity)")
    if config.get("use_residual") or config.get(
            "module_input_name", "token_embeddings") != "token_embeddings":
        raise ExportError(f"the Dense module in {directory} adds a residual or reads "
                          f"{config.get('module_input_name')!r}; late-interaction projections "
                          "map each token vector alone (token_embeddings, no residual)")
    weights = _read_weights(directory)
    if "linear.weight" not in weights:
        raise ExportError(f"the Dense module in {directory} has no linear.weight "
                          f"(found {', '.join(sorted(weights)) or 'nothing'})")
    bias = weights.get("linear.bias") if config.get("bias", False) else None
    return Projection(weights["linear.weight"], bias)


def _read_weights(directory: Path) -> dict[str, np.ndarray]:
    """The tensors of a module's weight file (safetensors, else a torch pickle) as float32."""
    for file_name in WEIGHT_FILES:
        path = directory / file_name
        if not path.is_file():
            continue
        if file_name.endswith(".safetensors"):
            safetensors = require("safetensors.numpy", extra="export")
            return {name: np.asarray(value, dtype=np.float32)
                    for name, value in safetensors.load_file(str(path)).items()}
        torch = require("torch", extra="export")
        state = torch.load(str(path), map_location="cpu", weights_only=True)
        return {name: value.float().numpy() for name, value in state.items()}
    raise ExportError(f"could not find {' or '.join(WEIGHT_FILES)} in {directory}")


def _recognises_stanford(directory: Path) -> bool:
    config = _read_json(directory / "config.json", missing={})
    return isinstance(config, dict) and "HF_ColBERT" in (config.get("architectures") or [])


def _read_stanford(directory: Path, name: str) -> ColbertLayout:
    metadata_path = directory / "artifact.metadata"
    metadata = _json_object(metadata_path)
    values = {**STANFORD_DEFAULTS,
              **{key: metadata[key] for key in STANFORD_DEFAULTS if key in metadata}}
    mask_punctuation = values["mask_punctuation"]
    if not isinstance(mask_punctuation, bool):
        raise ExportError(f"malformed late-interaction config {metadata_path}: mask_punctuation "
                          f"must be true or false, got {mask_punctuation!r}")
    settings = _checked_settings({
        "query_prefix": values["query_token_id"], "document_prefix": values["doc_token_id"],
        "query_length": values["query_maxlen"], "document_length": values["doc_maxlen"],
        "query_expansion": True, "attend_to_expansion_tokens": values["attend_to_mask_tokens"],
        "skiplist_words": list(string.punctuation) if mask_punctuation else []},
        metadata_path, {"query_prefix": "query_token_id", "document_prefix": "doc_token_id",
                        "query_length": "query_maxlen", "document_length": "doc_maxlen",
                        "query_expansion": "(always on)",
                        "attend_to_expansion_tokens": "attend_to_mask_tokens",
                        "skiplist_words": "mask_punctuation"})
    weights = _read_weights(directory)
    if "linear.weight" not in weights:
        raise ExportError(f"{directory} is an HF_ColBERT checkpoint without linear.weight")
    return ColbertLayout(
        name=name, transformer_dir=directory,
        projections=(Projection(weights["linear.weight"], None),),
        query_prefix=settings["query_prefix"], document_prefix=settings["document_prefix"],
        query_length=settings["query_length"], document_length=settings["document_length"],
        query_expansion=True, attend_to_expansion_tokens=settings["attend_to_expansion_tokens"],
        skiplist_words=tuple(settings["skiplist_words"]))


# the layouts, tried in this order: a sentence-transformers 6 save says its model_type, which a
# PyLate save does not
LAYOUT_FORMATS: tuple[LayoutFormat, ...] = (
    LayoutFormat("sentence_transformers",
                 f"modules.json with {ST_CONFIG} of model_type MultiVectorEncoder",
                 _recognises_multi_vector, _read_multi_vector),
    LayoutFormat("pylate", f"modules.json with {ST_CONFIG} naming query_prefix, document_prefix, "
                 "query_length, document_length or do_query_expansion",
                 _recognises_pylate, _read_pylate),
    LayoutFormat("stanford", "config.json with architectures ['HF_ColBERT']",
                 _recognises_stanford, _read_stanford),
)
