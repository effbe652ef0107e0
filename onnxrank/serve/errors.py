"""Errors the server answers, and their body in each API dialect's own shape.

1. Cohere (``/v1/rerank``, ``/v2/rerank``): ``{"message": ...}``.
2. text-embeddings-inference (``/rerank``, ``/embed``): ``{"error": ..., "error_type": ...}``
   with TEI's error types and statuses (router/src/http/server.rs), and a bare 401.
3. OpenAI (``/v1/embeddings``, and this server's own ``/v1/search``):
   ``{"error": {"message", "type", "param", "code"}}``, ``param`` naming the field.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from starlette.responses import Response

# The API a request speaks, which shapes its body, its answer and its errors.
Dialect = Literal["cohere_v1", "cohere_v2", "tei", "openai"]

# text-embeddings-inference's error types (router/src/lib.rs ErrorType, serialized by name) and
# the status it gives each (router/src/http/server.rs).
TEI_ERROR_TYPE = {400: "Empty", 404: "Validation", 413: "Validation", 422: "Validation",
                  424: "Backend", 429: "Overloaded", 500: "Backend", 503: "Unhealthy"}
# OpenAI's error types by status (its API reference, "Error codes").
OPENAI_ERROR_TYPE = {400: "invalid_request_error", 401: "invalid_request_error",
                     404: "invalid_request_error", 413: "invalid_request_error",
                     422: "invalid_request_error", 429: "rate_limit_error"}


class RequestError(Exception):
    """A request the server answers with an error status; the message names what was wrong.

    Args:
        status: HTTP status.
        message: What was wrong, the value received and what is allowed.
        retry_after_s: Seconds for the Retry-After header (429).
        param: The request field at fault (OpenAI's ``param``).
        code: A machine-readable code (OpenAI's ``code``, e.g. ``model_not_found``).
    """

    def __init__(self, status: int, message: str, *, retry_after_s: int | None = None,
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s
        self.param = param
        self.code = code


def error_response(dialect: Dialect | None, error: RequestError) -> Response:
    """`error` in `dialect`'s shape (Cohere's for paths of no dialect)."""
    from starlette.responses import JSONResponse, Response

    status = error.status
    if dialect == "tei":
        if status == 401:  # TEI answers a bad key with a bare 401
            response: Response = Response(status_code=401)
        else:
            # TEI answers a failed inference with 424 (ErrorType::Backend).
            status = 424 if status == 500 else status
            response = JSONResponse(
                {"error": error.message, "error_type": TEI_ERROR_TYPE.get(status, "Backend")},
                status_code=status)
    elif dialect == "openai":
        code = error.code or ("invalid_api_key" if status == 401 else None)
        response = JSONResponse({"error": {
            "message": error.message, "type": OPENAI_ERROR_TYPE.get(status, "server_error"),
            "param": error.param, "code": code}}, status_code=status)
    else:
        response = JSONResponse({"message": error.message}, status_code=status)
    if error.retry_after_s is not None:
        response.headers["retry-after"] = str(error.retry_after_s)
    return response
