"""``POST /v1/search``: the hybrid retriever over the index opened at start, read-only.

The answer is ``SearchResult.to_dict()``, the payload of ``onnxrank query --json`` (every hit
with its stage ranks and scores, the timings and the notes). The search runs on the threads of
the server's SearchService (search_service.py). With ``rerank`` true the fused candidates are
reranked by a served rerank model (``model``; default the first) through that model's queue and
engine worker, like a ``/v1/rerank`` request: concurrent searches share engine runs, and a full
queue answers 429. ``deadline_ms`` is that stage's time budget: candidates not scored within it
keep the fused order (``reranked: false``).

With ``cascade`` (a list of ``{"model": ID, "keep": N}``, cheapest first) the rerank stage is a
CascadeReranker over those served models, ``deadline_ms`` its whole budget; a late-interaction
model whose document vectors the index stores reads them instead of encoding the documents.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from onnxrank.retrieval.results import MODES
from onnxrank.serve.errors import Dialect, RequestError
from onnxrank.serve.parsing import optional_field, parse_deadline, read_payload

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from onnxrank.serve.config import ServeConfig
    from onnxrank.serve.state import ServerState

SEARCH_PATH = "/v1/search"
# Optional body fields passed to search_detailed as they are, with their JSON type; a field the
# client leaves out keeps the library's default.
PASSED_FIELDS: dict[str, type] = {"depth": int, "rerank_top_n": int, "fusion": str,
                                  "rrf_k": int, "fusion_weight": float}


def parse_search(payload: Mapping[str, Any], headers: Mapping[str, str],
                 config: ServeConfig) -> tuple[str, dict[str, Any], str | None]:
    """The query, the search_detailed options and the rerank model id of a search body.

    Raises:
        RequestError: 422 naming the field.
    """
    if "query" not in payload:
        raise RequestError(422, "missing field `query`: a non-empty string is required",
                           param="query")
    query = payload["query"]
    if not isinstance(query, str) or not query.strip():
        raise RequestError(422, f"field `query` must be a non-empty string, got "
                                f"{json.dumps(query)[:40]}", param="query")
    options: dict[str, Any] = {}
    k = optional_field(payload, "k", int)
    if k is not None:
        options["k"] = k
    mode = payload.get("mode", "hybrid")
    if mode not in MODES:
        raise RequestError(422, f"field `mode` must be one of {', '.join(MODES)}, got "
                                f"{json.dumps(mode)[:40]}", param="mode")
    options["mode"] = mode
    filters = payload.get("filters")
    if filters is not None and not isinstance(filters, dict):
        raise RequestError(422, "field `filters` must be a JSON object such as "
                                '{"topic": "aero", "year": {"gte": 1960}}, got '
                                f"{json.dumps(filters)[:40]}", param="filters")
    options["filters"] = filters
    for name, kind in PASSED_FIELDS.items():
        value = payload.get(name)
        if value is None:
            continue
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        options[name] = optional_field({name: value}, name, kind)
    options["rerank"] = bool(optional_field(payload, "rerank", bool))
    deadline_ms, on_deadline = parse_deadline(payload, headers, config)
    if on_deadline != "error":
        raise RequestError(422, "field `on_deadline` does not apply to /v1/search: candidates the "
                                "rerank stage could not score within `deadline_ms` always keep "
                                "the fused order (reranked: false); omit it",
                           param="on_deadline")
    if options["rerank"]:
        options["rerank_deadline_ms"] = deadline_ms
    elif "rerank_top_n" in options:
        raise RequestError(422, "field `rerank_top_n` needs \"rerank\": true", param="rerank_top_n")
    return query, options, optional_field(payload, "model", str)


def parse_cascade(payload: Mapping[str, Any], rerank: bool,
                  model_id: str | None) -> list[tuple[str, int | None]]:
    """(model id, keep) of each stage of the body's ``cascade``; [] without one.

    Raises:
        RequestError: 422 naming the field.
    """
    stages = payload.get("cascade")
    if stages is None:
        return []
    example = '[{"model": "colbert", "keep": 50}, {"model": "minilm"}]'
    if not isinstance(stages, list) or not stages:
        raise RequestError(422, f"field `cascade` must be a non-empty list of stages such as "
                                f"{example}, got {json.dumps(stages)[:40]}", param="cascade")
    if not rerank:
        raise RequestError(422, "field `cascade` needs \"rerank\": true", param="cascade")
    if model_id is not None:
        raise RequestError(422, "fields `cascade` and `model` exclude each other: the cascade "
                                "names its models", param="cascade")
    parsed: list[tuple[str, int | None]] = []
    for stage in stages:
        model, keep = (stage.get("model"), stage.get("keep")) if isinstance(stage, dict) else (None, None)
        if (not isinstance(model, str) or not model or (keep is not None and (
                isinstance(keep, bool) or not isinstance(keep, int) or keep < 1))
                or not isinstance(stage, dict) or set(stage) - {"model", "keep"}):
            raise RequestError(422, f"each stage of field `cascade` must be {{\"model\": ID, "
                                    f"\"keep\": N}} with N >= 1 or left out, as in {example}, got "
                                    f"{json.dumps(stage)[:60]}", param="cascade")
        parsed.append((model, keep))
    return parsed


async def search(state: ServerState, dialect: Dialect, request: Request) -> Response:
    """Answer ``POST /v1/search``."""
    from starlette.responses import JSONResponse

    service = state.search
    if service is None:
        raise RequestError(404, "this server has no index: start it with --index DIR to serve "
                                "/v1/search")
    payload = await read_payload(request, state.config)
    query, options, model_id = parse_search(payload, request.headers, state.config)
    stages = parse_cascade(payload, options["rerank"], model_id)
    if stages:
        from onnxrank.rerankers.cascade import CascadeReranker, CascadeStage

        options["reranker"] = CascadeReranker([
            CascadeStage(service.stage_backend(
                state.models.pick(stage_id, "rerank", dialect, request.url.path)), keep)
            for stage_id, keep in stages])
    elif options["rerank"]:
        model = state.models.pick(model_id, "rerank", dialect, request.url.path)
        options["reranker"] = service.backend(model)
    elif model_id is not None:
        raise RequestError(422, "field `model` names the rerank model and needs \"rerank\": true",
                           param="model")
    return JSONResponse(await service.run(query, options))
