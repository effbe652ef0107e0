"""Budgets: the shipped file's promises, verdicts (ok, FAIL, not enforced, not measured), errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from onnxrank.bench.budgets import BudgetFileError, check_budgets, load_budgets, verdict_table
from onnxrank.bench.harness import ScenarioResult
from onnxrank.bench.paths import DEFAULT_BUDGETS

SHIPPED = DEFAULT_BUDGETS


def _latency(engine_p50: float, st_ratio: float | None, *, regime: str = "short") -> ScenarioResult:
    stats = {"p50_ms": engine_p50, "p95_ms": engine_p50 * 1.5}
    return ScenarioResult(
        scenario="latency", regime=regime, device="cpu",
        contenders={"engine": {"label": "engine", "settings": {}, "stats": stats}},
        ratios={} if st_ratio is None else {"engine/st": {"n": 3, "min": 1.0,
                                                          "median": st_ratio, "max": 9.0}},
        skipped={} if st_ratio is not None else {"st": "skipped: no sentence-transformers"},
    )


def _ceilings(**gop_per_s: float) -> dict[str, dict[str, float]]:
    """A run's GEMM ceilings (onnxrank.bench.ceiling.ceilings), as GOP/s per precision."""
    return {precision: {"ops_per_s": rate * 1e9} for precision, rate in gop_per_s.items()}


# avx2: the ceilings of an EPYC Zen 3 (2026-11-23; its later runs measured int8 at 370 GOP/s, fp32
# not recorded: 148 keeps the speed-up at the 2.5 the shipped bases allow for) and of the Zen 2 of
# 2026-11-25, whose int8 is only 1.15x its fp32
ZEN3 = (_ceilings(int8=221.0, fp32=110.0), _ceilings(int8=370.0, fp32=148.0))
ZEN2 = _ceilings(int8=200.0, fp32=174.0)


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "budgets.toml"
    path.write_text("[calibration]\nreference_ms = 10.0\n" + body)
    return path


def test_shipped_file_holds_the_product_promises() -> None:
    budgets = load_budgets(SHIPPED)
    floors = {(b.device, b.machine_classes, b.scenario, b.regime, b.subject): b.limit
              for b in budgets.budgets if b.metric == "ratio"}
    # the issue "CPU last mile", on the class it was written for: the fastembed promise holds; the
    # sentence-transformers and padding ones are guards below its full run, which missed them
    machine = ("avx512_vnni_bf16",)
    assert 1.0 < floors[("cpu", machine, "latency", "short", "engine/st")] < 6.0
    assert 1.0 < floors[("cpu", machine, "latency", "mixed", "engine/st")] < 12.0
    assert floors[("cpu", machine, "latency", "short", "engine/fastembed")] == 2.0
    assert 1.0 < floors[("cpu", machine, "padding", "mixed", "length_sorted/pad_to_max")] < 3.0
    # avx2: the padding promise holds; the others are guards below what its full run measured
    avx2 = ("avx2",)
    assert floors[("cpu", avx2, "padding", "mixed", "length_sorted/pad_to_max")] == 3.0
    assert 1.0 < floors[("cpu", avx2, "latency", "short", "engine/fastembed")] < 2.0
    # amx: round 2's guards, below the promises it could not meet
    assert floors[("cpu", ("amx",), "latency", "short", "engine/st")] < 6.0
    assert floors[("cpu", ("amx",), "latency", "short", "engine/fastembed")] == 2.0
    # the server against the engine in process: the promise where it held, a guard on the VNNI class
    assert floors[("cpu", ("amx", "avx2"), "serving_c16", None, "serve/rerank_many")] == 0.9
    assert 0.5 < floors[("cpu", machine, "serving_c16", None, "serve/rerank_many")] < 0.9
    # serving: the promises where they were measured to hold, guards below them elsewhere
    fast = ("amx", "avx512_vnni_bf16")
    assert floors[("cpu", ("amx",), "serving_c16", "mixed", "serve/serve_nobatch")] == 1.2
    assert floors[("cpu", fast, "serving_c16", None, "serve/infinity")] == 2.0
    assert floors[("cpu", fast, "serving_embed_c16", None, "serve/infinity")] == 2.0
    assert 0.9 < floors[("cpu", avx2, "serving_c16", "mixed", "serve/serve_nobatch")] < 1.2
    others = ("amx", "avx512", "avx2", "other")
    assert floors[("cpu", others, "serving_embed_c16", None, "serve/embed_inprocess")] == 0.9
    assert 0.5 < floors[("cpu", machine, "serving_embed_c16", None, "serve/embed_inprocess")] < 0.9
    assert floors[("cpu", (), "overhead", None, "engine/raw_infer")] == pytest.approx(1 / 1.05,
                                                                                   abs=1e-3)
    assert floors[("cpu", (), "order_check", None, "copy_a/copy_b")] == 0.93
    shares = {(b.machine_classes, b.scenario, b.regime, b.subject): b.limit
              for b in budgets.budgets if b.metric == "ceiling_share"}
    for machine in [("amx",), ("avx2",)]:
        assert shares[(machine, "latency", "short", "engine")] == 0.4
    # missed in 2 of 4 full runs on that class: a guard below the promise
    assert shares[(("avx512_vnni_bf16",), "latency", "short", "engine")] == 0.3
    assert floors[("cuda", (), "latency", "short", "engine/st")] == 2.5
    # issue 53's bar for the defaults, on the class it was written for: speed and fidelity
    machine = ("avx512_vnni_bf16",)
    assert floors[("cpu", machine, "peers", "short", "engine/st_openvino_int8")] == 1.5
    assert floors[("cpu", machine, "peers", "mixed", "engine/st_openvino_int8")] == 2.0
    fidelity = {(b.machine_classes, b.scenario, b.regime, b.subject, b.metric): b.limit
                for b in budgets.budgets if b.metric in ("spearman", "top10_overlap")}
    assert fidelity == {(machine, "peers", None, "engine", "spearman"): 0.99,
                        (machine, "peers", None, "engine", "top10_overlap"): 0.95}
    assert floors[("cuda", (), "padding", "mixed", "length_sorted/pad_to_max")] == 3.0
    # absolute latencies and runtime-against-runtime ratios are always per class
    for budget in budgets.budgets:
        if budget.device == "cpu" and (budget.metric in ("p50_ms", "p95_ms", "ceiling_share",
                                                         "pareto", "spearman", "top10_overlap")
                                       or budget.subject.split("/")[1] in (
                                           "st", "naive_ort", "fastembed", "pad_to_max",
                                           "infinity", "serve_nobatch")):
            assert budget.machine_classes, budget
    assert all(b.model == "minilm-standin" for b in budgets.budgets)


