"""Serving: `onnxrank serve` under HTTP load on loopback, beside rerank_many and Infinity.

1. Closed loop at 1, 4, 16 and 64 concurrent clients on short, and at 16 on mixed (the time plan
   of a full run; see LEVELS_BY_REGIME), each request one query with SERVING_CANDIDATES
   candidates. Contenders, measured interleaved round by round (onnxrank.bench.harness): the
   server with cross-request batching ("serve"), without it ("serve_nobatch": one engine run per
   request), and at 16 clients Infinity serving the same checkpoint ("infinity", its own
   virtualenv, telemetry off) and the engine's rerank_many in this process on the same requests
   in chunks of 16 ("rerank_many": what the server could reach without HTTP and JSON). A round is
   the same list of requests for every contender, one per client (at least MIN_ROUND_REQUESTS);
   a level stops once its ratios are known to ±5% or at its time cap (bench_run
   .FULL_TIME_CAPS_S). Pairs/s come from round times, p50/p95/p99 from each request's latency.
2. Open loop at twice the capacity "serve" reached at 16 clients, for a bounded time, against a
   fresh server with the default queue: share of 429s, latency of accepted requests, memory
   before and after, and a count (client and server side) that no request was lost or answered
   twice. The test fails when one was.
3. Embeddings: closed loop at the same levels, each request 8 texts (the workload's passages) in
   OpenAI's shape with float vectors: ``onnxrank serve`` serving the embedding model
   (--bench-embedder; POST /v1/embeddings, "serve"), Infinity serving the same model's checkpoint
   (POST /embeddings, "infinity") at every level, and at 16 clients ``Embedder.embed`` in this
   process on the texts of 16 requests at a time ("embed_inprocess"). Texts/s are reported as
   the harness's pairs/s (one item = one text).
4. Search: POST /v1/search (hybrid, k=10, reranking the fused top 50) at 16 clients against one
   server holding the rerank model (every bench thread), the embedder (one thread more: it only
   embeds the queries) and an index of the dataset (built incrementally under
   --bench-out/retrieval-index, as the retrieval-stages scenario does): p50/p99 of each search.

Servers run as their own processes on 127.0.0.1; Infinity from its own virtualenv, found on
PATH or given with the pytest option --bench-infinity (install: onnxrank.bench.serving
.INFINITY_INSTALL), reported as skipped with that command when absent. Budgets (budgets.toml):
scenarios "serving_c1", "serving_c4", "serving_c16", "serving_c64", "serving_overload",
"serving_embed_c16" and "serving_search_c16".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from onnxrank.bench.harness import (
    Contender,
    ScenarioResult,
    StoppingRule,
    measure_interleaved,
    summarize,
)
from onnxrank.bench.serving import (
    InfinityProcess,
    LoadResult,
    ServerProcess,
    Target,
    closed_loop,
    cohere_bodies,
    embedding_bodies,
    latency_stats,
    metric_value,
    missing_serving_dependency,
    open_loop,
    search_bodies,
)
from onnxrank.bench.suite.bench_run import BenchRun
from onnxrank.bench.workloads import REGIMES, Regime, Request
from onnxrank.engine.runtime import resolve_model_dir
from onnxrank.errors import MissingDependencyError, RerankError

SCENARIO = "serving"
CLIENT_LEVELS = (1, 4, 16, 64)
SERVING_REGIMES = ("short", "mixed")
CAPACITY_CLIENTS = 16
# The full run's time plan (bench_run.FULL_TIME_CAPS_S, 15 minutes on 2 cores) affords every
# client level on short and the capacity level on mixed (which the overload test needs), and the
# Infinity peer for rerank at the capacity level only: torch scores about a fifth of the server's
# pairs/s, so the peer at every level would take most of the run.
LEVELS_BY_REGIME = {"short": CLIENT_LEVELS, "mixed": (CAPACITY_CLIENTS,)}
RERANK_PEER_LEVELS = (CAPACITY_CLIENTS,)
# Candidates per rerank request: a round of one request per client at 50 candidates takes a
# 2-core CPU about a minute per contender at 64 clients.
SERVING_CANDIDATES = 10
# A round is one request per client, at least this many (a level of one client runs several).
MIN_ROUND_REQUESTS = 4
OVERLOAD_FACTOR = 2.0
LOOP_TIME_LIMIT_S = 600.0
# Closed-loop servers queue every client's request (64 clients): no 429 may cut a round short.
CLOSED_LOOP_QUEUE = "128"

TEXTS_PER_REQUEST = 8
SEARCH_CLIENTS = 16
SEARCH_K = 10

# A round: (index of its first request, requests).
Round = tuple[int, int]

# Pairs/s of "serve" at CAPACITY_CLIENTS per regime: the overload test sends twice that.
_capacity: dict[str, float] = {}
_c16_p99_ms: dict[str, float] = {}


def _per_round(bench: BenchRun, clients: int) -> int:
    # Quick checks the suite, not the numbers: at most 16 requests a round (some of 64 clients
    # then never send), so that it stays short.
    return min(max(2, clients), 16) if bench.quick else max(MIN_ROUND_REQUESTS, clients)


def _rounds(bench: BenchRun, clients: int) -> list[Round]:
    """The rounds a level may take (its comparison stops sooner once its ratios are known)."""
    per_round = _per_round(bench, clients)
    return [(index * per_round, per_round) for index in range(bench.sizes.serving_rounds)]


def _warm_up(clients: int) -> Round:
    """The untimed first round of each contender: connections, sessions and kernels warmed on a
    few requests instead of a whole round of the slowest."""
    return 0, min(clients, MIN_ROUND_REQUESTS)


def _skip_unplanned_level(bench: BenchRun, regime: Regime, device: str, scenario: str,
                          clients: int) -> None:
    if clients not in LEVELS_BY_REGIME[regime.name]:
        levels = ", ".join(map(str, LEVELS_BY_REGIME[regime.name]))
        bench.skip_scenario(scenario, regime.name, device,
                            f"the time plan runs {regime.name} at {levels} clients only")


def _infinity(config: pytest.Config) -> str | None:
    """Infinity's executable from --bench-infinity (None: the one on PATH)."""
    value = config.getoption("--bench-infinity", None)
    return None if value is None else str(value)


