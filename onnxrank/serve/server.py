"""Running the app under uvicorn: bind, print the address, drain on SIGTERM."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any

from onnxrank._optional import require
from onnxrank.serve.app import ServerState, create_app
from onnxrank.serve.config import ServeConfig

if TYPE_CHECKING:
    from onnxrank.engine.reranker import Reranker

logger = logging.getLogger(__name__)


def serve(reranker: Reranker, config: ServeConfig | None = None) -> None:
    """Serve `reranker` over HTTP until SIGTERM or SIGINT (blocking).

    On SIGTERM or the first SIGINT the server stops accepting connections, answers /ready and
    new rerank calls with 503, finishes every request it holds (queued ones included) within
    ``shutdown_timeout_s``, then returns normally (exit status 0 from the CLI). A second SIGINT
    exits at once.

    Raises:
        MissingDependencyError: The `serve` extra is not installed.
        OSError: The address cannot be bound.
    """
    uvicorn = require("uvicorn", extra="serve")
    config = config or ServeConfig()
    app = create_app(reranker, config)
    state: ServerState = app.state.server

    class Server(uvicorn.Server):  # type: ignore[misc,name-defined]
        def handle_exit(self, sig: int, frame: Any) -> None:
            # Before uvicorn closes the sockets: /ready turns 503 and new rerank calls get 503.
            state.draining = True
            super().handle_exit(sig, frame)

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            for server in self.servers:
                for sock in server.sockets:
                    host, port = sock.getsockname()[:2]
                    print(f"onnxrank serve: {state.model_id} on http://{host}:{port} "
                          f"(/ready answers 200 once the model is warm)", file=sys.stderr,
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
