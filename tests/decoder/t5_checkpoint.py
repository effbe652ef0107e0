"""A tiny random T5ForConditionalGeneration (d_model 32, 2 layers) with a SentencePiece-style
Unigram vocabulary trained here on the shipped pairs, saved through transformers' T5 tokenizer
(Metaspace, ``</s>`` appended), so "▁true" / "▁false" and "▁yes" / "▁no" are single tokens: the
monoT5 and mT5 mMARCO answer tokens. Weights random (not a relevance model)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import transformers
from built_once import built_once
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from onnxrank.export.decoder_standin import _training_text
from onnxrank.export.standin import STANDIN_MARKER

SPECIAL = ("<pad>", "</s>", "<unk>")  # T5's ids 0, 1, 2
ANSWER_WORDS = ("true", "false", "yes", "no")
# recipe -> (model_type, initializer_factor, answer tokens): the factor gives the random model's
# p(true) some spread (T5 scales its decoder output by d_model ** -0.5; mT5 does not)
CASES = {"monot5": ("t5", 1.5, ("▁true", "▁false")),
         "mt5-mmarco": ("mt5", 1.0, ("▁yes", "▁no"))}


def unigram_vocabulary(vocab_size: int = 800) -> list[tuple[str, float]]:
    """(piece, log-probability) pairs of a Unigram model trained on the shipped pairs, plus each
    answer word as one piece (as likely as the likeliest trained piece) where training kept none."""
    trainer_model = Tokenizer(models.Unigram())
    trainer_model.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)])
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL),
                                      unk_token="<unk>", show_progress=False)
    lines = _training_text()
    trainer_model.train_from_iterator(lines, trainer=trainer)
    vocab = [(piece, float(score)) for piece, score in
             json.loads(trainer_model.to_str())["model"]["vocab"]]
    pieces = {piece for piece, _ in vocab}
    best = max(score for piece, score in vocab if piece not in SPECIAL)
    return vocab + [(f"▁{word}", best) for word in ANSWER_WORDS if f"▁{word}" not in pieces]


def build_t5_checkpoint(out_dir: Path, *, seed: int = 0, model_type: str = "t5",
                        initializer_factor: float = 1.0) -> Path:
    """A tiny random T5 (or mT5: `model_type` "mt5", untied head) with its own Unigram
    tokenizer in `out_dir`."""
    tokenizer = transformers.T5Tokenizer(vocab=unigram_vocabulary(), extra_ids=0,
                                         model_max_length=512)
    for word in ANSWER_WORDS:
        ids = tokenizer(word, add_special_tokens=False).input_ids
        if ids != [tokenizer.convert_tokens_to_ids(f"▁{word}")]:
            raise RuntimeError(f"{word!r} encodes to {ids}, not the single piece ▁{word}")
    config_class, model_class = {
        "t5": (transformers.T5Config, transformers.T5ForConditionalGeneration),
        "mt5": (transformers.MT5Config, transformers.MT5ForConditionalGeneration)}[model_type]
    config = config_class(
        vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
        relative_attention_num_buckets=8, relative_attention_max_distance=32,
        feed_forward_proj="relu" if model_type == "t5" else "gated-gelu",
        tie_word_embeddings=model_type == "t5", pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0, initializer_factor=initializer_factor,
        architectures=[model_class.__name__])
    torch.manual_seed(seed)
    model = model_class(config).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out_dir))
    model.save_pretrained(str(out_dir))
    marker = {"builder": f"tests/decoder/t5_checkpoint.py ({model_class.__name__})",
              "size": "tiny", "seed": seed, "relevance_trained": False,
              "weights": "random; NOT a relevance model", "shape": "tiny",
              "tokenizer": f"{len(tokenizer)} Unigram pieces"}
    (out_dir / STANDIN_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    return out_dir


def built_tiny_checkpoint(factory: pytest.TempPathFactory, recipe: str) -> Path:
    """The tiny checkpoint of `recipe` (CASES), built once per test run."""
    model_type, factor, _ = CASES[recipe]
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return built_once(factory, f"checkpoints/{model_type}-tiny", lambda directory:
                      build_t5_checkpoint(directory, model_type=model_type,
                                          initializer_factor=factor))


class MonoT5Reference:
    """pygaggle's / the rerankers library's monoT5 on a checkpoint: the text
    ``Query: {q} Document: {d} Relevant:`` tokenized whole by the checkpoint's tokenizer (which
    appends ``</s>``), one decoder step from ``decoder_start_token_id``, the probability of the
    first answer token in a softmax over the two; nothing cut. Pairs run in right-padded batches
    with their attention mask, as pygaggle batches them."""

    def __init__(self, checkpoint: Path, answers: tuple[str, str]) -> None:
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
        self.model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(checkpoint)).eval()
        self.answer_ids = self.tokenizer.convert_tokens_to_ids(list(answers))

    def token_ids(self, query: str, document: str) -> list[int]:
        return list(self.tokenizer(f"Query: {query} Document: {document} Relevant:").input_ids)

    def score(self, pairs: list[tuple[str, str]], batch_size: int = 16) -> list[float]:
        scores: list[float] = []
        for first in range(0, len(pairs), batch_size):
            batch = self.tokenizer([f"Query: {query} Document: {document} Relevant:"
                                    for query, document in pairs[first:first + batch_size]],
                                   padding=True, return_tensors="pt")
            start = torch.full((len(batch.input_ids), 1), self.model.config.decoder_start_token_id)
            with torch.inference_mode():
                logits = self.model(**batch, decoder_input_ids=start).logits[:, 0]
            scores += torch.softmax(logits[:, self.answer_ids], dim=1)[:, 0].tolist()
        return scores