def test_shipped_avx2_floors_against_pytorch_follow_each_chips_ceilings() -> None:
    budgets = load_budgets(SHIPPED)
    scaled = {(b.scenario, b.regime, b.subject): b for b in budgets.budgets if b.scaling}
    # what each chip measured: the Zen 3 in its full runs (the lowest of them), the Zen 2 where
    # recorded (its embeddings broke the fixed floors of 1.6 and 1.9)
    recorded = {
        ("latency", "short", "engine/st"): (1.50, None, 6.0),
        ("latency", "mixed", "engine/st"): (3.47, None, 12.0),
        ("serving_c16", "short", "serve/infinity"): (1.42, None, 2.0),
        ("serving_c16", "mixed", "serve/infinity"): (2.08, None, 2.0),
        ("serving_embed_c16", "short", "serve/infinity"): (1.78, 1.36, 2.0),
        ("serving_embed_c16", "mixed", "serve/infinity"): (2.15, 1.60, 2.0),
    }
    assert set(scaled) == set(recorded)
    for key, (on_zen3, on_zen2, promise) in recorded.items():
        budget = scaled[key]
        assert budget.machine_classes == ("avx2",) and budget.scaling is not None
        for ceilings in ZEN3:
            floor, _ = budget.scaling.derive(ceilings, "")
            assert floor is not None and 1.2 < floor < min(on_zen3, promise), key
        zen2_floor, _ = budget.scaling.derive(ZEN2, "")
        assert zen2_floor is not None
        # the Zen 2's weaker int8 lowers the floor to about 0.8 of the Zen 3's
        assert 1.0 < zen2_floor < 0.81 * budget.scaling.derive(ZEN3[0], "")[0], key
        if on_zen2 is not None:
            assert zen2_floor < on_zen2 < 0.9 * floor, key


