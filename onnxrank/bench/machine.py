"""What kind of CPU this is: its machine class, which budgets are set per, and its peak arithmetic
rate per precision estimated from its instructions, the ceiling's second reference.

Machine classes, most capable first; a CPU is the first whose flags (``/proc/cpuinfo``) it has:

1. ``amx``: AMX tiles with int8 and bf16 (Intel Xeon from Sapphire Rapids on);
2. ``avx512_vnni_bf16``: AVX-512 with VNNI and BF16, no AMX (AMD Zen 4 and later, Intel Cooper
   Lake);
3. ``avx512``: AVX-512 without those (Intel Skylake-SP, Cascade/Ice Lake without BF16);
4. ``avx2``: AVX2 and FMA only (AMD Zen 1-3, most Intel client CPUs);
5. ``other``: anything else, or flags that cannot be read.

The peak of a precision is an estimate, never a measurement:
``peak ops/s = cores × clock × ops per cycle per core`` (an FMA or multiply-add counts two ops).
The ops per cycle per core assume two vector pipes that take the instruction, as on the AVX-512
Xeons with two FMA units and on AMD Zen (two FMA pipes); Xeons with one AVX-512 FMA unit reach
half. The sources of the per-cycle numbers:

- FMA (fp32): ``2 pipes × lanes × 2``, lanes = datapath bits / 32: 32 with AVX2 (256 bits), 64
  with AVX-512 on Intel; AMD Zen 4 executes a 512-bit instruction as two 256-bit halves (AMD,
  Software Optimization Guide for Family 19h), so 32 there. Intel 64 and IA-32 Architectures
  Optimization Reference Manual for the two FMA units.
- int8 with AVX-512 VNNI (``vpdpbusd``: 4 u8×s8 multiply-adds per 32-bit lane, Intel SDM):
  ``2 × lanes × 4 × 2``: 256 on Intel, 128 on Zen 4; AVX-VNNI (256-bit): 128.
- int8 without VNNI (``vpmaddubsw`` then ``vpmaddwd``, two instructions per 2 multiply-adds of a
  16-bit lane): ``2 × bytes per vector / 2 × 2``: 64 with AVX2, 128 with AVX-512BW on Intel.
- bf16 with AVX512_BF16 (``vdpbf16ps``: 2 multiply-adds per 32-bit lane): ``2 × lanes × 2 × 2``:
  128 on Intel, 64 on Zen 4.
- AMX (TMUL): 2,048 int8 and 1,024 bf16 ops per cycle per core (Intel Optimization Reference
  Manual, AMX chapter: 4th Gen Xeon).

The clock is the highest the system states: ``cpuinfo_max_freq`` under /sys, else the model
name's "@ 2.40GHz", else ``cpu MHz`` of /proc/cpuinfo (in a VM often the base clock: a core that
boosts beyond it runs faster than this "peak").
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

CPUINFO = Path("/proc/cpuinfo")
MAX_FREQUENCY = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
OTHER_CLASS = "other"
# Most capable first: a CPU belongs to the first class whose flags it has all of.
CLASS_FLAGS: dict[str, tuple[str, ...]] = {
    "amx": ("amx_tile", "amx_int8", "amx_bf16"),
    "avx512_vnni_bf16": ("avx512f", "avx512_vnni", "avx512_bf16"),
    "avx512": ("avx512f",),
    "avx2": ("avx2", "fma"),
}
MACHINE_CLASSES = (*CLASS_FLAGS, OTHER_CLASS)
# The flags the class and the peaks are read from (reported with them).
RELEVANT_FLAGS = frozenset({flag for needed in CLASS_FLAGS.values() for flag in needed}
                           | {"avx_vnni", "avx512bw"})
VECTOR_PIPES = 2
AMX_OPS_PER_CYCLE = {"int8": 2048, "bf16": 1024}
AMD_DOUBLE_PUMPED_FAMILY = 0x19  # Zen 4 runs 512-bit instructions on 256-bit units


@dataclass(frozen=True, slots=True)
class CpuFacts:
    """What the system says about its CPU.

    Attributes:
        vendor: ``vendor_id`` (GenuineIntel, AuthenticAMD), or "" when unknown.
        family: ``cpu family``, or None.
        flags: Instruction-set flags as Linux names them (avx2, avx512_vnni, amx_int8 ...).
        clock_ghz: The highest clock the system states, or None.
        clock_source: Where `clock_ghz` comes from.
        source: Where the flags come from ("/proc/cpuinfo"), or why there are none.
    """

    vendor: str
    family: int | None
    flags: frozenset[str]
    clock_ghz: float | None
    clock_source: str
    source: str


def read_cpu(cpuinfo: Path = CPUINFO, max_frequency: Path = MAX_FREQUENCY) -> CpuFacts:
    """The first processor's vendor, family, flags and clock, from `cpuinfo` (Linux)."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        return CpuFacts("", None, frozenset(), None, "unknown", f"no flags: {cpuinfo}: {err}")
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor is enough
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    family = fields.get("cpu family", "")
    clock, clock_source = _clock(fields, max_frequency)
    return CpuFacts(
        vendor=fields.get("vendor_id", ""),
        family=int(family) if family.isdigit() else None,
        flags=frozenset(fields.get("flags", "").split()),
        clock_ghz=clock, clock_source=clock_source,
        source=str(cpuinfo) if "flags" in fields else f"no flags line in {cpuinfo}",
    )