def _start_infinity(checkpoint: Path, bench: BenchRun, config: pytest.Config) -> Any:
    """An InfinityProcess, or why it could not start (a string)."""
    try:
        return InfinityProcess(checkpoint, threads=bench.threads, executable=_infinity(config))
    except (FileNotFoundError, RuntimeError, TimeoutError) as err:
        return f"skipped: {err}"


class _Servers:
    """The server processes shared by the closed-loop levels, started on first use (after the
    scenario's own checks), or why one could not start.

    Args:
        start: Builds the servers by contender name (a process, or a string saying why not).
    """

    def __init__(self, start: Callable[[], dict[str, Any]]) -> None:
        self._start = start
        self._started: dict[str, Any] | None = None

    def get(self) -> dict[str, Any]:
        if self._started is None:
            self._started = self._start()
        return self._started

    def stop(self) -> None:
        for server in (self._started or {}).values():
            if not isinstance(server, str):
                server.stop()


@pytest.fixture(scope="module")
def servers(bench: BenchRun, pytestconfig: pytest.Config) -> Iterator[_Servers]:
    def start() -> dict[str, Any]:
        started: dict[str, Any] = {}
        for name, batching in (("serve", True), ("serve_nobatch", False)):
            started[name] = ServerProcess(
                [bench.model_dir], threads=bench.threads, batching=batching,
                engine_options=bench.engine_options,
                extra_args=("--max-queue", CLOSED_LOOP_QUEUE))
        started["infinity"] = _start_infinity(bench.model_dir / "checkpoint", bench, pytestconfig)
        return started

    pool = _Servers(start)
    try:
        yield pool
    finally:
        pool.stop()


def _embedder_dir(bench: BenchRun) -> Path:
    return resolve_model_dir(bench.embedder_name, bench.models_dir)


@pytest.fixture(scope="module")
def embed_servers(bench: BenchRun, pytestconfig: pytest.Config) -> Iterator[_Servers]:
    def start() -> dict[str, Any]:
        model_dir = _embedder_dir(bench)
        return {
            "serve": ServerProcess([model_dir], threads=bench.threads, batching=True,
                                   engine_options=bench.engine_options,
                                   extra_args=("--max-queue", CLOSED_LOOP_QUEUE)),
            "infinity": _start_infinity(model_dir / "checkpoint", bench, pytestconfig),
        }

    pool = _Servers(start)
    try:
        yield pool
    finally:
        pool.stop()