def test_budgets_of_another_machine_class_are_reported_not_enforced(tmp_path: Path) -> None:
    budgets = load_budgets(_write(tmp_path, """
model = "*"
[[cpu]]
machine_class = "amx"
scenario = "latency"
ratio = "engine/st"
min_ratio = 6.0

[[cpu]]
machine_class = ["avx2", "avx512"]
scenario = "latency"
ratio = "engine/st"
min_ratio = 2.5

[[cpu]]
scenario = "latency"
ratio = "engine/st"
min_ratio = 2.0
"""))
    verdicts = check_budgets(budgets, _latency(10.0, 3.0), model="m", scale=1.0,
                             machine_class="avx2")
    assert [v.verdict for v in verdicts] == [
        "not enforced: budget is for machine class amx, this machine is avx2", "ok", "ok"]
    verdicts = check_budgets(budgets, _latency(10.0, 3.0), model="m", scale=1.0,
                             machine_class="amx")
    assert [v.verdict for v in verdicts] == [
        "FAIL", "not enforced: budget is for machine class avx2 or avx512, this machine is amx",
        "ok"]
    table = verdict_table(verdicts)
    assert re.search(r"latency/short engine/st ratio\s+cpu\s+amx\s+3\.00x\s+>= 6\.00x\s+FAIL",
                     table)
    assert re.search(r"cpu\s+avx2,avx512\s+3\.00x", table)
    assert re.search(r"cpu\s+any\s+3\.00x\s+>= 2\.00x\s+ok", table)


def test_verdicts_scale_latency_and_floor_ratios(tmp_path: Path) -> None:
    budgets = load_budgets(_write(tmp_path, """
model = "*"
[[cpu]]
scenario = "latency"
regime = "short"
p50_ms = 100.0
ratio = "engine/st"
min_ratio = 2.5
"""))
    # scale 2: the machine is twice as slow as the reference, so 150 ms <= 200 ms passes.
    verdicts = check_budgets(budgets, _latency(150.0, 3.0), model="tiny", scale=2.0, machine_class="avx2")
    assert [(v.budget.metric, v.allowed, v.verdict) for v in verdicts] == [
        ("p50_ms", 200.0, "ok"), ("ratio", 2.5, "ok")]
    verdicts = check_budgets(budgets, _latency(250.0, 2.0), model="tiny", scale=2.0, machine_class="avx2")
    assert [v.verdict for v in verdicts] == ["FAIL", "FAIL"]
    table = verdict_table(verdicts)
    assert "latency/short engine p50_ms    cpu     any    250.00 ms  <= 200.00 ms  FAIL" in table
    assert "latency/short engine/st ratio" in table and ">= 2.50x" in table
    # Another regime or device: the budget does not apply.
    assert check_budgets(budgets, _latency(250.0, 2.0, regime="long"), model="tiny",
                         scale=1.0, machine_class="avx2") == []


def test_budgets_for_another_model_are_reported_not_enforced() -> None:
    budgets = load_budgets(SHIPPED)
    verdicts = check_budgets(budgets, _latency(1e9, 0.1), model="tiny-reranker", scale=1.0,
                             machine_class="avx2")
    assert verdicts and not any(v.failed for v in verdicts)
    assert verdicts[0].verdict == (
        "not enforced: budget is for model 'minilm-standin', this run used 'tiny-reranker' "
        "(latencies and ratios depend on model size)"
    )
    verdicts = check_budgets(budgets, _latency(1e9, 0.1), model="minilm-standin", scale=1.0,
                             machine_class="avx2", ceilings=ZEN3[0])
    assert {v.verdict for v in verdicts if v.measured is not None
            and v.budget.machine_classes in ((), ("avx2",))} == {"FAIL"}


def test_missing_baseline_is_not_measured(tmp_path: Path) -> None:
    budgets = load_budgets(_write(tmp_path, '[[cpu]]\nscenario = "latency"\nratio = "engine/st"\n'
                                            "min_ratio = 2.5\n"))
    [verdict] = check_budgets(budgets, _latency(10.0, None), model="m", scale=1.0,
                               machine_class="avx2")
    assert verdict.verdict == "not measured: skipped: no sentence-transformers"
    assert not verdict.failed


SCALED = """
model = "*"
[[cpu]]
scenario = "serving_embed_c16"
regime = "short"
ratio = "serve/infinity"
min_ratio = { base = 1.12, gemm_share = 0.5, ceilings = "best/fp32" }

[[cpu]]
scenario = "serving_embed_c16"
ratio = "serve/infinity"
min_ratio = 1.3
"""


