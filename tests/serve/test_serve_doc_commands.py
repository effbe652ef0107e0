"""Every curl command of docs/serve.md runs as written against a real server (the address swapped
for the test server's; the bag-of-words reranker and embedder served under the doc's ids, and an
index of the retrieval tests' corpus)."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path

from serve_helpers import WAIT_S, running_server

from onnxrank.engine.embedder import Embedder
from onnxrank.engine.reranker import Reranker
from onnxrank.retrieval import HybridRetriever
from onnxrank.serve import ServeConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "serve.md"
DOC_ADDRESS = "http://127.0.0.1:8080"
DOC_KEYED_ADDRESS = "http://127.0.0.1:8090"
DOC_KEY = "change-me"
DOC_RERANKER, DOC_EMBEDDER = "minilm-standin", "minilm-embedder"
# The documented error examples, by a piece of their command: the answer the doc shows.
DOC_ERRORS = {
    '"query": "", "documents": ["a"]': {"message": "field `query` must be a non-empty string, "
                                                   "got ''"},
    '"model": "minilm-embedder", "query": "q"': {"message": (
        "model 'minilm-embedder' is an embedding model, but /v2/rerank needs a rerank model; use "
        "one of: minilm-standin")},
    '"model": "text-embedding-3-small"': {"error": {
        "message": "model 'text-embedding-3-small' is not served here; known models: "
                   "minilm-standin (rerank), minilm-embedder (embedding)",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found"}},
}


def curl_commands(text: str) -> list[str]:
    """Complete `curl ...` commands in the doc's bash blocks (continuations and quotes joined)."""
    commands, pending, in_bash = [], "", False
    for line in text.splitlines():
        if line.startswith("```"):
            in_bash = line.strip() == "```bash"
            continue
        if not in_bash:
            continue
        if not pending and not line.startswith("curl "):
            continue
        pending = f"{pending}\n{line}" if pending else line
        try:
            shlex.split(pending)
        except ValueError:  # an open quote: the command goes on
            continue
        if pending.endswith("\\"):
            continue
        commands.append(pending)
        pending = ""
    return commands


def test_the_doc_has_curl_examples_for_every_endpoint() -> None:
    text = "\n".join(curl_commands(DOC.read_text("utf-8")))
    for path in ("/v1/rerank", "/v2/rerank", "/rerank", "/health", "/ready", "/metrics",
                 "/v1/models", "/v1/embeddings", "/embed", "/v1/search"):
        assert f"127.0.0.1:8080{path}" in text or f"127.0.0.1:8090{path}" in text, path


def test_every_curl_example_runs(bow_rerank_engine: Reranker, bow_embed_engine: Embedder,
                                 retriever: HybridRetriever) -> None:
    assert shutil.which("curl"), "curl is needed to check the documented commands"
    commands = curl_commands(DOC.read_text("utf-8"))
    assert len(commands) >= 8
    engines = {DOC_RERANKER: bow_rerank_engine, DOC_EMBEDDER: bow_embed_engine}
    with running_server(engines, ServeConfig(port=0), retriever=retriever) as open_server, \
            running_server(engines, ServeConfig(port=0, api_key=DOC_KEY),
                           retriever=retriever) as keyed:
        for command in commands:
            runnable = (command.replace(DOC_ADDRESS, open_server.base_url)
                        .replace(DOC_KEYED_ADDRESS, keyed.base_url))
            result = subprocess.run(["bash", "-c", runnable], capture_output=True, text=True,
                                    timeout=WAIT_S, check=False)
            assert result.returncode == 0, (command, result.stderr)
            output = result.stdout.strip()
            assert output, command
            if output.startswith(("{", "[")):
                body = json.loads(output)
                expected = [answer for piece, answer in DOC_ERRORS.items() if piece in command]
                if expected:
                    assert body == expected[0], command
                else:
                    assert not (isinstance(body, dict) and ("message" in body or "error" in body)), (
                        command, body)
            elif "-D -" in command:
                assert output.startswith("HTTP/1.1 200"), output
                for header in ("x-compute-time", "x-queue-time", "x-inference-time",
                               "x-tokenization-time", "x-total-time"):
                    assert f"{header}:" in output


def test_every_twin_the_doc_names_is_in_serve_help() -> None:
    import re
    import sys

    help_text = subprocess.run([sys.executable, "-m", "onnxrank", "serve", "--help"],
                               capture_output=True, text=True, timeout=WAIT_S, check=True).stdout
    named = set(re.findall(r"ONNXRANK_SERVE_[A-Z_]+[A-Z]", DOC.read_text("utf-8")))
    assert named, "the doc names no server twin"
    for name in named:
        assert name in help_text.replace("\n", "").replace(" ", ""), name
