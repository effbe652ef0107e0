"""Tiny random ColBERT checkpoints in the layouts the Hub carries, built offline.

* ``pylate_bert``: PyLate / sentence-transformers layout (``modules.json``, the Transformer at the
  root, ``1_Dense/`` without bias, ``config_sentence_transformers.json`` with the PyLate keys),
  a WordPiece tokenizer with [unused0] / [unused1] markers and a punctuation skiplist.
* ``pylate_modernbert``: the same layout on ModernBERT with its own byte-level BPE tokenizer,
  added "[Q] " / "[D] " markers, two Dense projections and do_query_expansion false.
* ``stanford_bert``: Stanford ``HF_ColBERT`` (``linear.weight`` beside the encoder weights,
  ``artifact.metadata``).
* ``multi_vector_bert``: sentence-transformers 6's own save (``MultiVectorEncoder.save``) of a
  stack built with its modules: Transformer with fixed, attended query expansion, a Dense with
  bias, MultiVectorMask with a punctuation skiplist, Normalize; [unused0] / [unused1] as
  prompts (prepended as text: one token each, as special tokens of the tokenizer).

Hidden 32, 2 layers: each builds in about a second.
"""

from __future__ import annotations

import json
import string
import tempfile
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import save_file

from onnxrank.bench.family_checkpoints import build_tokenizer
from onnxrank.export.families.checkpoint_config import BERT_SPECIAL_TOKENS, TokenizerKind

SHAPE: dict[str, Any] = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 64, "initializer_range": 0.2}
QUERY_LENGTH, DOCUMENT_LENGTH = 16, 48
LAYOUTS = ("pylate_bert", "pylate_modernbert", "stanford_bert", "multi_vector_bert")


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _dense(out_dir: Path, name: str, weight: torch.Tensor) -> dict[str, Any]:
    """A PyLate ``Dense`` module directory (no bias, identity activation)."""
    _write_json(out_dir / name / "config.json", {
        "in_features": int(weight.shape[1]), "out_features": int(weight.shape[0]), "bias": False,
        "activation_function": "torch.nn.modules.linear.Identity", "use_residual": False})
    save_file({"linear.weight": weight.contiguous()}, str(out_dir / name / "model.safetensors"))
    return {"name": name.split("_")[0], "path": name, "type": "pylate.models.Dense.Dense"}


def _pylate_files(out_dir: Path, denses: list[dict[str, Any]], settings: dict[str, Any]) -> None:
    """PyLate's modules.json (the Transformer at the root, then `denses`), its
    sentence_bert_config.json and config_sentence_transformers.json with `settings`."""
    _write_json(out_dir / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        *({"idx": index, **dense} for index, dense in enumerate(denses, 1))])
    _write_json(out_dir / "sentence_bert_config.json",
                {"max_seq_length": DOCUMENT_LENGTH - 1, "do_lower_case": False})
    _write_json(out_dir / "config_sentence_transformers.json", {
        **settings, "query_length": QUERY_LENGTH, "document_length": DOCUMENT_LENGTH,
        "attend_to_expansion_tokens": False, "skiplist_words": list(string.punctuation),
        "similarity_fn_name": "MaxSim", "__version__": {"pylate": "1.1.7"}})


def _bert(seed: int) -> tuple[Any, Any]:
    """A WordPiece tokenizer with [unused0] / [unused1] and a random BertModel over it."""
    torch.manual_seed(seed)
    kind = TokenizerKind("wordpiece", (*BERT_SPECIAL_TOKENS, "[unused0]", "[unused1]"), "bert",
                         "BertTokenizerFast")
    tokenizer = build_tokenizer(kind, 600, texts=600)
    config = transformers.BertConfig(vocab_size=len(tokenizer), max_position_embeddings=128,
                                     pad_token_id=tokenizer.pad_token_id, **SHAPE)
    return tokenizer, transformers.BertModel(config).eval()


