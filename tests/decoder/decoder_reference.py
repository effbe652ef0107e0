"""The Qwen3-Reranker model card's scoring, written out independently of onnxrank: the test oracle.

transformers' tokenizer and causal LM, the card's prefix, user text and suffix tokenized apart and
joined, `truncation="longest_first"` to what the prefix and suffix leave of max_length, and
p(yes) = softmax([logit(no), logit(yes)])[1] at the last position. Each pair runs alone (batch of
one, no padding): the score a row must have whatever its batch mates.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import transformers

CARD_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the "
               "Query and the Instruct provided. Note that the answer can only be \"yes\" or "
               "\"no\".<|im_end|>\n<|im_start|>user\n")
CARD_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
CARD_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"


class ModelCardReranker:
    """Qwen3-Reranker's transformers recipe on a checkpoint directory."""

    def __init__(self, checkpoint: Path, max_length: int) -> None:
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
        self.model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint)).eval()
        self.max_length = max_length
        self.prefix = self.tokenizer.encode(CARD_PREFIX, add_special_tokens=False)
        self.suffix = self.tokenizer.encode(CARD_SUFFIX, add_special_tokens=False)
        self.yes = self.tokenizer.convert_tokens_to_ids("yes")
        self.no = self.tokenizer.convert_tokens_to_ids("no")

    def token_ids(self, query: str, document: str, instruction: str = CARD_INSTRUCTION) -> list[int]:
        text = f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
        body = self.tokenizer(text, truncation="longest_first", add_special_tokens=False,
                              max_length=self.max_length - len(self.prefix) - len(self.suffix))
        return self.prefix + body["input_ids"] + self.suffix

    def p_yes(self, pairs: list[tuple[str, str]], instruction: str = CARD_INSTRUCTION) -> np.ndarray:
        scores = []
        for query, document in pairs:
            ids = torch.tensor([self.token_ids(query, document, instruction)])
            with torch.inference_mode():
                logits = self.model(input_ids=ids).logits[0, -1]
            pair = torch.stack([logits[self.no], logits[self.yes]]).double()
            scores.append(float(torch.softmax(pair, dim=0)[1]))
        return np.asarray(scores)

    def score(self, pairs: list[tuple[str, str]], instruction: str | None = None) -> np.ndarray:
        """What the card reports: p(yes)."""
        return self.p_yes(pairs, instruction or CARD_INSTRUCTION)


def prepare_only_second(first: list[int], second: list[int], max_length: int) -> list[int]:
    """What both cards call, ``tokenizer.prepare_for_model(first, second,
    truncation="only_second", max_length=max_length, add_special_tokens=False)``, written out:
    transformers 5 removed prepare_for_model. transformers 4's truncate_sequences cut the second
    sequence's last tokens until the pair fit; a second sequence too short to absorb the excess
    was left whole (with a logged error)."""
    excess = len(first) + len(second) - max_length
    if 0 < excess < len(second):
        second = second[:-excess]
    return list(first) + list(second)


BGE_PROMPT = ("Given a query A and a passage B, determine whether the passage contains an answer "
              "to the query by providing a prediction of either 'Yes' or 'No'.")