def _serving(ratio: float) -> ScenarioResult:
    return ScenarioResult(
        scenario="serving_embed_c16", regime="short", device="cpu",
        contenders={"serve": {"label": "serve", "settings": {}, "stats": {}}},
        ratios={"serve/infinity": {"n": 6, "min": ratio, "median": ratio, "max": ratio}},
    )


def test_a_scaled_floor_follows_the_runs_ceilings(tmp_path: Path) -> None:
    budgets = load_budgets(_write(tmp_path, SCALED))
    # the same 1.36x passes on the Zen 2 (int8 1.15x fp32: floor 1.20) and fails on a chip of
    # the class whose int8 is 2x its fp32 (floor 1.49); the fixed floor is the same on both
    on_zen2 = check_budgets(budgets, _serving(1.36), model="m", scale=1.0, machine_class="avx2",
                            ceilings=ZEN2)
    on_zen3 = check_budgets(budgets, _serving(1.36), model="m", scale=1.0, machine_class="avx2",
                            ceilings=ZEN3[0])
    assert [(v.allowed, v.verdict) for v in on_zen2] == [
        (pytest.approx(1.12 / (0.5 + 0.5 * 174 / 200)), "ok"), (1.3, "ok")]
    assert [(v.allowed, v.verdict) for v in on_zen3] == [
        (pytest.approx(1.12 / (0.5 + 0.5 * 110 / 221)), "FAIL"), (1.3, "ok")]
    # "best" is the fastest precision measured (bf16 here), a named one is that one; with
    # gemm_share = 1 the floor is base x speed-up
    ceilings = _ceilings(int8=200.0, bf16=400.0, fp32=100.0)
    best = check_budgets(budgets, _serving(1.0), model="m", scale=1.0, machine_class="avx2",
                         ceilings=ceilings)[0]
    assert best.allowed == pytest.approx(1.12 / (0.5 + 0.5 / 4))
    assert best.derivation.endswith("4.00 = best (bf16) 400 / fp32 100 GOP/s")
    named = load_budgets(_write(tmp_path, SCALED.replace(
        'base = 1.12, gemm_share = 0.5, ceilings = "best/fp32"',
        'base = 0.5, gemm_share = 1.0, ceilings = "int8/fp32"')))
    verdict = check_budgets(named, _serving(1.0), model="m", scale=1.0, machine_class="avx2",
                            ceilings=ceilings)[0]
    assert (verdict.allowed, verdict.verdict) == (pytest.approx(1.0), "ok")
    assert verdict.derivation == "0.50 / (0.00 + 1.00 / 2.00); 2.00 = int8 200 / fp32 100 GOP/s"


def test_the_verdict_table_shows_how_a_scaled_floor_was_derived(tmp_path: Path) -> None:
    budgets = load_budgets(_write(tmp_path, SCALED))
    verdicts = check_budgets(budgets, _serving(1.36), model="m", scale=1.0, machine_class="avx2",
                             ceilings=ZEN2)
    assert verdicts[0].derivation == (
        "1.12 / (0.50 + 0.50 / 1.15); 1.15 = best (int8) 200 / fp32 174 GOP/s")
    assert verdicts[1].derivation == ""
    table = verdict_table(verdicts).splitlines()
    assert re.search(r"serving_embed_c16/short serve/infinity ratio\s+cpu\s+any\s+1\.36x\s+"
                     r">= 1\.20x \[1\]\s+ok$", table[1])
    assert re.search(r"1\.36x\s+>= 1\.30x\s+ok$", table[2])
    assert table[3] == ("[1] serving_embed_c16/short serve/infinity ratio: budget = 1.12 / "
                        "(0.50 + 0.50 / 1.15); 1.15 = best (int8) 200 / fp32 174 GOP/s")
    assert len(table) == 4