def build_pylate_bert(out_dir: Path, *, seed: int = 0) -> Path:
    tokenizer, model = _bert(seed)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    _pylate_files(out_dir, [_dense(out_dir, "1_Dense", torch.randn(16, 32) * 0.3)],
                  {"query_prefix": "[unused0]", "document_prefix": "[unused1]",
                   "do_query_expansion": True})
    return out_dir


def build_pylate_modernbert(out_dir: Path, *, seed: int = 1) -> Path:
    torch.manual_seed(seed)
    kind = TokenizerKind("byte_bpe", BERT_SPECIAL_TOKENS, "bert", "PreTrainedTokenizerFast",
                         token_types=False)
    tokenizer = build_tokenizer(kind, 600, texts=600)
    tokenizer.add_tokens(["[Q] ", "[D] "])
    config = transformers.ModernBertConfig(
        vocab_size=len(tokenizer), max_position_embeddings=128, global_attn_every_n_layers=2,
        local_attention=16, pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id, **SHAPE)
    model = transformers.ModernBertModel(config).eval()
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    _pylate_files(out_dir, [_dense(out_dir, "1_Dense", torch.randn(24, 32) * 0.3),
                            _dense(out_dir, "2_Dense", torch.randn(12, 24) * 0.3)],
                  {"query_prefix": "[Q] ", "document_prefix": "[D] ",
                   "do_query_expansion": False})
    return out_dir


def build_stanford_bert(out_dir: Path, *, seed: int = 2) -> Path:
    tokenizer, model = _bert(seed)
    weights = {f"bert.{name}": tensor.contiguous() for name, tensor in model.state_dict().items()}
    weights["linear.weight"] = torch.randn(16, 32) * 0.3
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(out_dir / "model.safetensors"))
    config = model.config.to_dict()
    config["architectures"] = ["HF_ColBERT"]
    _write_json(out_dir / "config.json", config)
    tokenizer.save_pretrained(str(out_dir))
    _write_json(out_dir / "artifact.metadata", {
        "query_token_id": "[unused0]", "doc_token_id": "[unused1]",
        "query_maxlen": QUERY_LENGTH, "doc_maxlen": DOCUMENT_LENGTH,
        "attend_to_mask_tokens": True, "mask_punctuation": True, "dim": 16,
        "similarity": "cosine"})
    return out_dir


def build_multi_vector_bert(out_dir: Path, *, seed: int = 3) -> Path:
    from sentence_transformers import MultiVectorEncoder
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.base.modules.dense import Dense
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    tokenizer, model = _bert(seed)
    with tempfile.TemporaryDirectory() as backbone:
        model.save_pretrained(backbone)
        tokenizer.save_pretrained(backbone)
        transformer = Transformer(backbone, document_length=DOCUMENT_LENGTH - 8, query_expansion={
            "strategy": "fixed", "attend": True, "length": QUERY_LENGTH})
        dense = Dense(32, 16, bias=True, activation_function=torch.nn.Identity(),
                      module_input_name="token_embeddings")
        with torch.no_grad():
            dense.linear.weight.copy_(torch.randn(16, 32) * 0.3)
            dense.linear.bias.copy_(torch.randn(16) * 0.1)
        MultiVectorEncoder(
            modules=[transformer, dense, MultiVectorMask(list(string.punctuation)),
                     Normalize(module_input_name="token_embeddings")],
            prompts={"query": "[unused0]", "document": "[unused1]"}, device="cpu",
        ).save(str(out_dir))
    return out_dir


BUILDERS = {"pylate_bert": build_pylate_bert, "pylate_modernbert": build_pylate_modernbert,
            "stanford_bert": build_stanford_bert, "multi_vector_bert": build_multi_vector_bert}


def reference_model(directory: Path) -> Any:
    """sentence-transformers' MultiVectorEncoder of a checkpoint (its legacy PyLate / Stanford
    loaders)."""
    from sentence_transformers import MultiVectorEncoder

    return MultiVectorEncoder(str(directory), device="cpu", local_files_only=True)