class BgeGemmaCard:
    """bge-reranker-v2-gemma's code (FlagEmbedding, examples/inference/reranker/README.md:
    get_inputs): [bos] + "A: {query}" (3/4 of max_length) + "\\n" + "B: {passage}", cut to
    max_length with only_second, then "\\n" + prompt; score = logits[:, -1, id("Yes")], raw.
    The card's max_length leaves out the "\\n" + prompt it appends: `row_tokens` (the engine's
    max_length) minus those."""

    def __init__(self, checkpoint: Path, row_tokens: int) -> None:
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
        self.model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint)).eval()
        self.yes_loc = self.tokenizer("Yes", add_special_tokens=False)["input_ids"][0]
        self.max_length = row_tokens - sum(len(self.tokenizer(
            text, add_special_tokens=False)["input_ids"]) for text in ("\n", BGE_PROMPT))

    def token_ids(self, query: str, passage: str, prompt: str | None = None) -> list[int]:
        tokenizer, max_length = self.tokenizer, self.max_length
        prompt_inputs = tokenizer(prompt or BGE_PROMPT, return_tensors=None,
                                  add_special_tokens=False)["input_ids"]
        sep_inputs = tokenizer("\n", return_tensors=None, add_special_tokens=False)["input_ids"]
        query_inputs = tokenizer(f"A: {query}", return_tensors=None, add_special_tokens=False,
                                 max_length=max_length * 3 // 4, truncation=True)
        passage_inputs = tokenizer(f"B: {passage}", return_tensors=None,
                                   add_special_tokens=False, max_length=max_length,
                                   truncation=True)
        item = prepare_only_second([tokenizer.bos_token_id] + query_inputs["input_ids"],
                                   sep_inputs + passage_inputs["input_ids"], max_length)
        return item + sep_inputs + prompt_inputs

    def score(self, pairs: list[tuple[str, str]], instruction: str | None = None) -> np.ndarray:
        scores = []
        for query, passage in pairs:
            ids = torch.tensor([self.token_ids(query, passage, instruction)])
            with torch.inference_mode():
                scores.append(float(self.model(input_ids=ids).logits[0, -1, self.yes_loc]))
        return np.asarray(scores)


MXBAI_SYSTEM_PREFIX = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
                       "helpful assistant.<|im_end|>\n<|im_start|>user\n")
MXBAI_TASK = ("You are a search relevance expert who evaluates how well documents match search "
              "queries. For each query-document pair, carefully analyze the semantic relationship "
              "between them, then provide your binary relevance judgment (0 for not relevant, 1 "
              "for relevant).\nRelevance:")


class MxbaiCard:
    """mxbai-rerank-v2's code (mxbai_rerank/mxbai_rerank_v2.py, MxbaiRerankV2.prepare_inputs and
    forward): chat prefix + "[instruction: ...\\n]query: {query}" (3/4 of max_length) + "\\n" +
    "document: {document}" (cut with only_second to max_length) + "\\n" + task prompt + chat
    suffix; score = logit("1") - logit("0") at the last token, raw (normalize=False). The card's
    max_length leaves out its predefined_length: `row_tokens` (the engine's max_length) minus it."""

    def __init__(self, checkpoint: Path, row_tokens: int) -> None:
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(checkpoint))
        self.model = transformers.AutoModelForCausalLM.from_pretrained(str(checkpoint)).eval()
        self.yes_loc = self._ids("1")[0]
        self.no_loc = self._ids("0")[0]
        self.task = self._ids(MXBAI_TASK)
        self.sep = self._ids("\n")
        self.prefix = self._ids(MXBAI_SYSTEM_PREFIX)
        self.suffix = self._ids("<|im_end|>\n<|im_start|>assistant\n")
        self.max_length = row_tokens - len(self.prefix) - len(self.task) - len(self.suffix) \
            - len(self.sep)

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, return_tensors=None, add_special_tokens=False)["input_ids"])

    def token_ids(self, query: str, document: str, instruction: str | None = None) -> list[int]:
        query_prompt = f"query: {query}"
        if instruction:
            query_prompt = "".join([f"instruction: {instruction}", "\n", query_prompt])
        query_inputs = self.tokenizer(query_prompt, return_tensors=None, add_special_tokens=False,
                                      max_length=self.max_length * 3 // 4, truncation=True)
        document_inputs = self.tokenizer(f"document: {document}", return_tensors=None,
                                         add_special_tokens=False, max_length=self.max_length,
                                         truncation=True)
        item = prepare_only_second(query_inputs["input_ids"],
                                   self.sep + document_inputs["input_ids"], self.max_length)
        return self.prefix + item + self.sep + self.task + self.suffix

    def score(self, pairs: list[tuple[str, str]], instruction: str | None = None) -> np.ndarray:
        scores = []
        for query, document in pairs:
            ids = torch.tensor([self.token_ids(query, document, instruction)])
            with torch.inference_mode():
                logits = self.model(input_ids=ids).logits[0, -1]
            scores.append(float(logits[self.yes_loc] - logits[self.no_loc]))
        return np.asarray(scores)
