"""Random-weight cross-encoder checkpoints of every export family, built offline (no Hub).

Each family module says what its checkpoints are (``Family.checkpoint``, a
onnxrank.export.families.checkpoint_config.CheckpointConfig); this module only builds them.
``size="full"``: the family's published base configuration (copied from the Hub config.json of
the model it names), random weights: **speed only**, never relevance (the manifest says
``relevance_trained: false`` and the marker says "random weights: speed only").
``size="tiny"``: the same family at 2 layers and hidden 64, for tests.

Each checkpoint gets a tokenizer of its family's kind (WordPiece, byte-level BPE or a
sentencepiece-style Unigram; BERT's or RoBERTa's pair template), trained with the `tokenizers`
library on the shipped pair text (onnxrank/data), so token counts on English text are realistic.

Command line (what the bench's ``families`` scenario expects)::

    python -m onnxrank.bench.family_checkpoints --size full --out checkpoints/families --export

writes checkpoints/families/FAMILY and, with --export, models/FAMILY-random-reranker.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from onnxrank._optional import require
from onnxrank.export.families import families
from onnxrank.export.families.checkpoint_config import CheckpointConfig, TokenizerKind
from onnxrank.export.standin import STANDIN_MARKER

logger = logging.getLogger(__name__)

Size = Literal["tiny", "full"]
# the families that carry a checkpoint configuration (onnxrank.export.families, Family.checkpoint)
FAMILY_NAMES = tuple(family.name for family in families() if family.checkpoint is not None)
SPEED_ONLY = "random weights: speed only"
MODEL_SUFFIX = "-random-reranker"
TINY_SHAPE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 128, "initializer_range": 0.2}
TINY_VOCAB, FULL_VOCAB = 1000, 16000
# texts a tiny tokenizer trains on (seconds, not tens of seconds, per test session)
TINY_TEXTS = 1500
# the head's logits are rescaled to this standard deviation, so rankings are not float noise
HEAD_STD = 1.0


def checkpoint_config(name: str) -> CheckpointConfig:
    """The checkpoint configuration of the family called `name`.

    Raises:
        ValueError: No family of that name carries one.
    """
    for family in families():
        if family.name == name and family.checkpoint is not None:
            return family.checkpoint
    raise ValueError(f"family must be one of {', '.join(FAMILY_NAMES)}, got {name!r}")


def _texts() -> Iterator[str]:
    seen: set[str] = set()
    for name in ("validation_pairs.jsonl", "calibration_pairs.jsonl", "standin_head_pairs.jsonl"):
        for line in resources.files("onnxrank.data").joinpath(name).read_text("utf-8").splitlines():
            if not line.strip():
                continue
            row = json.loads(line)
            for text in (row["query"], row["passage"]):
                if text not in seen:
                    seen.add(text)
                    yield text


def build_tokenizer(kind: TokenizerKind, vocab_size: int, *, texts: int | None = None) -> Any:
    """A transformers fast tokenizer of `kind`, trained on the shipped pair text (the first
    `texts` distinct texts; None = all)."""
    tokenizers = require("tokenizers", extra="export")
    transformers = require("transformers", extra="export")
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = list(kind.special_tokens)
    unk = "<unk>" if kind.template == "roberta" else "[UNK]"
    if kind.model == "wordpiece":
        tokenizer = tokenizers.Tokenizer(models.WordPiece(unk_token=unk))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer: Any = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials)
    elif kind.model == "byte_bpe":
        tokenizer = tokenizers.Tokenizer(models.BPE(unk_token=unk))
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        tokenizer = tokenizers.Tokenizer(models.Unigram())
        tokenizer.normalizer = normalizers.NFKC()
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials,
                                          unk_token=unk)
    tokenizer.train_from_iterator(itertools.islice(_texts(), texts), trainer=trainer)

    def token(text: str) -> tuple[str, int]:
        return text, tokenizer.token_to_id(text)

    fast_class = getattr(transformers, kind.fast_class)
    if kind.template == "roberta":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
            special_tokens=[token("<s>"), token("</s>")])
        return fast_class(
            tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", sep_token="</s>",
            cls_token="<s>", unk_token="<unk>", pad_token="<pad>", mask_token="<mask>",
            model_max_length=512)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[token("[CLS]"), token("[SEP]")])
    extra = {} if kind.token_types else {"model_input_names": ["input_ids", "attention_mask"]}
    return fast_class(tokenizer_object=tokenizer, unk_token="[UNK]", sep_token="[SEP]",
                      pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]", **extra)


def build_config(checkpoint: CheckpointConfig, size: Size, tokenizer: Any, *,
                 max_position_embeddings: int | None = None) -> Any:
    """The transformers config of `checkpoint` at `size` (num_labels 1, ids from `tokenizer`)."""
    transformers = require("transformers", extra="export")
    values = dict(checkpoint.full)
    if size == "tiny":
        values.update(TINY_SHAPE, vocab_size=len(tokenizer))
        for key, value in checkpoint.tiny.items():
            if value is None:
                values.pop(key, None)
            else:
                values[key] = value
    if max_position_embeddings is not None:
        values["max_position_embeddings"] = max_position_embeddings
    ids = {"pad_token_id": tokenizer.pad_token_id,
           **{key: getattr(tokenizer, attribute)
              for key, attribute in checkpoint.special_ids.items()}}
    config = getattr(transformers, checkpoint.config_class)(num_labels=1, **values, **ids)
    config.architectures = [checkpoint.architecture]
    return config


def _spread_head(model: Any, tokenizer: Any) -> None:
    """Rescale the classifier's last projection so the logits of a few shipped pairs have
    standard deviation HEAD_STD (a random head's logits barely differ)."""
    torch = require("torch", extra="export")
    texts = list(_texts())[:64]
    batch = tokenizer(texts[0::2], texts[1::2], truncation=True, max_length=128, padding=True,
                      return_tensors="pt")
    with torch.inference_mode():
        logits = model(**batch).logits[:, 0]
    last = [module for module in model.modules() if isinstance(module, torch.nn.Linear)
            and module.out_features == 1][-1]
    scale = HEAD_STD / max(float(logits.std()), 1e-6)
    with torch.no_grad():
        last.weight.mul_(scale)
        if last.bias is not None:
            last.bias.zero_()


def build_family_checkpoint(family: str, out_dir: Path, *, size: Size = "tiny", seed: int = 0,
                            max_position_embeddings: int | None = None) -> Path:
    """Write a random-weight ``*ForSequenceClassification`` checkpoint of `family` to `out_dir`
    (save_pretrained of the model and of its fast tokenizer, plus the stand-in marker).

    Args:
        family: One of FAMILY_NAMES.
        size: ``tiny`` (tests) or ``full`` (the published base configuration; speed only).
        seed: torch seed of the weights.
        max_position_embeddings: Override the position limit (long-context tests).
    """
    checkpoint = checkpoint_config(family)
    if size not in ("tiny", "full"):
        raise ValueError(f"size must be 'tiny' or 'full', got {size!r}")
    torch = require("torch", extra="export")
    transformers = require("transformers", extra="export")
    tokenizer = (build_tokenizer(checkpoint.tokenizer, TINY_VOCAB, texts=TINY_TEXTS)
                 if size == "tiny" else build_tokenizer(checkpoint.tokenizer, FULL_VOCAB))
    config = build_config(checkpoint, size, tokenizer,
                          max_position_embeddings=max_position_embeddings)
    torch.manual_seed(seed)
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    _spread_head(model, tokenizer)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    marker = {"kind": "rerank", "family": family, "size": size, "seed": seed,
              "relevance_trained": False, "published_config_of": checkpoint.published_model,
              "note": f"{SPEED_ONLY}: {checkpoint.published_model}'s configuration with random "
                      "weights and a tokenizer trained on onnxrank/data"}
    (out_dir / STANDIN_MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n",
                                          encoding="utf-8")
    logger.info("built %s %s checkpoint in %s", size, family, out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """Build (and with --export, export) one checkpoint per family under --out."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=("tiny", "full"), default="full")
    parser.add_argument("--out", type=Path, required=True, help="checkpoints go to OUT/FAMILY")
    parser.add_argument("--models-dir", type=Path, default=Path("models"),
                        help=f"with --export: models go to MODELS_DIR/FAMILY{MODEL_SUFFIX}")
    parser.add_argument("--families", default=",".join(FAMILY_NAMES))
    parser.add_argument("--export", action="store_true",
                        help="also export each with onnxrank's export pipeline")
    parser.add_argument("--validation-pairs", type=int, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    for family in [name.strip() for name in args.families.split(",") if name.strip()]:
        checkpoint = args.out / family
        if not (checkpoint / "config.json").is_file():
            build_family_checkpoint(family, checkpoint, size=args.size)
        if args.export:
            from onnxrank.export.pipeline import ExportRequest, export_model

            result = export_model(ExportRequest(model=str(checkpoint),
                                                out_dir=args.models_dir / f"{family}{MODEL_SUFFIX}",
                                                validation_pairs=args.validation_pairs))
            print(f"{family}: {', '.join(result.spec.variants)}; left out: "
                  f"{json.dumps({k: v['reason'] for k, v in result.spec.failed_variants.items()})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
