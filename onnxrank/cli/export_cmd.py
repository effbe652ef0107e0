"""`onnxrank export` and `onnxrank models list|verify`: build and inspect model directories."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from onnxrank.cli.common import HelpFormatter, env_default
from onnxrank.engine.spec import VARIANT_NAMES, ModelSpec, load_model_spec, verify_files

logger = logging.getLogger(__name__)

# Kept here rather than imported from onnxrank.export so that `onnxrank --help` and
# `onnxrank models ...` work without the export extra (torch, transformers) installed.
DEFAULT_MODEL = "cross-encoder/ms-marco-MiniLM-L-6-v2"
DEFAULT_OPSET = 17

EXPORT_EPILOG = """examples:
  onnxrank export --model minilm-standin                   # offline stand-in -> models/minilm-standin
  onnxrank export --model minilm-embedder --task embedding # -> models/minilm-embedder
  onnxrank export --model cross-encoder/ms-marco-MiniLM-L-6-v2 --out models/ms-marco-minilm-l6
  onnxrank export --model ./my-checkpoint --variants fp32,int8 --int8-min-spearman 0.97
"""
MODELS_EPILOG = """examples:
  onnxrank models list
  onnxrank models verify minilm-standin
"""
THRESHOLD_FLAGS = (
    ("fp32-max-abs-diff", 1e-3, "largest |score difference| allowed for model.onnx"),
    ("opt-max-abs-diff", 1e-3, "largest |score difference| allowed for model_opt.onnx"),
    ("int8-min-spearman", 0.98, "lowest Spearman correlation allowed for model_int8.onnx (rerank)"),
    ("int8-min-top10-overlap", 0.9,
     "lowest mean top-10 overlap per query allowed for model_int8.onnx (rerank)"),
    ("fp16-max-abs-diff", 5e-2,
     "largest |score difference| for model_fp16.onnx, checked when the CPU can run it"),
    ("embedding-min-cosine", 0.999,
     "lowest per-text cosine to the reference for fp32/opt/fp16 embedding variants"),
    ("int8-min-cosine", 0.98, "lowest per-text cosine for the int8 embedding variant"),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `export` and `models` to the top-level parser."""
    export = subparsers.add_parser(
        "export",
        help="export a cross-encoder or embedding model to ONNX (fp32, opt, int8, fp16) and validate it",
        description="Export MODEL to ONNX variants, validate each against the PyTorch reference on "
        "the shipped validation pairs, and write models/NAME/ with manifest.json. Needs the export "
        'extra: pip install "onnxrank[export]" (plus "onnxrank[standin]" for the stand-ins).',
        epilog=EXPORT_EPILOG,
        formatter_class=HelpFormatter,
    )
    export.add_argument("--model", default=env_default("model", DEFAULT_MODEL),
                        help="Hugging Face Hub id, registry name (see --registry) or local checkpoint "
                        "directory (env ONNXRANK_MODEL)")
    export.add_argument("--out", type=Path, default=env_default("out", None),
                        help="output model directory; default models/NAME (env ONNXRANK_OUT)")
    export.add_argument("--task", choices=("rerank", "embedding"), default=env_default("task", None),
                        help="rerank (one relevance logit) or embedding (pooled, normalised vectors); "
                        "default: from the registry, else rerank (env ONNXRANK_TASK)")
    export.add_argument("--max-length", type=int, default=env_default("max-length", None),
                        help="tokens per row recorded in the manifest; default 512 for rerankers, the "
                        "sentence-transformers max_seq_length for embedders (env ONNXRANK_MAX_LENGTH)")
    export.add_argument("--opset", type=int, default=env_default("opset", DEFAULT_OPSET),
                        help="ONNX opset (env ONNXRANK_OPSET)")
    export.add_argument("--variants", default=env_default("variants", ",".join(VARIANT_NAMES)),
                        help="comma-separated variants to write (env ONNXRANK_VARIANTS)")
    export.add_argument("--int8-method", choices=("auto", "dynamic", "static"),
                        default=env_default("int8-method", "auto"),
                        help="int8 quantization: auto tries dynamic per-channel on all ops, then with "
                        "the feed-forward up-projections of the top 1, 2, 3, 6, 12 layers in fp32, "
                        "then on attention and embeddings only, keeping the first that meets the "
                        "thresholds; "
                        "dynamic or static (QDQ calibrated on the validation pairs) use exactly that "
                        "recipe on all ops; see docs/export.md (env ONNXRANK_INT8_METHOD)")
    export.add_argument("--int8-per-tensor", action="store_true",
                        default=env_default("int8-per-tensor", "") == "1",
                        help="with --int8-method dynamic/static: one weight scale per tensor instead "
                        "of per output channel (env ONNXRANK_INT8_PER_TENSOR=1)")
    export.add_argument("--validation-pairs", type=int, default=env_default("validation-pairs", None),
                        help="validate on about N pairs (whole query groups) instead of all 320; for "
                        "quick trial runs (env ONNXRANK_VALIDATION_PAIRS)")
    export.add_argument("--registry", type=Path,
                        default=env_default("registry", "models/registry.json"),
                        help="model registry JSON (env ONNXRANK_REGISTRY)")
    export.add_argument("--seed", type=int, default=env_default("seed", 0),
                        help="seed for stand-in weights and head fitting (env ONNXRANK_SEED)")
    for flag, default, text in THRESHOLD_FLAGS:
        export.add_argument(f"--{flag}", type=float, default=env_default(flag, default),
                            help=f"{text} (env ONNXRANK_{flag.upper().replace('-', '_')})")
    export.add_argument("--quiet", action="store_true", default=env_default("quiet", "") == "1",
                        help="no progress bar and no summary table (env ONNXRANK_QUIET=1)")
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
    listing.add_argument("--models-dir", type=Path, default=env_default("models-dir", "models"),
                         help="directory holding exported models (env ONNXRANK_MODELS_DIR)")
    listing.set_defaults(handler=run_models_list)
    verify = actions.add_parser(
        "verify", help="re-check a model's file hashes against its manifest",
        description="Recompute the sha256 of the tokenizer files and every variant of NAME and "
        "compare them with manifest.json; exits 2 naming the first file that differs.",
        epilog=MODELS_EPILOG, formatter_class=HelpFormatter,
    )
    verify.add_argument("name", help="model name under --models-dir, or a model directory path")
    verify.add_argument("--models-dir", type=Path, default=env_default("models-dir", "models"),
                        help="directory holding exported models (env ONNXRANK_MODELS_DIR)")
    verify.set_defaults(handler=run_models_verify)


