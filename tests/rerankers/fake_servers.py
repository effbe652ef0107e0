"""Small HTTP servers on 127.0.0.1 that answer like a Cohere v2 rerank endpoint or a chat
endpoint, with switchable failure modes. Each test starts one and stops it (see conftest.py)."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WORD = re.compile(r"\w+")
# How long a "slow" answer waits at most; a test's client timeout is far below it, and stopping
# the server releases the wait at once.
SLOW_ANSWER_LIMIT_S = 10.0


def overlap_score(query: str, document: str) -> float:
    """The fake model: the share of the document's words that occur in the query."""
    query_words = {word.lower() for word in WORD.findall(query)}
    words = [word.lower() for word in WORD.findall(document)]
    return sum(word in query_words for word in words) / max(len(words), 1)


class FakeServer:
    """A threaded HTTP server; `mode` picks the answer: ok, error500, slow, malformed, not_json,
    bad_index (and for chat: garbage)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.mode = "ok"
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
                pass

            def do_POST(self) -> None:  # noqa: N802 - stdlib name
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                server.requests.append({"path": self.path, **body})
                server.headers.append(dict(self.headers))
                server.answer(self, body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def answer(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        if self.mode == "slow":
            self.release.wait(SLOW_ANSWER_LIMIT_S)
        if self.mode == "error500":
            self._send(handler, 500, {"message": "internal error"})
            return
        if self.mode == "not_json":
            self._send_raw(handler, 200, b"<html>not json</html>", "text/html")
            return
        if self.kind == "cohere":
            self._answer_rerank(handler, body)
        else:
            self._answer_chat(handler, body)

    def _answer_rerank(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        documents = body["documents"]
        scores = [overlap_score(body["query"], document) for document in documents]
        order = sorted(range(len(documents)), key=lambda index: (-scores[index], index))
        if body.get("top_n") is not None:
            order = order[: body["top_n"]]
        results = [{"index": index, "relevance_score": scores[index]} for index in order]
        if self.mode == "malformed":
            self._send(handler, 200, {"id": "x", "ranking": results})
            return
        if self.mode == "bad_index":
            results[0]["index"] = len(documents) + 3
        self._send(handler, 200, {"id": "fake", "results": results, "meta": {"billed_units": {}}})

    def _answer_chat(self, handler: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        prompt = body["messages"][-1]["content"]
        query = prompt.split("Query: ", 1)[1].split("\n\nDocument: ", 1)[0]
        document = prompt.split("\n\nDocument: ", 1)[1].rsplit("\n\nRating (0-10):", 1)[0]
        content = str(round(10 * overlap_score(query, document)))
        if self.mode == "garbage":
            content = f"I would say {content} out of 10"
        if self.mode == "malformed":
            self._send(handler, 200, {"choices": []})
            return
        if handler.path.endswith("/api/chat"):
            message = {"role": "assistant", "content": content}
            self._send(handler, 200, {"model": body["model"], "message": message})
        else:
            message = {"role": "assistant", "content": content}
            self._send(handler, 200, {"choices": [{"index": 0, "message": message}]})

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, payload: object) -> None:
        FakeServer._send_raw(handler, status, json.dumps(payload).encode(), "application/json")

    @staticmethod
    def _send_raw(handler: BaseHTTPRequestHandler, status: int, data: bytes, content_type: str) -> None:
        try:
            handler.send_response(status)
            handler.send_header("Content-Type", content_type)
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (timeout tests)
