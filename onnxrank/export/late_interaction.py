"""Export of a late-interaction (ColBERT) checkpoint: the token-vector graph, gated on MaxSim.

Two layouts are read, each once, into the manifest's ``late_interaction`` settings
(onnxrank.engine.late_rows.LateInteractionSettings) and the list of projections:

1. PyLate / sentence-transformers: ``modules.json`` with the Transformer and one or more
   ``Dense`` modules (``1_Dense/``: config.json and ``linear.weight``), and
   ``config_sentence_transformers.json`` with ``query_prefix``, ``document_prefix``,
   ``query_length``, ``document_length``, ``attend_to_expansion_tokens``,
   ``do_query_expansion`` and ``skiplist_words`` (PyLate's defaults where a key is absent).
2. Stanford ``HF_ColBERT``: ``linear.weight`` beside the encoder weights and
   ``artifact.metadata`` (``query_token_id``, ``doc_token_id``, ``query_maxlen``, ``doc_maxlen``,
   ``attend_to_mask_tokens``, ``mask_punctuation``); queries are always expanded.

The graph is transformer -> projections -> L2 normalisation, output ``token_vectors``
[batch, sequence, dim]. Its gate is the pipeline's score gate (FidelityThresholds.score_checks)
on the MaxSim scores of the shipped validation pairs against the same stack run in PyTorch, every
query and document encoded as the engine encodes it; int8 is the request's recipes tried in order
under the int8 gate (static recipes need calibration batches and are skipped), a miss recorded in
``failed_variants``. Other variants are recorded as not applicable.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxrank._optional import require
from onnxrank.engine.late_interaction import query_plan, token_vectors
from onnxrank.engine.late_rows import LateInteractionEncoder, LateInteractionSettings
from onnxrank.engine.maxsim import maxsim
from onnxrank.engine.runtime import open_model_file
from onnxrank.engine.spec import ModelSpec, Task, VariantSpec, sha256_file, write_manifest
from onnxrank.engine.variants import VARIANTS
from onnxrank.errors import ExportError, FidelityError
from onnxrank.export.context import first_line
from onnxrank.export.families import family_for
from onnxrank.export.fidelity import score_metrics
from onnxrank.export.onnx import export_module
from onnxrank.export.quantize import distinct_recipes, quantize_int8
from onnxrank.export.standin import STANDIN_MARKER
from onnxrank.export.tasks import RERANK
from onnxrank.export.validate import (
    HELD_OUT,
    TUNING,
    length_batches,
    load_validation_pairs,
    threshold_failures,
)

if TYPE_CHECKING:
    import torch

    from onnxrank.export.context import Progress
    from onnxrank.export.pipeline import ExportRequest
    from onnxrank.export.source import ModelSource

logger = logging.getLogger(__name__)

TASK: Task = "late_interaction"
OUTPUT_NAME = "token_vectors"
# the variants this export builds; the others asked for are recorded as not applicable
BUILT_VARIANTS = ("fp32", "int8")
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
RUN_BATCH = 16
Run = Callable[[dict[str, np.ndarray]], np.ndarray]


@dataclass(frozen=True, slots=True)
class Projection:
    """One Dense module: weight [out, in] and optional bias [out]."""

    weight: np.ndarray
    bias: np.ndarray | None


@dataclass(frozen=True, slots=True)
class ColbertLayout:
    """A late-interaction checkpoint as read: its layout, where the transformer is, its
    projections, and its row settings by name (prefixes and skiplist still as text)."""

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


def is_late_interaction(directory: Path) -> bool:
    """Whether a checkpoint directory is a late-interaction one: a PyLate-style
    ``config_sentence_transformers.json`` naming query/document prefixes or lengths beside
    ``modules.json``, or a config.json whose architectures name ``HF_ColBERT``."""
    return _layout_name(Path(directory)) is not None


def _layout_name(directory: Path) -> str | None:
    st_config = _read_json(directory / "config_sentence_transformers.json", missing={})
    if (directory / "modules.json").is_file() and isinstance(st_config, dict) and any(
            key in st_config for key in ("query_prefix", "document_prefix", "query_length",
                                         "document_length", "do_query_expansion")):
        return "pylate"
    config = _read_json(directory / "config.json", missing={})
    if isinstance(config, dict) and "HF_ColBERT" in (config.get("architectures") or []):
        return "stanford"
    return None


def _read_json(path: Path, *, missing: Any) -> Any:
    if not path.is_file():
        return missing
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ExportError(f"could not read {path.name} in {path.parent}: {err}") from err


def read_layout(directory: Path) -> ColbertLayout:
    """Read a late-interaction checkpoint's settings and projections.

    Raises:
        ExportError: Not a late-interaction layout, or a malformed setting or module (the
            message names the file, the key and what it must be).
    """
    directory = Path(directory)
    name = _layout_name(directory)
    if name == "pylate":
        return _read_pylate(directory)
    if name == "stanford":
        return _read_stanford(directory)
    raise ExportError(f"{directory} is no late-interaction checkpoint: it needs modules.json with "
                      "config_sentence_transformers.json (PyLate) or config.json with "
                      "architectures ['HF_ColBERT'] (Stanford ColBERT)")


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


def _read_pylate(directory: Path) -> ColbertLayout:
    config_path = directory / "config_sentence_transformers.json"
    config = _read_json(config_path, missing={})
    if not isinstance(config, dict):
        raise ExportError(f"malformed late-interaction config {config_path}: not a JSON object")
    values = {**PYLATE_DEFAULTS, **{key: config[key] for key in PYLATE_DEFAULTS if key in config}}
    values["query_expansion"] = values.pop("do_query_expansion")
    keys = {key: key for key in PYLATE_DEFAULTS} | {"query_expansion": "do_query_expansion"}
    settings = _checked_settings(values, config_path, keys)
    modules = _read_json(directory / "modules.json", missing=[])
    if not isinstance(modules, list) or not modules:
        raise ExportError(f"malformed modules.json in {directory}: a non-empty list of modules")
    projections = []
    for module in modules[1:]:
        kind = str(module.get("type", ""))
        if kind.rsplit(".", 1)[-1] != "Dense":
            continue  # Normalize, MultiVectorMask: the graph always normalises and masks
        projections.append(_read_dense(directory / str(module.get("path", ""))))
    if not projections:
        raise ExportError(f"{directory}'s modules.json lists no Dense module after the "
                          "Transformer; a late-interaction checkpoint projects its token vectors")
    return ColbertLayout("pylate", directory / str(modules[0].get("path", "")),
                         tuple(projections), settings["query_prefix"],
                         settings["document_prefix"], settings["query_length"],
                         settings["document_length"], settings["query_expansion"],
                         settings["attend_to_expansion_tokens"],
                         tuple(settings["skiplist_words"]))


def _read_dense(directory: Path) -> Projection:
    config = _read_json(directory / "config.json", missing=None)
    if not isinstance(config, dict):
        raise ExportError(f"could not find the Dense module's config.json in {directory}")
    activation = config.get("activation_function", IDENTITY_ACTIVATIONS[0])
    if activation not in IDENTITY_ACTIVATIONS:
        raise ExportError(f"the Dense module in {directory} has activation {activation!r}; "
                          "late-interaction projections are exported without one (Identity)")
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


def _read_stanford(directory: Path) -> ColbertLayout:
    metadata_path = directory / "artifact.metadata"
    metadata = _read_json(metadata_path, missing={})
    if not isinstance(metadata, dict):
        raise ExportError(f"malformed late-interaction config {metadata_path}: not a JSON object")
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
    return ColbertLayout("stanford", directory, (Projection(weights["linear.weight"], None),),
                         settings["query_prefix"], settings["document_prefix"],
                         settings["query_length"], settings["document_length"], True,
                         settings["attend_to_expansion_tokens"], tuple(settings["skiplist_words"]))


def _token_id(tokenizer: Any, marker: str, what: str, directory: Path) -> int:
    """The vocabulary id of a marker ("[unused0]", or an added "[Q] " token), tried as written
    and without its surrounding spaces."""
    for candidate in dict.fromkeys((marker, marker.strip())):
        token_id = tokenizer.convert_tokens_to_ids(candidate)
        if token_id is not None and token_id != tokenizer.unk_token_id:
            return int(token_id)
    raise ExportError(f"the {what} {marker!r} of {directory} is not one token of its tokenizer; "
                      "a late-interaction marker must be in the vocabulary or an added token")


def row_settings(layout: ColbertLayout, tokenizer: Any, max_positions: int,
                 dim: int) -> LateInteractionSettings:
    """The manifest's settings: markers and skiplist as vocabulary ids (exact token lookup; a
    skiplist word that is no single token is dropped, as sentence-transformers does).

    Raises:
        ExportError: A marker is no token, no expansion token with query expansion on, or a
            length beyond the position embeddings.
    """
    directory = layout.transformer_dir
    for name, length in (("query_length", layout.query_length),
                         ("document_length", layout.document_length)):
        if length > max_positions:
            raise ExportError(f"{name}={length} of {directory} exceeds the model's "
                              f"{max_positions} position embeddings")
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
        query_prefix_id=_token_id(tokenizer, layout.query_prefix, "query prefix", directory),
        document_prefix_id=_token_id(tokenizer, layout.document_prefix, "document prefix",
                                     directory),
        query_length=layout.query_length, document_length=layout.document_length,
        query_expansion=layout.query_expansion,
        attend_to_expansion_tokens=layout.attend_to_expansion_tokens,
        expansion_token_id=int(expansion_id if expansion_id is not None else 0),
        skiplist_ids=tuple(skiplist), dim=dim)


def token_vector_graph(model: Any, projections: Sequence[Projection],
                       input_names: tuple[str, ...]) -> torch.nn.Module:
    """The encoder, its projections and L2 normalisation as one module taking the graph inputs
    positionally and returning token vectors [batch, sequence, dim]."""
    torch = require("torch", extra="export")
    linears = []
    for projection in projections:
        out_features, in_features = projection.weight.shape
        linear = torch.nn.Linear(in_features, out_features, bias=projection.bias is not None)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(projection.weight))
            if projection.bias is not None:
                linear.bias.copy_(torch.from_numpy(projection.bias))
        linears.append(linear)

    class TokenVectorGraph(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.model = model
            self.projections = torch.nn.Sequential(*linears)

        def forward(self, *inputs: Any) -> Any:
            hidden = self.model(**dict(zip(input_names, inputs))).last_hidden_state
            return torch.nn.functional.normalize(self.projections(hidden), p=2.0, dim=-1)

    return TokenVectorGraph().eval()


def pair_scores(run: Run, encoder: LateInteractionEncoder, pairs: Sequence[tuple[str, str]],
                pad_token_id: int) -> np.ndarray:
    """MaxSim of each pair with `run`, every query and document encoded and kept as the engine
    does (onnxrank.engine.late_interaction), each distinct text once."""
    settings = encoder.settings
    queries = list(dict.fromkeys(query for query, _ in pairs))
    documents = list(dict.fromkeys(document for _, document in pairs))
    query_rows = encoder.encode_queries(queries)
    plan = (query_plan(query_rows, settings, RUN_BATCH) if settings.query_expansion
            else length_batches(query_rows, pad_token_id, RUN_BATCH))
    query_vectors = dict(zip(queries, token_vectors(plan, run, encoder.query_keep, settings.dim,
                                                    finite=None)))
    document_plan = length_batches(encoder.encode_documents(documents), pad_token_id, RUN_BATCH)
    document_vectors = dict(zip(documents, token_vectors(document_plan, run,
                                                         encoder.document_keep, settings.dim,
                                                         finite=None)))
    return np.asarray([maxsim(query_vectors[query], document_vectors[document])
                       for query, document in pairs], dtype=np.float64)


def export_into(request: ExportRequest, source: ModelSource, work_dir: Path, name: str,
                progress: Progress) -> ModelSpec:
    """Every stage of a late-interaction export into `work_dir` (published by the caller):
    read the layout, load, trace fp32, reference, gate fp32, int8 recipes, manifest.

    Raises:
        ExportError: Not loadable, malformed settings, or the graph could not be exported.
        FidelityError: fp32 missed its gate.
    """
    from onnxrank.export.pipeline import SCRATCH_DIR, TOKENIZER_FILE, _versions

    transformers = require("transformers", extra="export")
    torch = require("torch", extra="export")
    tokenizers = require("tokenizers", extra="export")
    progress.step("load")
    layout = read_layout(Path(source.location))
    location = str(layout.transformer_dir)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(location, local_files_only=True)
        model = transformers.AutoModel.from_pretrained(
            location, attn_implementation="eager", dtype=torch.float32,
            local_files_only=True).eval()
    except (OSError, ValueError) as err:
        raise ExportError(f"could not load the transformer of {source.location}: {err}") from err
    config = model.config
    family = family_for(config)
    input_names = family.input_names(tokenizer, config)
    settings = row_settings(layout, tokenizer, family.max_positions(config),
                            int(layout.projections[-1].weight.shape[0]))
    scratch = work_dir / SCRATCH_DIR
    scratch.mkdir()
    progress.step("export fp32")
    graph = token_vector_graph(model, layout.projections, input_names)
    exporter = request.exporter or family.exporters[0]
    fp32_path = scratch / VARIANTS["fp32"].file
    try:
        export_module(graph, fp32_path, output_name=OUTPUT_NAME, input_names=input_names,
                      opset=request.opset, exporter=exporter, per_token_output=True)
    except Exception as err:
        raise ExportError(f"could not export the token-vector graph of {source.location} "
                          f"({family.name} family, {exporter} exporter): {first_line(err)}") from err
    tokenizer.save_pretrained(str(work_dir))
    config.save_pretrained(str(work_dir))
    engine_tokenizer = tokenizers.Tokenizer.from_file(str(work_dir / TOKENIZER_FILE))
    engine_tokenizer.no_padding()
    engine_tokenizer.no_truncation()
    encoder = LateInteractionEncoder(engine_tokenizer, settings)
    pad_id = int(tokenizer.pad_token_id or 0)
    validation = load_validation_pairs(request.validation_pairs)
    pairs = [(pair.query, pair.passage) for pair in validation]
    progress.step("reference")

    def run_reference(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            return graph(*(torch.from_numpy(feeds[name]) for name in input_names)).numpy()

    reference = pair_scores(run_reference, encoder, pairs, pad_id)

    def gate(path: Path, variant: str) -> tuple[dict[str, Any], list[str]]:
        runner = open_model_file(path)
        scores = pair_scores(runner.run, encoder, pairs, pad_id)
        return _fidelity(request, variant, reference, scores, validation)

    progress.step("validate fp32")
    fidelity, failures = gate(fp32_path, "fp32")
    if failures:
        raise FidelityError("the fp32 token-vector graph failed validation against the PyTorch "
                            f"reference: {'; '.join(failures)}. Nothing was written")
    built: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {"fp32": (fidelity, None)}
    failed: dict[str, dict[str, Any]] = {
        variant: {"stage": "not applicable",
                  "reason": f"late-interaction exports build {' and '.join(BUILT_VARIANTS)} only"}
        for variant in request.variants if variant not in BUILT_VARIANTS}
    if "int8" in request.variants:
        progress.step("int8")
        outcome = _int8(request, fp32_path, scratch / VARIANTS["int8"].file,
                        int(config.num_hidden_layers), gate)
        if "reason" in outcome:
            failed["int8"] = outcome
            logger.warning("variant int8 left out: %s", outcome["reason"])
        else:
            built["int8"] = (outcome["fidelity"], outcome["quantization"])
    progress.step("manifest")
    variants = {}
    for variant in (variant for variant in request.variants if variant in built):
        file_name = VARIANTS[variant].file
        os.replace(scratch / file_name, work_dir / file_name)
        variant_fidelity, quantization = built[variant]
        variants[variant] = VariantSpec(
            file=file_name, sha256=sha256_file(work_dir / file_name),
            size_bytes=(work_dir / file_name).stat().st_size,
            precision=VARIANTS[variant].precision, opset=request.opset,
            quantization=quantization, fidelity=variant_fidelity)
    shutil.rmtree(scratch)
    if not variants:
        raise FidelityError(f"none of the variants asked for ({', '.join(request.variants)}) "
                            f"was built: {'; '.join(entry['reason'] for entry in failed.values())}")
    tokenizer_files = {path.name: sha256_file(path) for path in sorted(work_dir.iterdir())
                       if path.is_file() and path.suffix in (".json", ".txt", ".model")
                       and path.name != TOKENIZER_FILE}
    source_entry = {"kind": source.kind, "path": source.location, "layout": layout.name}
    spec = ModelSpec(
        name=name, task=TASK, source=source_entry, num_labels=1,
        max_length=settings.document_length, activation="none",
        relevance_trained=not (Path(source.location) / STANDIN_MARKER).is_file()
        and not (layout.transformer_dir / STANDIN_MARKER).is_file(),
        tokenizer_file=TOKENIZER_FILE,
        tokenizer_sha256=sha256_file(work_dir / TOKENIZER_FILE),
        tokenizer_files=tokenizer_files, vocab_size=int(config.vocab_size),
        pad_token_id=pad_id, variants=variants, versions=_versions(),
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        model_config={key: getattr(config, key, None) for key in
                      ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                       "max_position_embeddings")},
        graph_rewrites={"cls_only_last_layer": {
            "applied": False, "reason": "late interaction: every token row is an output"}},
        family={**family.describe(config), "exporter": exporter},
        failed_variants=failed, late_interaction=settings.to_manifest(),
        notes=(f"Late-interaction model ({layout.name} layout): the graph outputs L2-normalised "
               f"token vectors (output '{OUTPUT_NAME}'); scores are MaxSim sums."))
    write_manifest(spec, work_dir)
    return spec


def _fidelity(request: ExportRequest, variant: str, reference: np.ndarray, scores: np.ndarray,
              validation: Sequence[Any]) -> tuple[dict[str, Any], list[str]]:
    """The score metrics of both parts (tuning at the top level, held-out under its name) and
    one message per threshold missed (validate.threshold_failures)."""
    parts = {}
    for part in (TUNING, HELD_OUT):
        members = [index for index, pair in enumerate(validation) if pair.part == part]
        if members:
            parts[part] = score_metrics(reference[members], scores[members],
                                        [validation[index].group for index in members])
    fidelity = {**parts.get(TUNING, {}), "part": TUNING}
    if HELD_OUT in parts:
        fidelity[HELD_OUT] = parts[HELD_OUT]
    # judged on scores, as a cross-encoder is
    return fidelity, threshold_failures(RERANK, variant, fidelity, request.thresholds)


def _int8(request: ExportRequest, fp32_path: Path, out_path: Path, layers: int,
          gate: Callable[[Path, str], tuple[dict[str, Any], list[str]]]) -> dict[str, Any]:
    """The first int8 recipe that passes the gate ({"fidelity", "quantization"}), else the
    failed_variants entry with every attempt."""
    attempts = []
    for settings in distinct_recipes(request.int8, layers=layers):
        if settings.method == "static" or settings.search_fp32_groups:
            attempts.append({"method": settings.method, "reason": "skipped: needs calibration "
                             "batches or the cross-encoder ladder's layer-group search"})
            continue
        try:
            quantization = quantize_int8(fp32_path=fp32_path, opt_path=None, out_path=out_path,
                                         settings=settings)
            if quantization.get("quantized_nodes") == 0:
                attempts.append({"method": settings.method,
                                 "reason": "no node of the graph was quantized"})
                continue
            fidelity, failures = gate(out_path, "int8")
        except (ImportError, KeyboardInterrupt):
            raise
        except Exception as err:
            attempts.append({"method": settings.method, "reason": first_line(err)})
            continue
        if not failures:
            return {"fidelity": {**fidelity, "attempts": attempts}, "quantization": quantization}
        attempts.append({"method": settings.method, "reason": "; ".join(failures)})
    return {"stage": "validation", "attempts": attempts,
            "reason": "no int8 recipe met the int8 gate: "
                      + " | ".join(attempt["reason"] for attempt in attempts)}
