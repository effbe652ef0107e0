"""`onnxrank bench`: run the benchmark suite (pytest-benchmark scenarios under bench/)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from onnxrank._optional import require
from onnxrank.bench.budgets import load_budgets
from onnxrank.bench.environment import parse_devices
from onnxrank.bench.workloads import REGIMES, parse_regimes
from onnxrank.cli.common import HelpFormatter, env_default, env_name
from onnxrank.engine.reranker import Reranker

logger = logging.getLogger(__name__)

# The suite lives beside the package in a source checkout (pip install -e .[bench]).
REPOSITORY = Path(__file__).resolve().parents[2]
BENCH_DIR = REPOSITORY / "bench"
SCENARIO_FILES = {
    "latency": "test_latency.py",
    "throughput": "test_throughput.py",
    "sweeps": "test_sweeps.py",
    "long_documents": "test_long_documents.py",
    "retrieval_stages": "test_retrieval_stages.py",
    "order_check": "test_order_check.py",
}
PYTEST_BENCHMARK_JSON = "pytest-benchmark.json"

EPILOG = f"""examples:
  onnxrank bench --quick                         # < 2 minutes: checks the suite, not the numbers
  onnxrank bench --model minilm-standin --out bench/results/full    # the full CPU run
  onnxrank bench --device cpu,cuda --regimes short,mixed --scenarios latency
  onnxrank bench --quick --budgets my_budgets.toml

Outputs in --out: summary.md (tables), summary.json (our summary), {PYTEST_BENCHMARK_JSON}
(pytest-benchmark's raw data, with device and settings in extra_info) and PNG plots.
Exit status: 0 when every enforced budget holds, 1 when one is broken (or a scenario failed),
2 on bad arguments. Every flag has an environment twin: ONNXRANK_<FLAG>, e.g. ONNXRANK_OUT.
See docs/benchmarks.md.
"""


def _parse_scenarios(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in SCENARIO_FILES]
    if unknown or not names:
        raise ValueError(
            f"unknown scenarios {unknown or value!r}; choose from {', '.join(SCENARIO_FILES)} "
            "(comma-separated)"
        )
    return names


def run_bench(args: argparse.Namespace) -> int:
    """Check the arguments, then run the selected scenario files under pytest.

    Raises:
        ValueError: Bad --device, --regimes, --scenarios or --threads; a missing or malformed
            budgets file or dataset; no bench/ suite beside the package.
        ModelLoadError: --model is not an exported model.
        MissingDependencyError: pytest or pytest-benchmark is not installed.
    """
    if not (BENCH_DIR / "conftest.py").is_file():
        raise ValueError(
            f"the benchmark suite is not at {BENCH_DIR}: `onnxrank bench` runs from a source "
            "checkout; clone the repository and `pip install -e .[bench]`"
        )
    parse_devices(args.device)
    parse_regimes(args.regimes)
    scenarios = _parse_scenarios(args.scenarios)
    if not Path(args.budgets).is_file():
        raise ValueError(f"budgets file {args.budgets} does not exist; pass --budgets FILE "
                         f"(the default is {BENCH_DIR / 'budgets.toml'})")
    load_budgets(args.budgets)
    for flag, value in (("--threads", args.threads), ("--queries", args.queries)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if not (Path(args.dataset) / "corpus.jsonl").is_file():
        raise ValueError(
            f"could not find corpus.jsonl in {args.dataset}; --dataset takes a directory with "
            "corpus.jsonl and queries.jsonl"
        )
    # Load the model once here: a missing model is one clear error instead of one per scenario.
    Reranker.from_pretrained(args.model, models_dir=args.models_dir, device="cpu", threads=1)
    pytest = require("pytest", extra="bench")
    require("pytest_benchmark", extra="bench")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pytest_args = [
        *(str(BENCH_DIR / SCENARIO_FILES[name]) for name in scenarios),
        f"--rootdir={REPOSITORY}",
        "-p", "no:cacheprovider",
        f"--benchmark-json={out / PYTEST_BENCHMARK_JSON}",
        "--benchmark-columns=min,median,max,rounds",
        f"--bench-model={args.model}",
        f"--bench-models-dir={args.models_dir}",
        f"--bench-embedder={args.embedder}",
        f"--bench-dataset={args.dataset}",
        f"--bench-device={args.device}",
        f"--bench-regimes={args.regimes}",
        f"--bench-out={out}",
        f"--bench-budgets={args.budgets}",
        "-rs",
    ]
    if args.quick:
        pytest_args.append("--bench-quick")
    if args.threads is not None:
        pytest_args.append(f"--bench-threads={args.threads}")
    if args.queries is not None:
        pytest_args.append(f"--bench-queries={args.queries}")
    logger.info("pytest %s", " ".join(pytest_args))
    code = int(pytest.main(pytest_args))
    print(f"onnxrank bench: report in {out} (summary.md, summary.json, "
          f"{PYTEST_BENCHMARK_JSON}, *.png); exit status {code}")
    return code


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `bench` subcommand."""
    parser = subparsers.add_parser(
        "bench",
        help="benchmark latency, throughput and batching against baselines, with budgets",
        description="Run the benchmark suite: every scenario on every requested device, the "
                    "engine interleaved with sentence-transformers, a naive onnxruntime loop and "
                    "fastembed; write JSON, markdown and PNG plots; fail when a budget is broken.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--quick", action="store_true",
                        default=env_default("quick", "") not in ("", "0", "false"),
                        help="2 queries of 10 candidates per scenario (< 2 minutes): checks the "
                        f"suite, not the numbers; env {env_name('quick')}")
    parser.add_argument("--device", default=env_default("device", "all"),
                        help="devices, comma-separated: cpu, cuda, or all (cuda rows say "
                             "'unavailable' without a CUDAExecutionProvider)")
    parser.add_argument("--regimes", default=env_default("regimes", ",".join(REGIMES)),
                        help="document-length regimes of the latency and throughput scenarios")
    parser.add_argument("--scenarios", default=env_default("scenarios", ",".join(SCENARIO_FILES)),
                        help="scenario groups to run")
    parser.add_argument("--model", default=env_default("model", "minilm-standin"),
                        help="model name under --models-dir, or a model directory")
    parser.add_argument("--embedder", default=env_default("embedder", "minilm-embedder"),
                        help="embedding model (name or directory) for the retrieval-stages "
                             "scenario")
    parser.add_argument("--models-dir", default=env_default("models-dir", "models"),
                        help="where model names are looked up")
    parser.add_argument("--dataset", default=env_default("dataset",
                                                         str(BENCH_DIR / "data" / "cranfield-sample")),
                        help="dataset directory (corpus.jsonl, queries.jsonl) the workloads are "
                             "cut from")
    parser.add_argument("--out", default=env_default("out", str(BENCH_DIR / "results" / "latest")),
                        help="report directory")
    parser.add_argument("--budgets", default=env_default("budgets", str(BENCH_DIR / "budgets.toml")),
                        help="budgets file (TOML); see docs/benchmarks.md")
    parser.add_argument("--queries", type=int, default=env_default("queries", None),
                        help="queries of the latency and retrieval-stages scenarios (default: 20, "
                             "or 2 with --quick); more queries make p95/p99 meaningful")
    parser.add_argument("--threads", type=int, default=env_default("threads", None),
                        help="threads for every runtime (default: the CPUs this process may use)")
    parser.set_defaults(handler=run_bench)
