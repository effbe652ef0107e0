"""The engine's LRU score cache."""

from __future__ import annotations

import threading
from collections import OrderedDict

Entry = tuple[float, "tuple[int, int] | None"]


class ScoreCache:
    """Thread-safe LRU of (score, span) keyed by model, settings, query and document."""

    def __init__(self, capacity: int, model_key: str) -> None:
        self.capacity = capacity
        self._model_key = model_key
        self._entries: OrderedDict[str, Entry] = OrderedDict()
        self._lock = threading.Lock()

    def key(self, query: str, document: str, instruction: str | None = None) -> str:
        # Length-prefixed fields: ("ab", "c") and ("a", "bc") must not collide. A decoder
        # reranker's instruction is part of its prompt, so of the key.
        fields = (self._model_key, query, document) if instruction is None else (
            self._model_key, instruction, query, document)
        return "".join(f"{len(field)}:{field}" for field in fields)

    def get(self, key: str) -> Entry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: str, value: Entry) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
