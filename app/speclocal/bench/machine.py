"""What the numbers were measured on: CPU, cores, RAM, OS, llama.cpp build, model files with sha256."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import psutil


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            import subprocess

            return subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                  timeout=5).stdout.strip() or platform.processor()
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine()


def cpu_signature(cpuinfo: str | None = None) -> str | None:
    """Which CPU this is beyond its model name, from /proc/cpuinfo (or `cpuinfo`, its text): x86 vendor, family,
    model and stepping; Arm implementer, part, variant and revision, every distinct core type (big.LITTLE). A
    cloud sells Zen 2, Zen 3 and Zen 4 all as "AMD EPYC", and their cost curves differ. None where unreadable."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    found: list[str] = []
    for block in cpuinfo.split("\n\n"):
        f = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in block.splitlines())}
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


def machine_info() -> dict:
    import llama_cpp
    import llama_cpp.llama_cpp as ll

    try:
        system_info = ll.llama_print_system_info().decode("utf-8", "replace").strip()
    except Exception:  # noqa: BLE001 - informational only
        system_info = None
    return {
        "cpu": cpu_model(),
        "cpu_signature": cpu_signature(),
        "cores_physical": psutil.cpu_count(logical=False),
        "cores_logical": os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
        "os": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "llama_cpp_python": getattr(llama_cpp, "__version__", None),
        "llama_cpp_system_info": system_info,
        "load_average_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def model_info(path: str | Path | None) -> dict | None:
    """File facts and sha256: from the fetch stamp `<file>.verified` if it matches size and mtime,
    else hashed here (a few seconds per GB)."""
    if path is None:
        return None
    p = Path(path)
    st = p.stat()
    info = {"file": p.name, "path": str(p), "size": st.st_size, "sha256": None, "sha256_source": None}
    try:
        stamp = json.loads(p.with_name(p.name + ".verified").read_text(encoding="utf-8"))
        if stamp.get("size") == st.st_size and stamp.get("mtime_ns") == st.st_mtime_ns and stamp.get("sha256"):
            info.update(sha256=stamp["sha256"], sha256_source="stamp")
    except (OSError, ValueError, AttributeError):
        pass
    if info["sha256"] is None:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        info.update(sha256=h.hexdigest(), sha256_source="computed")
    return info
