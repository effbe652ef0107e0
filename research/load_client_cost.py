"""CPU per request of the bench's load generator: httpx's AsyncClient against aiohttp's client.

A research script, not part of the package. The serving scenario's clients run on the machine
they load, so their CPU is charged to the server's pairs/s; this measures what each client library
costs. It starts ``onnxrank serve`` on MODEL_DIR (a tiny model keeps the engine's share small),
then sends the same 400 Cohere-shaped requests (10 documents each) through 16 closed-loop clients
with each library in turn, ROUNDS times, and prints the client process's CPU time
(resource.getrusage) per request::

    python research/load_client_cost.py MODEL_DIR [ROUNDS]
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

from onnxrank.bench.serving import REQUEST_TIMEOUT_S, ServerProcess

CLIENTS = 16
REQUESTS = 400
DOCUMENTS = [f"document {i} on wing flutter at transonic speeds and boundary layers"
             for i in range(10)]


async def _load(library: str, url: str, bodies: list[bytes]) -> int:
    """Every body once through CLIENTS closed-loop clients of `library`; the count answered 200."""
    answered = 0
    remaining = iter(bodies)
    headers = {"content-type": "application/json"}
    if library == "httpx":
        import httpx

        limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
        client: Any = httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits)
    else:
        import aiohttp

        client = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CLIENTS))

    async def one_client() -> None:
        nonlocal answered
        for body in remaining:
            if library == "httpx":
                response = await client.post(url, content=body, headers=headers)
                await response.aread()
                answered += response.status_code == 200
            else:
                async with client.post(url, data=body, headers=headers) as response:
                    await response.read()
                    answered += response.status == 200

    async with client:
        await asyncio.gather(*(one_client() for _ in range(CLIENTS)))
    return answered


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    model_dir = Path(sys.argv[1])
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    name = json.loads((model_dir / "manifest.json").read_text())["name"]
    bodies = [json.dumps({"model": name, "query": f"query {q} on wing flutter",
                          "documents": DOCUMENTS, "return_documents": False}).encode()
              for q in range(REQUESTS)]
    server = ServerProcess([model_dir], threads=2, batching=True)
    try:
        url = f"{server.base_url}/v1/rerank"
        for round_ in range(rounds):
            for library in ("httpx", "aiohttp"):
                cpu, wall = _cpu_s(), time.perf_counter()
                answered = asyncio.run(_load(library, url, bodies))
                cpu, wall = _cpu_s() - cpu, time.perf_counter() - wall
                print(f"round {round_} {library:8s} {answered} answered, client CPU "
                      f"{1000 * cpu / len(bodies):.3f} ms per request, {len(bodies) / wall:.0f} "
                      "requests/s", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