def _serving_regime(bench: BenchRun, regime: Regime, device: str, scenario: str) -> None:
    bench.require_device(scenario, regime.name, device)
    if device != "cpu":
        bench.skip_scenario(scenario, regime.name, device, "the serving scenario runs on CPU")
    if regime.name not in SERVING_REGIMES:
        bench.skip_scenario(scenario, regime.name, device,
                            f"the serving scenario runs on {' and '.join(SERVING_REGIMES)} only")
    missing = missing_serving_dependency()
    if missing is not None:
        bench.skip_scenario(scenario, regime.name, device, missing)


def _requests(bench: BenchRun, regime: Regime) -> tuple[Request, ...]:
    needed = bench.sizes.serving_rounds * _per_round(bench, max(CLIENT_LEVELS))
    return bench.workload(regime, needed, SERVING_CANDIDATES).requests


def _http_contender(target: Target, clients: int,
                    results: dict[str, list[LoadResult]]) -> Contender[Round]:
    def run(requests: Round) -> None:
        start, count = requests
        result = closed_loop(target.url, target.bodies[start:start + count],
                             clients=clients, time_limit_s=LOOP_TIME_LIMIT_S)
        results.setdefault(target.name, []).append(result)

    return Contender(name=target.name, label=target.label, run=run,
                     settings={**target.settings, "clients": clients})


def _measure_closed_loop(benchmark: Any, bench: BenchRun, *, scenario: str, regime: str,
                         device: str, targets: Sequence[Target],
                         local: Sequence[Contender[Round]], clients: int,
                         items_per_request: Sequence[int], ratios: Sequence[tuple[str, str]],
                         skipped: dict[str, str], workload: dict[str, Any]) -> ScenarioResult:
    """Time the HTTP targets (and the in-process contenders) round by round, interleaved, until
    the ratios are known to ±5% or the level's time cap; a target named "serve…" that refuses a
    request fails the test.

    Args:
        items_per_request: Pairs (or texts, searches) of each request, for pairs/s.

    Returns:
        The result (not yet recorded): per contender pairs/s over the rounds, and for HTTP
        targets each request's latency percentiles and the statuses.
    """
    results: dict[str, list[LoadResult]] = {}
    contenders = [_http_contender(target, clients, results) for target in targets]
    contenders.extend(local)
    rounds = _rounds(bench, clients)
    stopping = StoppingRule(min_items=min(bench.sizes.min_items, len(rounds)),
                            max_items=len(rounds),
                            time_cap_s=bench.sizes.time_cap_s(scenario, regime))
    timings = measure_interleaved(
        benchmark, contenders, rounds,
        [sum(items_per_request[start:start + count]) for start, count in rounds],
        ratios=ratios, stopping=stopping, warm_up=_warm_up(clients))
    result = summarize(scenario, regime, device, contenders, timings, ratios=ratios,
                       skipped=skipped, workload=workload)
    for name, loads in results.items():
        loads = loads[1:]  # without the warm-up run
        statuses: Counter[int | str] = Counter()
        for load in loads:
            statuses.update(load.statuses)
        stats = result.contenders[name]["stats"]
        stats.update(latency_stats([value for load in loads
                                    for value in load.accepted_latencies_s()]))
        stats["statuses"] = {str(status): count for status, count in statuses.items()}
        refused = {status: count for status, count in statuses.items() if status != 200}
        if refused and name.startswith("serve"):
            pytest.fail(f"{name} refused closed-loop requests: {refused}")
    return result


def _started(servers: _Servers) -> tuple[dict[str, Any], dict[str, str]]:
    """The servers that started, and why the others did not."""
    running = {name: server for name, server in servers.get().items()
               if not isinstance(server, str)}
    skipped = {name: server for name, server in servers.get().items() if isinstance(server, str)}
    return running, skipped


