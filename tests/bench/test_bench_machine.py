"""Machine classes and instruction peaks (onnxrank.bench.machine), from cpuinfo files written here
for each kind of CPU, and this machine's class against what OpenVINO reports."""

from __future__ import annotations

from pathlib import Path

import openvino
import pytest

from onnxrank.bench.machine import (
    MACHINE_CLASSES,
    CpuFacts,
    classify,
    describe_machine,
    instruction_peaks,
    ops_per_cycle,
    read_cpu,
)

BASE = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx f16c"
SAPPHIRE_RAPIDS = (BASE + " fma avx2 avx512f avx512bw avx512_vnni avx512_bf16 amx_tile amx_int8 "
                   "amx_bf16")
ZEN4 = BASE + " fma avx2 avx512f avx512bw avx512_vnni avx512_bf16"
SKYLAKE_SP = BASE + " fma avx2 avx512f avx512bw"
ZEN3 = BASE + " fma avx2"


def _cpuinfo(tmp_path: Path, *, vendor: str, family: int, flags: str, model: str,
             mhz: str = "2445.406") -> Path:
    block = (f"processor\t: {{n}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\n"
             f"model name\t: {model}\ncpu MHz\t\t: {mhz}\nflags\t\t: {flags}\n\n")
    path = tmp_path / "cpuinfo"
    # the second processor says something else: only the first is read
    path.write_text(block.format(n=0) + block.format(n=1).replace(flags, "fpu"))
    return path


@pytest.mark.parametrize(("flags", "expected"), [
    (SAPPHIRE_RAPIDS, "amx"),
    (ZEN4, "avx512_vnni_bf16"),
    (SKYLAKE_SP, "avx512"),
    (BASE + " fma avx2 avx512f avx512_vnni", "avx512"),  # Cascade Lake: VNNI without BF16
    (ZEN3, "avx2"),
    (BASE + " avx2", "other"),  # no FMA
    ("", "other"),
])
def test_classes_follow_the_flags(flags: str, expected: str) -> None:
    assert classify(frozenset(flags.split())) == expected
    assert expected in MACHINE_CLASSES


def test_read_cpu_takes_the_first_processor_and_its_clock(tmp_path: Path) -> None:
    cpuinfo = _cpuinfo(tmp_path, vendor="AuthenticAMD", family=25, flags=ZEN3, model="AMD EPYC")
    facts = read_cpu(cpuinfo, tmp_path / "no-cpufreq")
    assert (facts.vendor, facts.family, facts.flags) == ("AuthenticAMD", 25,
                                                         frozenset(ZEN3.split()))
    assert facts.clock_ghz == pytest.approx(2.445406)
    assert facts.clock_source == "cpu MHz in /proc/cpuinfo (may be the base clock)"
    assert facts.source == str(cpuinfo)
    # the model name's stated clock wins over cpu MHz, the cpufreq maximum over both
    cpuinfo = _cpuinfo(tmp_path, vendor="GenuineIntel", family=6, flags=SKYLAKE_SP,
                       model="Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz")
    assert read_cpu(cpuinfo, tmp_path / "no-cpufreq").clock_ghz == pytest.approx(2.4)
    (tmp_path / "max_freq").write_text("3700000\n")
    facts = read_cpu(cpuinfo, tmp_path / "max_freq")
    assert (facts.clock_ghz, facts.clock_source) == (3.7, f"{tmp_path / 'max_freq'} (kHz)")


def test_no_cpuinfo_is_class_other_with_the_reason(tmp_path: Path) -> None:
    facts = read_cpu(tmp_path / "absent", tmp_path / "absent-too")
    assert classify(facts.flags) == "other" and facts.clock_ghz is None
    assert facts.source.startswith(f"no flags: {tmp_path / 'absent'}: ")
    assert describe_machine(facts, 2)["peaks"] == {}


@pytest.mark.parametrize(("vendor", "family", "flags", "expected"), [
    # AMX tiles for int8 and bf16, two 512-bit FMA units for fp32
    ("GenuineIntel", 6, SAPPHIRE_RAPIDS, {"fp32": 64, "int8": 2048, "bf16": 1024}),
    # Zen 4 runs 512-bit instructions as two 256-bit halves
    ("AuthenticAMD", 25, ZEN4, {"fp32": 32, "int8": 128, "bf16": 64}),
    # the same instructions on a full 512-bit datapath
    ("AuthenticAMD", 26, ZEN4, {"fp32": 64, "int8": 256, "bf16": 128}),
    ("GenuineIntel", 6, SKYLAKE_SP, {"fp32": 64, "int8": 128}),
    ("AuthenticAMD", 25, ZEN3, {"fp32": 32, "int8": 64}),
    ("GenuineIntel", 6, ZEN3 + " avx_vnni", {"fp32": 32, "int8": 128}),
])
def test_ops_per_cycle_per_instruction_set(vendor: str, family: int, flags: str,
                                           expected: dict[str, int]) -> None:
    facts = CpuFacts(vendor, family, frozenset(flags.split()), 2.0, "test", "test")
    assert {name: rate for name, (rate, _) in ops_per_cycle(facts).items()} == expected


def test_peak_is_cores_times_clock_times_ops_per_cycle(tmp_path: Path) -> None:
    cpuinfo = _cpuinfo(tmp_path, vendor="AuthenticAMD", family=25, flags=ZEN4, model="AMD EPYC",
                       mhz="2500.0")
    peaks = instruction_peaks(read_cpu(cpuinfo, tmp_path / "none"), cores=2)
    assert peaks["int8"]["ops_per_s"] == pytest.approx(2 * 2.5e9 * 128)
    assert peaks["int8"]["formula"] == "2 cores x 2.50 GHz x 128 ops/cycle"
    assert peaks["int8"]["instruction"] == "AVX-512 VNNI (vpdpbusd), 256-bit datapath, 2 pipes"
    assert peaks["fp32"]["ops_per_s"] == pytest.approx(2 * 2.5e9 * 32)
    no_clock = CpuFacts("AuthenticAMD", 25, frozenset(ZEN3.split()), None, "unknown", "test")
    assert instruction_peaks(no_clock, cores=2)["fp32"]["ops_per_s"] is None


def test_this_machine_agrees_with_openvino() -> None:
    # OpenVINO reports BF16 exactly where the flags give a class with bf16 instructions.
    machine = describe_machine(read_cpu(), cores=1)
    reports_bf16 = "BF16" in openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    assert reports_bf16 == (machine["machine_class"] in ("amx", "avx512_vnni_bf16")), machine
    assert ("bf16" in machine["peaks"]) == reports_bf16