def _variants(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in VARIANT_NAMES]
    if unknown or not names:
        raise ValueError(
            f"--variants must be a comma-separated subset of {','.join(VARIANT_NAMES)}, got {text!r}"
        )
    return names


def _fidelity_summary(task: str, fidelity: dict[str, Any]) -> str:
    if not fidelity.get("validated", True):
        return "not validated on CPU (see manifest)"
    if task == "embedding":
        return f"cos_min {fidelity['cosine_min']:.5f}  spearman {fidelity['spearman']:.4f}"
    return (f"max|Δ| {fidelity['max_abs_diff']:.2e}  spearman {fidelity['spearman']:.4f}  "
            f"top10 {fidelity['top10_overlap']:.3f}")


def _spec_table(spec: ModelSpec) -> list[str]:
    lines = []
    for name in [name for name in VARIANT_NAMES if name in spec.variants]:
        variant = spec.variants[name]
        lines.append(f"  {name:<5} {variant.file:<17} {variant.size_bytes / 1e6:8.1f} MB  "
                     f"{_fidelity_summary(spec.task, variant.fidelity)}")
    return lines


def run_export(args: argparse.Namespace) -> int:
    """Handler of `onnxrank export`."""
    from onnxrank.export.pipeline import ExportRequest, export_model
    from onnxrank.export.quantize import DEFAULT_INT8_RECIPES, Int8Settings
    from onnxrank.export.validate import FidelityThresholds

    if args.int8_per_tensor and args.int8_method == "auto":
        raise ValueError("--int8-per-tensor needs --int8-method dynamic or static; 'auto' tries "
                         "its own fixed recipes (see docs/export.md)")
    thresholds = FidelityThresholds(**{
        flag.replace("-", "_"): getattr(args, flag.replace("-", "_")) for flag, _, _ in THRESHOLD_FLAGS
    })
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
        validation_pairs=args.validation_pairs,
        registry_path=args.registry,
        seed=args.seed,
    )
    result = export_model(request, show_progress=not args.quiet)
    if not args.quiet:
        print(f"exported {args.model} -> {result.model_dir} ({result.spec.task}, "
              f"max_length {result.spec.max_length})")
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
    count = len(spec.variants) + len(spec.tokenizer_files) + 1
    print(f"{spec.name}: {count} files match manifest.json ({', '.join(spec.variants)})")
    return 0