@pytest.mark.parametrize("clients", CLIENT_LEVELS, ids=[f"c{level}" for level in CLIENT_LEVELS])
def test_serving_closed_loop(benchmark: Any, bench: BenchRun, device: str, regime: Regime,
                             clients: int, servers: _Servers) -> None:
    scenario = f"{SCENARIO}_c{clients}"
    _serving_regime(bench, regime, device, scenario)
    _skip_unplanned_level(bench, regime, device, scenario, clients)
    requests = _requests(bench, regime)
    model = bench.reference_engine.spec.name
    bodies = cohere_bodies(requests, model)
    labels = {
        "serve": f"onnxrank serve ({bench.engine_label()}), cross-request batching "
                 "(POST /v1/rerank)",
        "serve_nobatch": f"onnxrank serve ({bench.engine_label()}), one engine run per request "
                         "(--no-batching)",
        "infinity": "Infinity (infinity-emb, torch engine) on the same checkpoint (POST /rerank)",
    }
    running, skipped = _started(servers)
    if clients not in RERANK_PEER_LEVELS:
        running.pop("infinity", None)
        skipped.pop("infinity", None)
    targets = [Target(name=name, label=labels[name],
                      url=server.base_url + ("/rerank" if name == "infinity" else "/v1/rerank"),
                      bodies=bodies if name != "infinity" else cohere_bodies(requests, "peer"),
                      settings={"threads": bench.threads, "server": name})
               for name, server in running.items()]
    local: list[Contender[Round]] = []
    ratios = [("serve", "serve_nobatch"), ("serve", "infinity")]
    if clients == CAPACITY_CLIENTS:
        engine = bench.engine(device)

        def rerank_many(round_requests: Round) -> None:
            start, count = round_requests
            queries = [(request.query, request.documents)
                       for request in requests[start:start + count]]
            for chunk in range(0, len(queries), clients):
                engine.rerank_many(queries[chunk:chunk + clients])

        local.append(Contender(
            name="rerank_many", label=f"engine rerank_many in-process, chunks of {clients}",
            run=rerank_many, settings={"threads": bench.threads, "chunk": clients}))
        ratios.append(("serve", "rerank_many"))
    result = _measure_closed_loop(
        benchmark, bench, scenario=scenario, regime=regime.name, device=device, targets=targets,
        local=local, clients=clients,
        items_per_request=[len(request.documents) for request in requests], ratios=ratios,
        skipped=skipped,
        workload={**bench.workload(regime, len(requests), SERVING_CANDIDATES).describe(),
                  "clients": clients, "requests_per_round": _per_round(bench, clients)})
    if clients == CAPACITY_CLIENTS and "serve" in result.contenders:
        _capacity[regime.name] = result.contenders["serve"]["stats"]["pairs_per_s"]
        _c16_p99_ms[regime.name] = result.contenders["serve"]["stats"].get("p99_ms", math.nan)
    bench.record(benchmark, result)


def _text_batches(bench: BenchRun, regime: Regime) -> list[tuple[str, ...]]:
    """Requests of TEXTS_PER_REQUEST texts: the workload's passages in order (again from the
    first when a small workload has fewer)."""
    needed = bench.sizes.serving_rounds * _per_round(bench, max(CLIENT_LEVELS))
    texts = [text for request in _requests(bench, regime) for text in request.documents]
    return [tuple(texts[(start + offset) % len(texts)] for offset in range(TEXTS_PER_REQUEST))
            for start in range(0, needed * TEXTS_PER_REQUEST, TEXTS_PER_REQUEST)]


