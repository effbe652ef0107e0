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

from onnxrank.bench.serving import REQUEST_TIMEOUT_S, ServerProcess, closed_loop

CLIENTS = 16
REQUESTS = 400
LOAD_TIME_LIMIT_S = 120.0  # a bound on each load run (400 requests take about a second)
DOCUMENTS = [f"document {i} on wing flutter at transonic speeds and boundary layers"
             for i in range(10)]


async def _httpx_load(url: str, bodies: list[bytes]) -> int:
    """Every body once through CLIENTS closed-loop httpx clients (the bench's load generator
    before aiohttp's); the count answered 200."""
    import httpx

    answered = 0
    remaining = iter(bodies)
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:

        async def one_client() -> None:
            nonlocal answered
            for body in remaining:
                response = await client.post(url, content=body,
                                             headers={"content-type": "application/json"})
                await response.aread()
                answered += response.status_code == 200

        await asyncio.gather(*(one_client() for _ in range(CLIENTS)))
    return answered


def _load(library: str, url: str, bodies: list[bytes]) -> int:
    """Every body once through CLIENTS clients of `library` ("aiohttp": the bench's own
    closed_loop); the count answered 200."""
    if library == "httpx":
        return asyncio.run(_httpx_load(url, bodies))
    return closed_loop(url, bodies, clients=CLIENTS, time_limit_s=LOAD_TIME_LIMIT_S).statuses[200]


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
                answered = _load(library, url, bodies)
                cpu, wall = _cpu_s() - cpu, time.perf_counter() - wall
                print(f"round {round_} {library:8s} {answered} answered, client CPU "
                      f"{1000 * cpu / len(bodies):.3f} ms per request, {len(bodies) / wall:.0f} "
                      "requests/s", flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
