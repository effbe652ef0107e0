"""Running the app under uvicorn: bind, print the address, drain on SIGTERM."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from onnxrank._optional import require
from onnxrank.serve.app import create_app
from onnxrank.serve.config import ServeConfig
from onnxrank.serve.state import ServerState

if TYPE_CHECKING:
    from onnxrank.engine.embedder import Embedder
    from onnxrank.engine.reranker import Reranker
    from onnxrank.retrieval.hybrid import HybridRetriever

logger = logging.getLogger(__name__)


def serve(models: Mapping[str, Reranker | Embedder] | Reranker | Embedder,
          config: ServeConfig | None = None, *, retriever: HybridRetriever | None = None) -> None:
    """Serve `models` (and `retriever`'s index) over HTTP until SIGTERM or SIGINT (blocking).

    On SIGTERM or the first SIGINT the server stops accepting connections, answers /ready and
    new requests with 503, finishes every request it holds (queued ones included) within
    ``shutdown_timeout_s``, then returns normally (exit status 0 from the CLI). A second SIGINT
    exits at once.

    Args:
        models: Served models by id, or one engine (see create_app).
        config: Server settings; None uses the defaults.
        retriever: An opened index for ``POST /v1/search``, or None.

    Raises:
        MissingDependencyError: The `serve` extra is not installed.
        OSError: The address cannot be bound.
    """
    uvicorn = require("uvicorn", extra="serve")
    config = config or ServeConfig()
    app = create_app(models, config, retriever=retriever)
    state: ServerState = app.state.server

    class Server(uvicorn.Server):  # type: ignore[misc,name-defined]
        def handle_exit(self, sig: int, frame: Any) -> None:
            # Before uvicorn closes the sockets: /ready turns 503 and new requests get 503.
            state.draining = True
            super().handle_exit(sig, frame)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            for server in self.servers:
                for sock in server.sockets:
                    host, port = sock.getsockname()[:2]
                    served = ", ".join(f"{model.id} ({model.task})" for model in state.models)
                    index = "" if state.search is None else ", search"
                    print(f"onnxrank serve: {served}{index} on http://{host}:{port} "
                          f"(/ready answers 200 once the models are warm)", file=sys.stderr,
                          flush=True)

    uvicorn_config = uvicorn.Config(
        app, host=config.host, port=config.port, lifespan="on", access_log=False,
        log_level="warning", timeout_graceful_shutdown=config.shutdown_timeout_s,
        # Headers come from the app; uvicorn's own Server/Date headers add nothing.
        server_header=False,
    )
    # uvicorn re-raises the signal it handled once it has shut down, so that the process dies of
    # it; after a complete drain this process has nothing left to do and exits normally, so the
    # re-raised signal lands on a handler that only logs.
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _drained) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        Server(uvicorn_config).run()
    finally:
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)


def _drained(sig: int, frame: Any) -> None:
    logger.info("drained after signal %d", sig)
