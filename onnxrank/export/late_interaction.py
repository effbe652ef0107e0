"""Export of a late-interaction (ColBERT) checkpoint: the token-vector graph, gated on MaxSim.

The checkpoint's layout (sentence-transformers 6, PyLate or Stanford ColBERT) is read once by
onnxrank.export.colbert_checkpoint into the manifest's ``late_interaction`` settings
(onnxrank.engine.late_rows.LateInteractionSettings) and the list of projections.

The graph is transformer -> projections -> L2 normalisation, output ``token_vectors``
[batch, sequence, dim]. Its gate is the pipeline's score gate (FidelityThresholds.score_checks)
on the MaxSim scores of the shipped validation pairs against the same stack run in PyTorch, every
query and document encoded as the engine encodes it; int8 is the request's recipes tried in order
under the int8 gate (static recipes need calibration batches and are skipped), a miss recorded in
``failed_variants``. Other variants are recorded as not applicable. Each built variant's file
also gets the record of every bf16 run the engine makes of it (OpenVINO bf16 on model.onnx, as a
cross-encoder's), under the same MaxSim gate.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from onnxrank._optional import require
from onnxrank.engine.backends.base import ModelRunner
from onnxrank.engine.late_interaction import query_plan, token_vectors
from onnxrank.engine.late_rows import LateInteractionEncoder
from onnxrank.engine.maxsim import maxsim
from onnxrank.engine.runtime import open_model_file
from onnxrank.engine.spec import ModelSpec, VariantSpec, sha256_file, write_manifest
from onnxrank.engine.variants import VARIANTS
from onnxrank.errors import ExportError, FidelityError
from onnxrank.export.colbert_checkpoint import TASK, Projection, read_layout, row_settings
from onnxrank.export.context import SCRATCH_DIR, TOKENIZER_FILE, first_line, package_versions
from onnxrank.export.families import family_for
from onnxrank.export.fidelity import score_metrics
from onnxrank.export.gate import measured_bf16_runs
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
    from onnxrank.export.request import ExportRequest
    from onnxrank.export.source import ModelSource

logger = logging.getLogger(__name__)

OUTPUT_NAME = "token_vectors"
# the variants this export builds; the others asked for are recorded as not applicable
BUILT_VARIANTS = ("fp32", "int8")
RUN_BATCH = 16
Run = Callable[[dict[str, np.ndarray]], np.ndarray]
# a file's fidelity (metrics, threshold misses) judged as the variant named, run on onnxruntime
Gate = Callable[[Path, str], tuple[dict[str, Any], list[str]]]


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
        fidelity, failures = _fidelity(request, variant, reference, scores, validation)
        return {**fidelity, "validated_on": f"{runner.info.backend} {runner.info.provider}"}, failures

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

    def measure(runner: ModelRunner) -> tuple[dict[str, Any], None]:
        scores = pair_scores(runner.run, encoder, pairs, pad_id)
        return _part_metrics(reference, scores, validation), None

    for variant, (variant_fidelity, _) in built.items():
        runs = measured_bf16_runs(variant, scratch / VARIANTS[variant].file, measure, task=RERANK,
                                  thresholds=request.thresholds, progress=progress)
        variant_fidelity.update({key: record for key, (_, record, _) in runs.items()})
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
        pad_token_id=pad_id, variants=variants, versions=package_versions(),
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


def _part_metrics(reference: np.ndarray, scores: np.ndarray,
                  validation: Sequence[Any]) -> dict[str, Any]:
    """The score metrics of both parts: tuning at the top level, held-out under its name."""
    parts = {}
    for part in (TUNING, HELD_OUT):
        members = [index for index, pair in enumerate(validation) if pair.part == part]
        if members:
            parts[part] = score_metrics(reference[members], scores[members],
                                        [validation[index].group for index in members])
    fidelity = {**parts.get(TUNING, {}), "part": TUNING}
    if HELD_OUT in parts:
        fidelity[HELD_OUT] = parts[HELD_OUT]
    return fidelity


def _fidelity(request: ExportRequest, variant: str, reference: np.ndarray, scores: np.ndarray,
              validation: Sequence[Any]) -> tuple[dict[str, Any], list[str]]:
    """`_part_metrics` and one message per threshold missed (validate.threshold_failures)."""
    fidelity = _part_metrics(reference, scores, validation)
    # judged on scores, as a cross-encoder is
    return fidelity, threshold_failures(RERANK, variant, fidelity, request.thresholds)


def _int8(request: ExportRequest, fp32_path: Path, out_path: Path, layers: int,
          gate: Gate) -> dict[str, Any]:
    """The first int8 recipe that passes the gate ({"fidelity", "quantization"}), else the
    failed_variants entry with every attempt."""
    attempts = []
    # every token's vector is scored: no row is the one the score reads
    for settings in distinct_recipes(request.int8, layers=layers, reads_position_0=False):
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