@pytest.mark.parametrize(("ceilings", "note", "reason"), [
    (None, "the ceiling scenario did not run",
     "no GEMM ceiling was measured (the ceiling scenario did not run)"),
    ({}, "the GEMM ceiling is measured on CPU only",
     "no GEMM ceiling was measured (the GEMM ceiling is measured on CPU only)"),
    (_ceilings(int8=200.0), "", "no fp32 GEMM ceiling was measured on this machine"),
], ids=["not-run", "none", "no-fp32"])
def test_a_scaled_floor_without_its_ceilings_is_not_enforced(
    tmp_path: Path, ceilings: dict[str, dict[str, float]] | None, note: str, reason: str
) -> None:
    budgets = load_budgets(_write(tmp_path, SCALED))
    scaled, fixed = check_budgets(budgets, _serving(0.5), model="m", scale=1.0,
                                  machine_class="avx2", ceilings=ceilings, ceiling_note=note)
    assert scaled.verdict == f"not enforced: the floor follows the GEMM ceilings, and {reason}"
    assert (scaled.measured, scaled.allowed, scaled.failed) == (0.5, None, False)
    # the table says so and gives the formula it could not evaluate
    table = verdict_table([scaled])
    assert ">= not derived [1]" in table
    assert table.endswith("budget = 1.12 / (0.50 + 0.50 / (best/fp32 GEMM ceilings))")
    # the fixed floor beside it is enforced as always
    assert fixed.verdict == "FAIL"


def test_fixed_floors_do_not_depend_on_the_ceilings(tmp_path: Path) -> None:
    budgets = load_budgets(_write(tmp_path, 'model = "*"\n[[cpu]]\nscenario = "serving_embed_c16"\n'
                                            'ratio = "serve/infinity"\nmin_ratio = 1.3\n'))
    [budget] = budgets.budgets
    assert (budget.limit, budget.scaling) == (1.3, None)
    for ceilings in (None, ZEN2, ZEN3[0]):
        [verdict] = check_budgets(budgets, _serving(1.25), model="m", scale=2.0,
                                  machine_class="avx2", ceilings=ceilings)
        assert (verdict.allowed, verdict.verdict, verdict.derivation) == (1.3, "FAIL", "")
        assert verdict_table([verdict]).endswith(">= 1.30x  FAIL")


@pytest.mark.parametrize(("min_ratio", "message"), [
    ('{ base = 1.1, ceilings = "best/fp32" }',
     'a min_ratio table needs exactly the keys base, gemm_share, ceilings, got base, ceilings; '
     'e.g. min_ratio = { base = 1.12, gemm_share = 0.5, ceilings = "best/fp32" }'),
    ('{ base = 1.1, gemm_share = 0.5, ceilings = "best/fp32", share = 0.8 }',
     "needs exactly the keys base, gemm_share, ceilings, got base, ceilings, gemm_share, share"),
    ('{ base = 1.1, gemm_share = 1.5, ceilings = "best/fp32" }',
     "min_ratio needs base > 0 and 0 < gemm_share <= 1, got base = 1.1, gemm_share = 1.5"),
    ('{ base = -1, gemm_share = 0.5, ceilings = "best/fp32" }',
     "min_ratio needs base > 0 and 0 < gemm_share <= 1, got base = -1.0, gemm_share = 0.5"),
    ('{ base = "1.1", gemm_share = 0.5, ceilings = "best/fp32" }',
     "min_ratio.base must be a number, got '1.1'"),
    ('{ base = 1.1, gemm_share = 0.5, ceilings = "best" }',
     'min_ratio.ceilings must be "FASTER/SLOWER" with FASTER one of best, int8, bf16, fp32 and '
     "SLOWER one of int8, bf16, fp32, got 'best'"),
    ('{ base = 1.1, gemm_share = 0.5, ceilings = "fp32/best" }',
     "SLOWER one of int8, bf16, fp32, got 'fp32/best'"),
    ('{ base = 1.1, gemm_share = 0.5, ceilings = "fp64/fp32" }', "got 'fp64/fp32'"),
    ('{ base = 1.1, gemm_share = 0.5, ceilings = 2 }', "got 2"),
    ('"2.5"', "min_ratio must be a number, got '2.5'"),
    ("true", "min_ratio must be a number, got True"),
])
def test_a_malformed_min_ratio_is_a_budget_file_error(tmp_path: Path, min_ratio: str,
                                                      message: str) -> None:
    path = _write(tmp_path, f'[[cpu]]\nscenario = "latency"\nratio = "engine/st"\n'
                            f"min_ratio = {min_ratio}\n")
    with pytest.raises(BudgetFileError,
                       match=re.escape(f"{path} [[cpu]] entry 1: ") + ".*" + re.escape(message)):
        load_budgets(path)


