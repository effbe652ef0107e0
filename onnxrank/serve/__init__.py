"""`onnxrank serve`: an HTTP rerank server (Cohere v1/v2, Jina and TEI shapes) over the engine."""

from __future__ import annotations

from onnxrank.serve.app import create_app
from onnxrank.serve.config import ServeConfig
from onnxrank.serve.server import serve

__all__ = ["ServeConfig", "create_app", "serve"]
