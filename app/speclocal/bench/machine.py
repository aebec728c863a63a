"""What the numbers were measured on: CPU, cores, RAM, OS, llama.cpp build, model files with sha256."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import psutil

from speclocal.models.cpu import cpu_name, cpu_signature


def machine_info() -> dict:
    import llama_cpp
    import llama_cpp.llama_cpp as ll

    try:
        system_info = ll.llama_print_system_info().decode("utf-8", "replace").strip()
    except Exception:  # noqa: BLE001 - informational only
        system_info = None
    return {
        "cpu": cpu_name(),
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