def _clock(fields: dict[str, str], max_frequency: Path) -> tuple[float | None, str]:
    try:
        return int(max_frequency.read_text().strip()) / 1e6, f"{max_frequency} (kHz)"
    except (OSError, ValueError):
        pass
    stated = re.search(r"@\s*([\d.]+)\s*GHz", fields.get("model name", ""))
    if stated:
        return float(stated.group(1)), "the model name"
    try:
        return float(fields["cpu MHz"]) / 1000.0, "cpu MHz in /proc/cpuinfo (may be the base clock)"
    except (KeyError, ValueError):
        return None, "unknown: no clock stated"


def classify(flags: frozenset[str]) -> str:
    """The class of a CPU with these flags (see the module docstring)."""
    return next((name for name, needed in CLASS_FLAGS.items() if set(needed) <= flags),
                OTHER_CLASS)


def _datapath_bits(facts: CpuFacts) -> int:
    if "avx512f" not in facts.flags:
        return 256
    if facts.vendor == "AuthenticAMD" and facts.family == AMD_DOUBLE_PUMPED_FAMILY:
        return 256
    return 512


def ops_per_cycle(facts: CpuFacts) -> dict[str, tuple[float, str]]:
    """Per precision, the estimated ops per cycle per core and the instruction that gives them
    (precisions without a suitable instruction are left out)."""
    flags = facts.flags
    if "fma" not in flags:
        return {}
    bits = _datapath_bits(facts)
    lanes = bits // 32
    width = f"{bits}-bit datapath, {VECTOR_PIPES} pipes"
    rates = {"fp32": (float(VECTOR_PIPES * lanes * 2),
                      f"FMA ({'AVX-512' if 'avx512f' in flags else 'AVX2'}), {width}")}
    if "amx_int8" in flags:
        rates["int8"] = (float(AMX_OPS_PER_CYCLE["int8"]), "AMX TMUL (tdpbusd)")
    elif "avx512_vnni" in flags:
        rates["int8"] = (float(VECTOR_PIPES * lanes * 4 * 2), f"AVX-512 VNNI (vpdpbusd), {width}")
    elif "avx_vnni" in flags:
        rates["int8"] = (float(VECTOR_PIPES * 8 * 4 * 2), "AVX-VNNI (vpdpbusd, 256-bit)")
    elif "avx2" in flags:
        byte_bits = bits if "avx512bw" in flags else 256
        rates["int8"] = (float(VECTOR_PIPES * byte_bits // 8),
                         f"vpmaddubsw + vpmaddwd, {byte_bits}-bit, no VNNI")
    if "amx_bf16" in flags:
        rates["bf16"] = (float(AMX_OPS_PER_CYCLE["bf16"]), "AMX TMUL (tdpbf16ps)")
    elif "avx512_bf16" in flags:
        rates["bf16"] = (float(VECTOR_PIPES * lanes * 2 * 2), f"AVX512_BF16 (vdpbf16ps), {width}")
    return rates


def instruction_peaks(facts: CpuFacts, cores: int) -> dict[str, dict[str, Any]]:
    """Per precision, the estimated peak: ``cores × clock × ops per cycle per core``.

    Args:
        facts: From `read_cpu`.
        cores: Cores the runtimes use (the bench runs one thread per core).

    Returns:
        Per precision: ``ops_per_s`` (None without a clock), ``ops_per_cycle``, ``instruction``,
        ``cores``, ``clock_ghz``, ``clock_source`` and ``formula`` (the product written out).
    """
    peaks = {}
    for precision, (per_cycle, instruction) in ops_per_cycle(facts).items():
        clock = facts.clock_ghz
        rate = None if clock is None else cores * clock * 1e9 * per_cycle
        formula = (f"{cores} cores x {clock:.2f} GHz x {per_cycle:.0f} ops/cycle"
                   if clock is not None else f"{cores} cores x ? GHz x {per_cycle:.0f} ops/cycle")
        peaks[precision] = {"ops_per_s": rate, "ops_per_cycle": per_cycle,
                            "instruction": instruction, "cores": cores, "clock_ghz": clock,
                            "clock_source": facts.clock_source, "formula": formula}
    return peaks


def describe_machine(facts: CpuFacts, cores: int) -> dict[str, Any]:
    """JSON-ready: the machine class, the flags it was read from and the peak estimates."""
    return {
        "machine_class": classify(facts.flags),
        "class_flags": sorted(RELEVANT_FLAGS & facts.flags),
        "flags_source": facts.source,
        "vendor": facts.vendor,
        "family": facts.family,
        "peaks": instruction_peaks(facts, cores),
    }
