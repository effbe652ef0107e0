"""Settings of the HTTP server (the engine's own settings live in onnxrank.engine.config)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def _option(help_text: str, minimum: float | None = None, *, kind: type = str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"help": help_text, "kind": kind}
    if minimum is not None:
        metadata["minimum"] = minimum
    return metadata


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """Every server setting, built once by `onnxrank serve` and passed to create_app and serve.

    The CLI generates one flag per field (``--max-queue``) with its environment twin
    (``ONNXRANK_SERVE_MAX_QUEUE``) and takes the help text from the field's metadata.
    """

    host: str = field(default=DEFAULT_HOST, metadata=_option(
        "interface to bind; 127.0.0.1 serves this machine only, 0.0.0.0 every interface"))
    port: int = field(default=DEFAULT_PORT, metadata=_option(
        "TCP port; 0 picks a free one", 0, kind=int))
    api_key: str | None = field(default=None, metadata=_option(
        "require 'Authorization: Bearer KEY' on every endpoint except /health; prefer the "
        "environment twin, since a flag shows in the process list"))
    batching: bool = field(default=True, metadata=_option(
        "merge concurrent requests into one engine run (off: one engine run per request)",
        kind=bool))
    batch_window_ms: float = field(default=2.0, metadata=_option(
        "how long the engine worker waits, counted from the oldest waiting request's arrival, "
        "for more requests to join a run: 2 ms adds at most 2 ms to a lone request, while under "
        "load the oldest request has already waited longer and the run starts at once", 0,
        kind=float))
    max_queue: int = field(default=16, metadata=_option(
        "requests waiting for the engine; one more gets 429 with Retry-After. The worker takes "
        "every waiting request into its next run, so an accepted request waits at most for the "
        "run in progress and then its own, each of at most this many requests: under overload, "
        "latency stays near that of as many concurrent clients. Raise it for more concurrent "
        "clients when their latency matters less than not being refused", 1, kind=int))
    max_documents: int = field(default=1000, metadata=_option(
        "documents per request (413 above it); a request larger than one batch is split into "
        "batches by the planner, this limit only bounds one request's share of the server", 1,
        kind=int))
    max_characters: int = field(default=2_000_000, metadata=_option(
        "characters per request, query and documents together (413 above it)", 1, kind=int))
    max_tokens: int | None = field(default=None, metadata=_option(
        "tokens per request as the model will see them (each pair truncated to max_length), "
        "counted before queueing (413 above it); unset: no token limit", 1, kind=int))
    max_request_bytes: int = field(default=16 * 1024 * 1024, metadata=_option(
        "size of a request body in bytes (413 above it)", 1, kind=int))
    default_deadline_ms: float | None = field(default=None, metadata=_option(
        "deadline of requests that set none (field deadline_ms or header X-Deadline-Ms); "
        "unset: requests wait as long as it takes", 1, kind=float))
    shutdown_timeout_s: float = field(default=30.0, metadata=_option(
        "after SIGTERM, how long queued and running requests may take to finish", 0,
        kind=float))

    def __post_init__(self) -> None:
        for spec in fields(self):
            minimum = spec.metadata.get("minimum")
            value = getattr(self, spec.name)
            if minimum is None or value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
                raise ValueError(f"{spec.name} must be a number >= {minimum}, got {value!r}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must be a non-empty string or None, got an empty string")
