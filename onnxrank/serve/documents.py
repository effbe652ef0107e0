"""Token-aware changes to a request's documents before they are queued (needs the tokenizer).

Only requests that ask for them pay for them: Cohere v2's ``max_tokens_per_doc``, TEI's
``truncate: false`` and ``truncation_direction: "Left"``, and the server's ``--max-tokens`` limit.
The engine itself truncates every pair to max_length on the right, document side first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from onnxrank.serve.parsing import RequestError, RerankCall

if TYPE_CHECKING:
    from onnxrank.engine.reranker import Reranker


def needs_tokens(call: RerankCall, max_tokens: int | None) -> bool:
    """True when `call` must be tokenized before queueing."""
    return bool(call.documents) and (
        call.max_tokens_per_doc is not None or call.truncate_left or not call.truncate
        or max_tokens is not None)


def prepare_documents(call: RerankCall, reranker: Reranker, *,
                      max_tokens: int | None) -> RerankCall:
    """Apply `call`'s token options and check the server's token limit, counting each pair's
    fixed tokens too (special tokens, or a decoder's prompt with the call's instruction).

    1. ``max_tokens_per_doc``: documents longer than that are cut to their first n tokens.
    2. ``truncate`` false (TEI): a pair longer than `max_length` is a 422, as TEI answers it.
    3. ``truncate_left`` (TEI): documents that do not fit beside the query keep their end.
    4. `max_tokens`: the tokens the model will see (each pair capped at `max_length`) above it
       are a 413 naming the limit.

    Raises:
        RequestError: Cases 2 and 4.
    """
    tokenizer = reranker.tokenizer
    budget = reranker.row_budget(call.instruction)  # the engine's own row arithmetic
    max_length = budget.max_length
    query_tokens = len(tokenizer.encode(call.query, add_special_tokens=False).ids)
    documents = list(call.documents)
    encodings = tokenizer.encode_batch(documents, add_special_tokens=False)
    if call.max_tokens_per_doc is not None:
        limit = call.max_tokens_per_doc
        for index, encoding in enumerate(encodings):
            if len(encoding.ids) > limit:
                documents[index] = documents[index][: encoding.offsets[limit - 1][1]]
                encodings[index] = tokenizer.encode(documents[index], add_special_tokens=False)
    lengths = [budget.row_tokens(query_tokens, len(encoding.ids)) for encoding in encodings]
    if not call.truncate:
        for index, length in enumerate(lengths):
            if length > max_length:
                raise RequestError(
                    422, f"Input validation error: `inputs` must have less than {max_length} "
                         f"tokens. Given: {length} (texts[{index}] with the query); send "
                         "\"truncate\": true to cut it")
    if call.truncate_left:
        room = budget.document_room(query_tokens)
        for index, encoding in enumerate(encodings):
            if len(encoding.ids) > room > 0:
                documents[index] = documents[index][encoding.offsets[len(encoding.ids) - room][0]:]
    if max_tokens is not None:  # the rows the engine will run, counted by its own encoder
        total = sum(reranker.row_lengths([(call.query, document) for document in documents],
                                         call.instruction))
        if total > max_tokens:
            raise RequestError(
                413, f"the request is {total} tokens as the model sees them (each pair capped at "
                     f"{max_length}), more than this server's limit of {max_tokens} "
                     "(--max-tokens); split the request")
    return replace(call, documents=documents)