@pytest.mark.parametrize(("body", "message"), [
    ('[[cpu]]\nregime = "short"\np50_ms = 1.0\n',
     "entry 1 needs a scenario, e.g. scenario = \"latency\""),
    ('[[cpu]]\nscenario = "latency"\np99_ms = 1.0\n',
     "entry 1 has unknown keys ['p99_ms']; allowed: contender, machine_class, "
     "min_ceiling_share, min_ratio, min_spearman, min_top10_overlap, model, note, p50_ms, p95_ms, "
     "pareto, ratio, regime, scenario"),
    ('[[cpu]]\nscenario = "latency"\nmachine_class = "sse"\np50_ms = 1.0\n',
     "entry 1: unknown machine_class ['sse']; choose from amx, avx512_vnni_bf16, avx512, avx2, "
     "other"),
    ('[[cpu]]\nscenario = "latency"\nmachine_class = 2\np50_ms = 1.0\n',
     "entry 1: machine_class must be a class name or a list of them, got 2"),
    ('[[cpu]]\nscenario = "latency"\nratio = "engine/st"\n',
     "entry 1: ratio and min_ratio go together, e.g. ratio = \"engine/st\", min_ratio = 2.5"),
    ('[[cpu]]\nscenario = "latency"\n',
     "entry 1 sets no limit; give p50_ms, p95_ms, ratio with min_ratio, min_ceiling_share, "
     "pareto, min_spearman or min_top10_overlap"),
    ('[[gpu]]\nscenario = "latency"\n',
     "has unknown top-level keys ['gpu']; allowed: calibration, model, cpu, cuda"),
    ('[[cpu]]\nscenario = "latency"\np50_ms = "fast"\n', "entry 1: p50_ms must be a number, got 'fast'"),
    ("[[cpu]\n", "is not valid TOML"),
])
def test_malformed_files_name_the_problem(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(BudgetFileError, match=re.escape(message)):
        load_budgets(_write(tmp_path, body))


def test_calibration_is_required(tmp_path: Path) -> None:
    path = tmp_path / "b.toml"
    path.write_text("[[cpu]]\nscenario = 'latency'\np50_ms = 1.0\n")
    with pytest.raises(BudgetFileError, match=re.escape(
        f"{path} needs [calibration] reference_ms (the calibration time on the reference "
        "machine); see onnxrank/bench/suite/budgets.toml"
    )):
        load_budgets(path)


def test_a_quick_run_reports_budgets_without_enforcing_them(tmp_path: Path) -> None:
    budgets = load_budgets(_write(tmp_path, 'model = "*"\n[[cpu]]\nscenario = "latency"\n'
                                            'p50_ms = 1.0\nratio = "engine/st"\nmin_ratio = 9.0\n'))
    reason = "quick run (10 candidates, 2 queries): budgets hold for the full workload"
    verdicts = check_budgets(budgets, _latency(500.0, 1.0), model="m", scale=1.0,
                             machine_class="avx2", not_enforced=reason)
    assert [v.verdict for v in verdicts] == [f"not enforced: {reason}"] * 2
    assert [v.measured for v in verdicts] == [500.0, 1.0] and not any(v.failed for v in verdicts)
    # The same result in a full run breaks both.
    assert [v.verdict for v in check_budgets(budgets, _latency(500.0, 1.0), model="m",
                                             scale=1.0, machine_class="avx2")] == ["FAIL", "FAIL"]


def test_ceiling_share_floor(tmp_path: Path) -> None:
    budgets = load_budgets(_write(tmp_path, 'model = "*"\n[[cpu]]\nscenario = "latency"\n'
                                            'contender = "engine"\nmin_ceiling_share = 0.4\n'))
    result = _latency(10.0, 3.0)
    stats = result.contenders["engine"]["stats"]
    stats.update(ceiling_share=0.35, ceiling_note="")
    [verdict] = check_budgets(budgets, result, model="m", scale=3.0, machine_class="avx2")
    # a floor: never scaled by the calibration
    assert (verdict.budget.metric, verdict.measured, verdict.allowed, verdict.verdict) == (
        "ceiling_share", 0.35, 0.4, "FAIL")
    assert re.search(r"latency/short engine ceiling_share\s+cpu\s+any\s+0\.35\s+>= 0\.40\s+FAIL",
                     verdict_table([verdict]))
    stats.update(ceiling_share=0.5)
    assert check_budgets(budgets, result, model="m", scale=3.0, machine_class="avx2")[0].verdict == "ok"
    stats.update(ceiling_share=None, ceiling_note="no int8 GEMM ceiling was measured here")
    assert check_budgets(budgets, result, model="m", scale=3.0, machine_class="avx2")[0].verdict == (
        "not measured: no int8 GEMM ceiling was measured here")
