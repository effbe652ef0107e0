"""`onnxrank export` and `onnxrank models list|verify`: build and inspect model directories."""

from __future__ import annotations

import argparse
import logging
from dataclasses import fields
from pathlib import Path
from typing import Any

from onnxrank.cli.common import HelpFormatter
from onnxrank.cli.options import add_flag, field_flag
from onnxrank.engine.runtime import DEFAULT_MODELS_DIR
from onnxrank.engine.spec import VARIANT_NAMES, ModelSpec, load_model_spec, verify_files
from onnxrank.export.fidelity import FidelityThresholds

# These modules import only numpy, tokenizers and onnxruntime at the top (torch and transformers
# are imported inside the functions that need them), so `onnxrank --help` and `onnxrank models`
# work without the export extra while the defaults below stay the library's own.
from onnxrank.export.onnx import DEFAULT_OPSET, DYNAMO_MIN_OPSET, EXPORTERS
from onnxrank.export.quantize import INT8_METHODS
from onnxrank.export.recipes import BUILTIN_RECIPES
from onnxrank.export.source import DEFAULT_REGISTRY
from onnxrank.export.tasks import DEFAULT_MODEL

logger = logging.getLogger(__name__)

EXPORT_EPILOG = """examples:
  onnxrank export --model minilm-standin                   # offline stand-in -> models/minilm-standin
  onnxrank export --model minilm-embedder --task embedding # -> models/minilm-embedder
  onnxrank export --model cross-encoder/ms-marco-MiniLM-L-6-v2 --out models/ms-marco-minilm-l6
  onnxrank export --model ./my-checkpoint --variants fp32,int8 --int8-min-spearman 0.97
  onnxrank export --model ./qwen3-reranker-0.6b --recipe qwen3-reranker --out models/qwen3-reranker
  onnxrank export --model ./qwen3-reranker-4b --recipe qwen3-reranker --variants ov_int8
"""
MODELS_EPILOG = """examples:
  onnxrank models list
  onnxrank models verify minilm-standin
"""
THRESHOLD_HELP = {
    "fp32_max_abs_diff": "largest |score difference| allowed for model.onnx, per unit of the "
                         "reference's largest |score| (at least 1)",
    "opt_max_abs_diff": "largest |score difference| allowed for model_opt.onnx",
    "int8_min_spearman": "lowest Spearman correlation allowed for model_int8.onnx, "
                         "model_ov_int8.xml and OpenVINO bf16 (rerank), on the tuning and on the "
                         "held-out validation pairs",
    "int8_min_spearman_per_query": "lowest mean over query groups of the Spearman correlation "
                                   "within each group, for the same variants (rerank), on both "
                                   "parts",
    "int8_min_top10_overlap": "lowest mean top-10 overlap per query allowed for the same "
                              "variants (rerank), on both parts",
    "fp16_max_abs_diff": "largest |score difference| for model_fp16.onnx, checked when the CPU "
                         "can run it",
    "embedding_min_cosine": "lowest per-text cosine to the reference for fp32/opt/fp16 "
                            "embedding variants",
    "int8_min_cosine": "lowest per-text cosine for the int8 embedding variants",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `export` and `models` to the top-level parser."""
    export = subparsers.add_parser(
        "export",
        help="export a cross-encoder or embedding model to ONNX and OpenVINO variants and "
        "validate it",
        description="Export MODEL to its variants (fp32, opt, int8, fp16, ov_int8), validate each "
        "against the PyTorch reference on the shipped validation pairs (tuning and held-out "
        "parts), and write models/NAME/ with manifest.json. Needs the export extra, and the "
        'openvino extra for ov_int8: pip install "onnxrank[export,openvino]" (plus '
        '"onnxrank[standin]" for the stand-ins).',
        epilog=EXPORT_EPILOG,
        formatter_class=HelpFormatter,
    )
    add_flag(export, "export", "--model", default=DEFAULT_MODEL,
             help="Hugging Face Hub id, registry name (see --registry) or local checkpoint directory")
    add_flag(export, "export", "--out", type=Path, default=None,
             help="output model directory; default models/NAME")
    add_flag(export, "export", "--task", choices=("rerank", "embedding"), default=None,
             help="rerank (one relevance logit) or embedding (pooled, normalised vectors); "
             "default: from the registry, else rerank")
    add_flag(export, "export", "--recipe", default=None, metavar="NAME|FILE.json",
             help="decoder rerankers (causal LMs such as Qwen3-Reranker): the scoring recipe, "
             f"a built-in name ({', '.join(BUILTIN_RECIPES)}) or a recipe file; default: the "
             "built-in recipe of a known Hub id, or the one a sentence-transformers 6 "
             "checkpoint stores (see docs/decoders.md)")
    add_flag(export, "export", "--exporter", choices=EXPORTERS, default=None,
             help="the torch exporter of the fp32 graph: torchscript (its graphs get "
             "onnxruntime's fused attention) or dynamo (torch.export); default: the model "
             "family's own, recorded in the manifest (see docs/export.md)")
    add_flag(export, "export", "--max-length", type=int, default=None,
             help="tokens per row recorded in the manifest; default 512 for rerankers, the "
             "sentence-transformers max_seq_length for embedders")
    add_flag(export, "export", "--opset", type=int, default=DEFAULT_OPSET,
             help=f"ONNX opset (the dynamo exporter writes {DYNAMO_MIN_OPSET} or above)")
    add_flag(export, "export", "--variants", default=",".join(VARIANT_NAMES),
             help="comma-separated variants to write; ov_int8 alone on a decoder converts "
             "the checkpoint in its own dtype straight to the int8 IR, with no fp32 copy (the "
             "route for 4B/8B shapes; see docs/decoders.md, \"Memory\")")
    add_flag(export, "export", "--int8-method", choices=("auto", *INT8_METHODS),
             default="auto",
             help="onnxruntime int8: auto tries per_row (every encoder MatMul int8 with per-token "
             "activation scales, position 0 and the head fp32), then dynamic per-channel on all "
             "ops, then with "
             "the feed-forward up-projections of the top 1, 2, 3, 6, 12 layers in fp32, then on "
             "attention and embeddings only, keeping the first that meets the thresholds on the "
             "tuning pairs; per_row, dynamic or static (QDQ calibrated on the calibration pairs) "
             "use exactly that recipe; see docs/export.md")
    add_flag(export, "export", "--int8-per-tensor", action="store_true", default=False,
             help="with --int8-method dynamic/static: one weight scale per tensor instead of per "
             "output channel")
    add_flag(export, "export", "--cls-only-last-layer", action=argparse.BooleanOptionalAction,
             default=True,
             help="rerank models: compute the last encoder layer for the [CLS] row only (exact "
             "up to float rounding, fewer FLOPs); embedding models are never pruned")
    add_flag(export, "export", "--validation-pairs", type=int, default=None,
             help="validate on about N pairs (the first pairs of query groups of both parts) "
             "instead of all the shipped pairs; for quick trial runs")
    add_flag(export, "export", "--calibration-pairs", type=int, default=None,
             help="calibrate the static int8 recipes (ov_int8, --int8-method static) on about N "
             "pairs (whole query groups) instead of all 320 shipped calibration pairs; for quick "
             "trial runs")
    add_flag(export, "export", "--registry", type=Path, default=DEFAULT_REGISTRY,
             help="model registry JSON")
    add_flag(export, "export", "--seed", type=int, default=0,
             help="seed for stand-in weights and head fitting")
    defaults = FidelityThresholds()
    for spec in fields(FidelityThresholds):
        add_flag(export, "export", field_flag(spec.name), type=float,
                 default=getattr(defaults, spec.name), help=THRESHOLD_HELP[spec.name])
    add_flag(export, "export", "--quiet", action="store_true", default=False,
             help="no progress bar and no summary table")
    export.set_defaults(handler=run_export)

    models = subparsers.add_parser(
        "models", help="list exported models or verify their file hashes",
        description="Inspect exported model directories under --models-dir.",
        epilog=MODELS_EPILOG, formatter_class=HelpFormatter,
    )
    actions = models.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list", help="show exported models with variant sizes and fidelity",
        description="Show every models-dir/NAME/manifest.json: task, variants, sizes, fidelity.",
        epilog=MODELS_EPILOG, formatter_class=HelpFormatter,
    )
    # --models-dir means what it means to every command that loads a model: a global twin
    add_flag(listing, None, "--models-dir", type=Path, default=Path(DEFAULT_MODELS_DIR),
             help="directory holding exported models")
    listing.set_defaults(handler=run_models_list)
    verify = actions.add_parser(
        "verify", help="re-check a model's file hashes against its manifest",
        description="Recompute the sha256 of the tokenizer files and every variant of NAME "
        "(with an OpenVINO IR's .bin) and compare them with manifest.json; exits 2 naming the "
        "first file that differs.",
        epilog=MODELS_EPILOG, formatter_class=HelpFormatter,
    )
    verify.add_argument("name", help="model name under --models-dir, or a model directory path")
    add_flag(verify, None, "--models-dir", type=Path, default=Path(DEFAULT_MODELS_DIR),
             help="directory holding exported models")
    verify.set_defaults(handler=run_models_verify)


def _variants(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in VARIANT_NAMES]
    if unknown or not names:
        raise ValueError(
            f"--variants must be a comma-separated subset of {','.join(VARIANT_NAMES)}, got {text!r}"
        )
    return names


# What `models list` shows per task: (manifest key, label, format), for the tuning part and the
# held-out part; a manifest that lacks one (written by hand, or by an older export) shows the rest.
_SUMMARY_METRICS = {
    "rerank": ([("max_abs_diff", "max|Δ|", ".2e"), ("spearman", "spearman", ".4f"),
                ("spearman_per_query_mean", "per-query", ".4f"), ("top10_overlap", "top10", ".3f")],
               [("spearman", "spearman", ".4f"), ("spearman_per_query_mean", "per-query", ".4f"),
                ("top10_overlap", "top10", ".3f")]),
    "embedding": ([("cosine_min", "cos_min", ".5f"), ("spearman", "spearman", ".4f")],
                  [("cosine_min", "cos_min", ".5f")]),
}


def _fidelity_summary(task: str, fidelity: dict[str, Any]) -> str:
    if not fidelity.get("validated", True):
        return "not validated on CPU (see manifest)"
    tuning, held_out = _SUMMARY_METRICS.get(task, _SUMMARY_METRICS["rerank"])
    parts = [f"{label} {fidelity[key]:{form}}" for key, label, form in tuning if key in fidelity]
    held = fidelity.get("held_out", {})
    held_parts = [f"{label} {held[key]:{form}}" for key, label, form in held_out if key in held]
    if held_parts:
        parts.append("held-out " + " ".join(held_parts))
    return "  ".join(parts) or "no fidelity metrics in the manifest"


def _spec_table(spec: ModelSpec) -> list[str]:
    lines = []
    for name in [name for name in VARIANT_NAMES if name in spec.variants]:
        variant = spec.variants[name]
        lines.append(f"  {name:<7} {variant.file:<17} {variant.size_bytes / 1e6:8.1f} MB  "
                     f"{_fidelity_summary(spec.task, variant.fidelity)}")
    # one line per variant asked for but left out, with its reason
    for name, failure in spec.failed_variants.items():
        lines.append(f"  {name:<7} left out ({failure.get('stage', 'failed')}): "
                     f"{failure.get('reason', 'no reason recorded')}")
    return lines


def _family_text(spec: ModelSpec) -> str:
    family = spec.family or {}
    if not family:
        return "family not recorded (exported before families)"
    text = f"family {family.get('name')} (model_type {family.get('model_type')})"
    rewrite = spec.graph_rewrites.get("cls_only_last_layer", {})
    if rewrite:
        text += ("  [CLS]-only last layer" if rewrite.get("applied")
                 else f"  full last layer: {rewrite.get('reason')}")
    return text


def run_export(args: argparse.Namespace) -> int:
    """Handler of `onnxrank export`."""
    from onnxrank.export.pipeline import ExportRequest, export_model
    from onnxrank.export.quantize import DEFAULT_INT8_RECIPES, Int8Settings

    if args.int8_per_tensor and args.int8_method == "auto":
        raise ValueError("--int8-per-tensor needs --int8-method dynamic or static; 'auto' tries "
                         "its own fixed recipes (see docs/export.md)")
    thresholds = FidelityThresholds(**{
        spec.name: getattr(args, spec.name) for spec in fields(FidelityThresholds)})
    request = ExportRequest(
        model=args.model,
        out_dir=args.out,
        task=args.task,
        max_length=args.max_length,
        opset=args.opset,
        variants=_variants(args.variants),
        thresholds=thresholds,
        int8=DEFAULT_INT8_RECIPES if args.int8_method == "auto" else (
            Int8Settings(method=args.int8_method, per_channel=not args.int8_per_tensor),),
        cls_only_last_layer=args.cls_only_last_layer,
        validation_pairs=args.validation_pairs,
        calibration_pairs=args.calibration_pairs,
        registry_path=args.registry,
        seed=args.seed,
        recipe=args.recipe,
        exporter=args.exporter,
    )
    result = export_model(request, show_progress=not args.quiet)
    if not args.quiet:
        print(f"exported {args.model} -> {result.model_dir} ({result.spec.task}, "
              f"max_length {result.spec.max_length}, {_family_text(result.spec)})")
        print("\n".join(_spec_table(result.spec)))
    return 0


def run_models_list(args: argparse.Namespace) -> int:
    """Handler of `onnxrank models list`."""
    directory = Path(args.models_dir)
    if not directory.is_dir():
        raise ValueError(f"--models-dir {directory} does not exist; export a model first "
                         "(onnxrank export --model minilm-standin)")
    found = 0
    for model_dir in sorted(path for path in directory.iterdir()
                            if path.is_dir() and (path / "manifest.json").is_file()):
        found += 1
        try:
            spec = load_model_spec(model_dir)
        except Exception as err:  # one broken manifest must not hide the others
            print(f"{model_dir.name}: unreadable manifest ({err})")
            continue
        trained = "" if spec.relevance_trained else "  [stand-in: not relevance-trained]"
        print(f"{model_dir.name}  {spec.task}  max_length {spec.max_length}  "
              f"source {spec.source.get('kind')}:{spec.source.get('model_id', spec.source.get('path'))}"
              f"{trained}")
        print(f"  {_family_text(spec)}")
        print("\n".join(_spec_table(spec)))
    if not found:
        print(f"no exported models under {directory} (directories with manifest.json)")
    return 0


def run_models_verify(args: argparse.Namespace) -> int:
    """Handler of `onnxrank models verify`."""
    candidate = Path(args.name)
    model_dir = candidate if candidate.is_dir() else Path(args.models_dir) / args.name
    spec = load_model_spec(model_dir)
    verify_files(spec, model_dir)
    count = (len(spec.variants) + len(spec.tokenizer_files) + 1
             + sum(len(variant.extra_files) for variant in spec.variants.values()))
    print(f"{spec.name}: {count} files match manifest.json ({', '.join(spec.variants)})")
    return 0