@pytest.mark.parametrize("clients", CLIENT_LEVELS, ids=[f"c{level}" for level in CLIENT_LEVELS])
def test_serving_embeddings(benchmark: Any, bench: BenchRun, device: str, regime: Regime,
                            clients: int, embed_servers: _Servers) -> None:
    scenario = f"{SCENARIO}_embed_c{clients}"
    _serving_regime(bench, regime, device, scenario)
    _skip_unplanned_level(bench, regime, device, scenario, clients)
    try:
        embedder_dir = _embedder_dir(bench)
    except RerankError as err:
        bench.skip_scenario(scenario, regime.name, device, str(err))
    batches = _text_batches(bench, regime)
    running, skipped = _started(embed_servers)
    labels = {
        "serve": f"onnxrank serve ({bench.engine_label()}), cross-request batching "
                 "(POST /v1/embeddings, float)",
        "infinity": "Infinity (infinity-emb, torch engine) on the same checkpoint "
                    "(POST /embeddings, float)",
    }
    targets = []
    for name, server in running.items():
        model = "peer" if name == "infinity" else server_model_name(embedder_dir)
        path = "/embeddings" if name == "infinity" else "/v1/embeddings"
        targets.append(Target(name=name, label=labels[name], url=server.base_url + path,
                              bodies=embedding_bodies(batches, model),
                              settings={"threads": bench.threads, "server": name,
                                        "texts_per_request": TEXTS_PER_REQUEST}))
    local: list[Contender[Round]] = []
    ratios = [("serve", "infinity")]
    if clients == CAPACITY_CLIENTS:
        from onnxrank.engine.embedder import Embedder

        embedder = Embedder.from_dir(embedder_dir, device=device, threads=bench.threads,
                                     **bench.engine_options)

        def embed(round_requests: Round) -> None:
            start, count = round_requests
            round_batches = batches[start:start + count]
            for chunk in range(0, len(round_batches), clients):
                embedder.embed([text for texts in round_batches[chunk:chunk + clients]
                                for text in texts])

        local.append(Contender(
            name="embed_inprocess",
            label=f"Embedder.embed in-process, the texts of {clients} requests per call",
            run=embed, settings={"threads": bench.threads, "chunk": clients}))
        ratios.append(("serve", "embed_inprocess"))
    bench.record(benchmark, _measure_closed_loop(
        benchmark, bench, scenario=scenario, regime=regime.name, device=device, targets=targets,
        local=local, clients=clients, items_per_request=[len(texts) for texts in batches],
        ratios=ratios, skipped=skipped,
        workload={"regime": regime.name, "embedder": str(embedder_dir), "clients": clients,
                  "texts_per_request": TEXTS_PER_REQUEST,
                  "requests_per_round": _per_round(bench, clients),
                  "items": "texts (pairs_per_s is texts/s)"}))


def server_model_name(model_dir: Path) -> str:
    """The id ``onnxrank serve --model DIR`` serves a model under: its manifest's name."""
    from onnxrank.engine.spec import load_model_spec

    return load_model_spec(model_dir).name


def test_serving_search(benchmark: Any, bench: BenchRun, device: str, regime: Regime,
                        pytestconfig: pytest.Config) -> None:
    scenario = f"{SCENARIO}_search_c{SEARCH_CLIENTS}"
    _serving_regime(bench, regime, device, scenario)
    if regime.name != "short":  # search queries come from the dataset: one regime is enough
        bench.skip_scenario(scenario, regime.name, device, "the search level runs on short only")
    try:
        from onnxrank.engine.embedder import Embedder
        from onnxrank.retrieval import build_index

        embedder_dir = _embedder_dir(bench)
        embedder = Embedder.from_dir(embedder_dir, device=device, threads=bench.threads)
        index_dir = bench.out / "retrieval-index" / f"{embedder.spec.name}-{device}"
        build_index(bench.dataset_path / "corpus.jsonl", index_dir, embedder)
        del embedder
    except (RerankError, MissingDependencyError) as err:
        bench.skip_scenario(scenario, regime.name, device, str(err))
    needed = bench.sizes.serving_rounds * _per_round(bench, SEARCH_CLIENTS)
    queries = [request.query for request in bench.workload(REGIMES["short"], needed).requests]
    # Reranking the top 50 is nearly all of a search's work: the reranker gets every thread and
    # the query embedder one more (an even split would leave half the cores to the idle embedder).
    models_file = bench.out / "serving-search-models.toml"
    models_file.write_text(
        f'[[model]]\nmodel = "{bench.model_dir}"\nthreads = {bench.threads}\n\n'
        f'[[model]]\nmodel = "{embedder_dir}"\nthreads = 1\n')
    server = ServerProcess([], threads=bench.threads + 1, batching=True,
                           engine_options=bench.engine_options, index=index_dir,
                           extra_args=("--models-file", str(models_file),
                                       "--max-queue", CLOSED_LOOP_QUEUE))
    try:
        target = Target(name="serve_search",
                        label=f"onnxrank serve POST /v1/search: hybrid, k={SEARCH_K}, reranking "
                              f"the fused top 50 ({bench.engine_label()})",
                        url=server.base_url + "/v1/search",
                        bodies=search_bodies(queries, k=SEARCH_K, rerank=True),
                        settings={"threads": bench.threads, "index": str(index_dir)})
        result = _measure_closed_loop(
            benchmark, bench, scenario=scenario, regime=regime.name, device=device,
            targets=[target], local=[], clients=SEARCH_CLIENTS,
            items_per_request=[1] * len(queries), ratios=[], skipped={},
            workload={"dataset": bench.dataset_path.name, "clients": SEARCH_CLIENTS,
                      "requests_per_round": _per_round(bench, SEARCH_CLIENTS), "k": SEARCH_K,
                      "items": "searches (pairs_per_s is searches/s)"})
    finally:
        server.stop()
    bench.record(benchmark, result)


