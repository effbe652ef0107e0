"""sentence-transformers 6 decoder rerankers saved by sentence-transformers itself: the tiny Qwen3
stand-in (onnxrank.export.decoder_standin) given a chat template, loaded as a CrossEncoder
(``Transformer(text-generation)`` + ``LogitScore``) and written with ``save_pretrained``, so
modules.json, sentence_bert_config.json, config_sentence_transformers.json and
1_LogitScore/config.json are what the library writes, not hand-made copies."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import transformers

# Qwen3-Reranker's prompt as a chat template of sentence-transformers' pair roles: the system
# message (CrossEncoder.predict's prompt) is the instruction, with the model card's default
QWEN3_RERANKER_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and "
    "the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
    "<|im_start|>user\n<Instruct>: {{ messages | selectattr(\"role\", \"eq\", \"system\") | "
    "map(attribute=\"content\") | first | default(\"Given a web search query, retrieve relevant "
    "passages that answer the query\") }}\n"
    "<Query>: {{ messages | selectattr(\"role\", \"eq\", \"query\") | map(attribute=\"content\") "
    "| first }}\n"
    "<Document>: {{ messages | selectattr(\"role\", \"eq\", \"document\") | "
    "map(attribute=\"content\") | first }}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
# a template that writes an instruction line only when there is a system message
OPTIONAL_INSTRUCTION_TEMPLATE = (
    "{% for message in messages %}{% if message.role == 'system' %}Instruction: "
    "{{ message.content }}\n{% endif %}{% endfor %}"
    "{% for message in messages %}{% if message.role == 'query' %}<|im_start|>user\nQuery: "
    "{{ message.content }}\n{% elif message.role == 'document' %}Document: {{ message.content }}"
    "<|im_end|>\n{% endif %}{% endfor %}<|im_start|>assistant\n")
# a ChatML template of structured messages (content as [{"type": "text", "text": ...}]), its
# system turn only when there is a system message
STRUCTURED_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'system' %}<|im_start|>system\n"
    "{{ m.content[0].text }}<|im_end|>\n{% elif m.role == 'query' %}<|im_start|>user\nQ: "
    "{{ m.content[0].text }}\n{% elif m.role == 'document' %}D: {{ m.content[0].text }}"
    "<|im_end|>\n{% endif %}{% endfor %}<|im_start|>assistant\n")
# a template that ignores the system message: no recipe can place an instruction
NO_SYSTEM_TEMPLATE = (
    "{% for message in messages %}{% if message.role in ('query', 'document') %}"
    "{{ message.role }}: {{ message.content }}\n{% endif %}{% endfor %}answer:")


def build_st_reranker(base: Path, out: Path, *, chat_template: str | None = QWEN3_RERANKER_TEMPLATE,
                      false_token: str | None = "no", activation: Any = None,
                      prompts: dict[str, str] | None = None,
                      default_prompt_name: str | None = None) -> Path:
    """Save `base` (a causal-LM checkpoint) as a sentence-transformers CrossEncoder in `out`.

    Args:
        chat_template: The tokenizer's chat template (None: none, pairs tokenized as text pairs).
        false_token: LogitScore's false token (None: the score reads "yes" alone).
        activation: The CrossEncoder's activation_fn (None: sentence-transformers' Sigmoid).
        prompts: CrossEncoder prompts, and the one used by default.
    """
    from sentence_transformers import CrossEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.cross_encoder.modules import LogitScore

    source = out.with_name(out.name + "-source")
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(base, source)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(source))
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(str(source))
    transformer = Transformer(str(source), transformer_task="text-generation")
    vocab = transformer.tokenizer
    score = LogitScore(true_token_id=vocab.convert_tokens_to_ids("yes"),
                       false_token_id=None if false_token is None
                       else vocab.convert_tokens_to_ids(false_token))
    model = CrossEncoder(modules=[transformer, score], device="cpu", activation_fn=activation,
                         prompts=prompts, default_prompt_name=default_prompt_name)
    model.save_pretrained(str(out))
    shutil.rmtree(source)
    return out
