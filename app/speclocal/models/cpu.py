"""Which CPU this is: its model name, its signature and its instruction-set flags, read once from /proc/cpuinfo.

The weight layouts and cost profiles cached per machine are keyed by `cpu_id`, and a bench records name and signature:
a cloud sells Zen 2, Zen 3 and Zen 4 all as "AMD EPYC", and an Intel Xeon with or without AMX under one name, and
their kernels and cost curves differ.
"""

from __future__ import annotations

import hashlib
import platform
import re
import subprocess
from functools import lru_cache
from pathlib import Path


# the flags that name instruction sets a kernel may use (x86 "flags", Arm "Features"), not those a kernel, a
# hypervisor or a microcode update adds or drops (hypervisor, rep_good, arch_capabilities, ...)
_ISA_FLAG = re.compile(r"(avx|amx|fma|f16c|sse|ssse|bmi|vnni|vaes|vpclmul|gfni|sha|asimd|sve|sme|i8mm|dotprod|"
                       r"fphp|bf16|neon|vfp|vxe|vsx|altivec)")


@lru_cache(maxsize=1)
def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _fields(block: str) -> dict[str, str]:
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in block.splitlines())}


@lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU's model name ("Intel(R) Xeon(R) Processor @ 2.80GHz"), or the closest the OS says."""
    for line in _cpuinfo().splitlines():
        if line.lower().startswith(("model name", "hardware")):
            return line.split(":", 1)[1].strip()
    if platform.system() == "Darwin":
        try:
            brand = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                   timeout=5).stdout.strip()
            if brand:
                return brand
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


def cpu_signature(cpuinfo: str | None = None) -> str | None:
    """Which CPU this is beyond its model name, from /proc/cpuinfo (or `cpuinfo`, its text): x86 vendor, family,
    model and stepping; Arm implementer, part, variant and revision, every distinct core type (big.LITTLE).
    None where unreadable."""
    found: list[str] = []
    for block in (_cpuinfo() if cpuinfo is None else cpuinfo).split("\n\n"):
        f = _fields(block)
        if f.get("cpu family"):
            sig = f"{f.get('vendor_id', '?')} family {f['cpu family']} model {f.get('model', '?')} stepping " \
                  f"{f.get('stepping', '?')}"
        elif f.get("CPU part"):
            sig = (f"Arm implementer {f.get('CPU implementer', '?')} part {f['CPU part']} "
                   f"r{f.get('CPU variant', '?')}p{f.get('CPU revision', '?')}")
        else:
            continue
        if sig not in found:
            found.append(sig)
    return " + ".join(found) or None


@lru_cache(maxsize=1)
def cpu_id() -> str:
    """Name, signature and a hash of the instruction-set flags (AMX, AVX-512, ... decide which kernels run): the
    key of what is cached per machine."""
    listed = (f.get("flags") or f.get("Features") or f.get("features") for f in map(_fields, _cpuinfo().split("\n\n")))
    flags = " ".join(sorted(x for x in next((x for x in listed if x), "").split() if _ISA_FLAG.match(x)))
    return f"{cpu_name()} | {cpu_signature() or '-'} | {hashlib.sha256(flags.encode()).hexdigest()[:12]}"