def test_serving_overload(benchmark: Any, bench: BenchRun, device: str, regime: Regime) -> None:
    scenario = f"{SCENARIO}_overload"
    _serving_regime(bench, regime, device, scenario)
    if regime.name not in _capacity:
        bench.skip_scenario(scenario, regime.name, device,
                            f"needs the capacity measured by serving_c{CAPACITY_CLIENTS} first")
    requests = _requests(bench, regime)
    candidates = len(requests[0].documents)
    rate = OVERLOAD_FACTOR * _capacity[regime.name] / candidates
    duration = bench.sizes.serving_overload_s
    bodies = cohere_bodies(requests, bench.reference_engine.spec.name)
    server = ServerProcess([bench.model_dir], threads=bench.threads, batching=True,
                           engine_options=bench.engine_options)
    try:
        url = server.base_url + "/v1/rerank"
        closed_loop(url, bodies[:4], clients=2, time_limit_s=LOOP_TIME_LIMIT_S)  # warm-up
        before_text = server.metrics_text()
        rss_before = server.rss_bytes
        load: LoadResult = benchmark.pedantic(
            lambda: open_loop(url, bodies, rate_per_s=rate, duration_s=duration),
            rounds=1, iterations=1)
        after_text = server.metrics_text()
        rss_after = server.rss_bytes
    finally:
        server.stop()
    counted = {
        status: metric_value(after_text, "onnxrank_requests_total", endpoint="/v1/rerank",
                             status=status)
        - metric_value(before_text, "onnxrank_requests_total", endpoint="/v1/rerank",
                       status=status)
        for status in ("200", "429", "503")
    }
    server_total = metric_value(after_text, "onnxrank_requests_total", endpoint="/v1/rerank") \
        - metric_value(before_text, "onnxrank_requests_total", endpoint="/v1/rerank")
    accepted = load.accepted_latencies_s()
    stats: dict[str, Any] = {
        **latency_stats(accepted),
        "pairs_per_s": len(accepted) * candidates / load.elapsed_s,
        "offered_requests_per_s": rate, "sent": load.sent, "answered": load.answered,
        "statuses": {str(status): count for status, count in load.statuses.items()},
        "server_counted": server_total, "server_counted_by_status": counted,
        "share_429": load.statuses.get(429, 0) / max(1, load.sent),
        "rss_before_mb": None if rss_before is None else rss_before / 2**20,
        "rss_after_mb": None if rss_after is None else rss_after / 2**20,
    }
    ratios = {}
    if accepted and not math.isnan(_c16_p99_ms[regime.name]):
        value = _c16_p99_ms[regime.name] / stats["p99_ms"]
        ratios["c16_p99/overload_p99"] = {"n": 1, "min": value, "median": value, "max": value}
    bench.record(benchmark, ScenarioResult(
        scenario=scenario, regime=regime.name, device=device,
        contenders={"serve": {"label": f"onnxrank serve (server defaults, engine "
                                       f"{bench.engine_label()}) at {OVERLOAD_FACTOR:g}x the "
                                       f"capacity at {CAPACITY_CLIENTS} clients, open loop",
                              "settings": {"threads": bench.threads, "duration_s": duration},
                              "stats": stats}},
        ratios=ratios,
        workload={"requests_per_s": rate, "duration_s": duration, "candidates": candidates},
    ))
    # Every request sent got exactly one answer, and the server counted each once.
    assert load.answered == load.sent, f"lost requests: {load.sent - load.answered} of {load.sent}"
    assert server_total == load.sent, (
        f"the server counted {server_total} answers for {load.sent} requests sent")
    assert counted["200"] == load.statuses.get(200, 0)
    assert counted["429"] == load.statuses.get(429, 0)
