"""What every handler shares: the served models, the settings, the metrics and the search index."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from onnxrank.serve.config import ServeConfig
from onnxrank.serve.errors import RequestError
from onnxrank.serve.metrics import ServerMetrics
from onnxrank.serve.registry import ModelSet

if TYPE_CHECKING:
    from onnxrank.serve.search_service import SearchService


@dataclass
class ServerState:
    """The models (each with its queue and worker), settings, metrics and the optional index."""

    models: ModelSet
    config: ServeConfig
    metrics: ServerMetrics
    search: SearchService | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False

    @property
    def ready(self) -> bool:
        """Every model is loaded and warm."""
        return all(model.batcher.ready.is_set() for model in self.models)

    def check_accepting(self) -> None:
        """Raise the 503 of a draining or warming server.

        Raises:
            RequestError: 503 naming why.
        """
        if self.draining:
            raise RequestError(503, "the server is shutting down; send the request to another "
                                    "replica")
        if not self.ready:
            raise RequestError(503, "the models are still warming up; retry when /ready answers "
                                    "200")
