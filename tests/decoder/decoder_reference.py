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
