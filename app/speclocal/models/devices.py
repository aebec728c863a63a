"""Which devices this llama.cpp build computes on (CPU, CUDA, Metal, Vulkan, ...) and the memory each has, from
ggml's backend registry; what `-ngl` means here; and which memory pool a pair's layers need.

llama-cpp-python binds `llama_supports_gpu_offload` but not ggml's device API, so the few device calls are
bound here with ctypes against the libraries llama_cpp ships. Where they cannot be reached, the device list is
empty and callers say they could not tell.
"""

from __future__ import annotations

import ctypes
import platform
import re
import sys
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from speclocal.errors import SpeclocalError

KINDS = ("cpu", "gpu", "igpu", "accel", "meta")  # ggml_backend_dev_type, in order
ALL_LAYERS = -1  # llama.cpp: a negative n_gpu_layers offloads every layer


@dataclass(frozen=True)
class Device:
    name: str  # ggml's: CPU, CUDA0, Metal, Vulkan0, ...
    description: str  # e.g. the GPU's model
    kind: str  # cpu | gpu (dedicated memory) | igpu (the host's memory, e.g. Apple Silicon) | accel | meta
    free: int  # bytes; 0 with total 0 = the backend does not say
    total: int

    @property
    def label(self) -> str:
        return f"{self.name} ({self.description})" if self.description and self.description != self.name else self.name


def gpu_offload_supported() -> bool:
    """Whether this llama.cpp build can offload layers to a GPU (CUDA, Metal, Vulkan, ROCm, ...)."""
    import llama_cpp as ll

    return bool(ll.llama_supports_gpu_offload())


def resolve_gpu_layers(value: str, offload_supported: bool | None = None) -> int:
    """`-ngl` as llama.cpp reads it: `auto` = every layer where the build can offload, else none; `all` =
    every layer; a number = that many layers (0 forces the CPU)."""
    value = str(value).strip().lower()
    if value == "auto":
        supported = gpu_offload_supported() if offload_supported is None else offload_supported
        return ALL_LAYERS if supported else 0
    if value == "all":
        return ALL_LAYERS
    try:
        n = int(value)
    except ValueError:
        raise SpeclocalError(f"-ngl/--n-gpu-layers must be a number, 'auto' or 'all', got {value!r}") from None
    if n < 0:
        raise SpeclocalError(f"-ngl/--n-gpu-layers must be >= 0, 'auto' or 'all', got {n}")
    return n


def _library(name: str) -> ctypes.CDLL | None:
    import llama_cpp

    lib_dir = Path(llama_cpp.__file__).resolve().parent / "lib"
    suffixes = {"darwin": [".dylib"], "win32": [".dll"]}.get(sys.platform, [".so"])
    for path in [lib_dir / f"lib{name}{s}" for s in suffixes] + [lib_dir / f"{name}{s}" for s in suffixes]:
        if path.exists():
            try:
                return ctypes.CDLL(str(path))
            except OSError:
                return None
    return None


# AMD APUs' GPUs by the names their drivers give them (Radeon 780M/890M/8060S, "AMD Radeon(TM) Graphics", ...):
# the host's memory, where an older ggml calls them "gpu"; newer builds say "igpu" themselves.
_APU = re.compile(r"\b(APU|integrated)\b|Radeon\s*(\(TM\)\s*)?(Graphics\b|Vega\s*\d*\s*Graphics\b|\d{3}M\b|80[4-6]0S\b)", re.I)


def is_metal(name: str) -> bool:
    """ggml's Metal device: "Metal" in older builds, "MTL0" in newer ones."""
    return name.lower().startswith("metal") or name.upper().startswith("MTL")


def unified_kind(name: str, description: str, kind: str) -> str:
    """The kind as the memory is: "igpu" where a GPU computes from the host's RAM though ggml calls it "gpu" —
    Metal on Apple Silicon (ggml's Metal backend always says GPU) and an AMD APU named so in its description."""
    if kind != "gpu":
        return kind
    if is_metal(name) and ((sys.platform == "darwin" and platform.machine() == "arm64")
                           or description.startswith("Apple M")):  # also an x86 Python under Rosetta
        return "igpu"
    if _APU.search(description):
        return "igpu"
    return kind


@dataclass(frozen=True)
class _Registry:
    base: object  # ggml-base's library, for the memory call
    handles: tuple[int, ...]  # ggml_backend_dev_t, one per device
    devices: tuple[Device, ...]  # with the memory read when the registry was first read


@lru_cache(maxsize=1)
def _registry() -> _Registry | None:
    """Which devices exist (names, kinds, totals): read once, since backends register once per process."""
    ggml, base = _library("ggml"), _library("ggml-base")
    if ggml is None or base is None:
        return None
    try:
        ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
        ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
        ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
        for fn in (base.ggml_backend_dev_name, base.ggml_backend_dev_description):
            fn.restype, fn.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        base.ggml_backend_dev_type.restype, base.ggml_backend_dev_type.argtypes = ctypes.c_int, [ctypes.c_void_p]
        base.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                                 ctypes.POINTER(ctypes.c_size_t)]
        handles, out = [], []
        for i in range(ggml.ggml_backend_dev_count()):
            dev = ggml.ggml_backend_dev_get(i)
            free, total = _memory(base, dev)
            kind = base.ggml_backend_dev_type(dev)
            name = (base.ggml_backend_dev_name(dev) or b"?").decode(errors="replace")
            description = (base.ggml_backend_dev_description(dev) or b"").decode(errors="replace").strip()
            kind_name = KINDS[kind] if 0 <= kind < len(KINDS) else "?"
            handles.append(dev)
            out.append(Device(name, description, unified_kind(name, description, kind_name), free, total))
        return _Registry(base, tuple(handles), tuple(out))
    except AttributeError:  # a build without these symbols
        return None


def _memory(base, dev) -> tuple[int, int]:
    """(free, total) bytes of one device, as its backend says now: one ctypes call."""
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def devices() -> tuple[Device, ...]:
    """Every device ggml has registered in this process (its backends register when llama.cpp loads), with its
    free memory read now: which devices exist is read once; what is free changes as other programs (and this
    one) load and unload, so a long-running `serve` or TUI checks each new pair against the memory of the moment."""
    reg = _registry()
    if reg is None:
        return ()
    out = []
    for dev, d in zip(reg.handles, reg.devices):
        free, total = _memory(reg.base, dev)
        out.append(replace(d, free=free, total=total or d.total))
    return tuple(out)


@lru_cache(maxsize=1)
def cpu_extra_buffer_types() -> dict[str, int]:
    """The CPU's "extra" weight buffer types in this build, by name, in llama.cpp's order of preference (e.g.
    AMX, CPU_REPACK): where llama.cpp re-lays weights out at load for its faster kernels. Empty where the
    calls cannot be reached."""
    ggml, base = _library("ggml"), _library("ggml-base")
    if ggml is None or base is None:
        return {}
    try:
        ggml.ggml_backend_dev_by_type.restype, ggml.ggml_backend_dev_by_type.argtypes = ctypes.c_void_p, [ctypes.c_int]
        base.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
        base.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
        base.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
        base.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        base.ggml_backend_buft_name.restype, base.ggml_backend_buft_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
        cpu = ggml.ggml_backend_dev_by_type(KINDS.index("cpu"))
        reg = base.ggml_backend_dev_backend_reg(cpu) if cpu else None
        fn = base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts") if reg else None
    except AttributeError:
        return {}
    if not fn:
        return {}
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(fn)(cpu)
    out: dict[str, int] = {}
    for i in range(16):
        if not bufts[i]:
            break
        out[(base.ggml_backend_buft_name(bufts[i]) or b"?").decode(errors="replace")] = bufts[i]
    return out


def offload_device(found: tuple[Device, ...]) -> Device | None:
    """The device offloaded layers go to: the first GPU with its own memory, else an integrated one."""
    return next((d for d in found if d.kind == "gpu"), None) or next((d for d in found if d.kind == "igpu"), None)


def compute_label(n_gpu_layers: int, found: tuple[Device, ...]) -> str:
    """Which backend and device run the model, in a few words: "CPU", "CUDA0 (NVIDIA H200), all layers", ..."""
    target = offload_device(found)
    if n_gpu_layers == 0 or target is None:
        cpu = next((d for d in found if d.kind == "cpu"), None)
        return cpu.label if cpu else "CPU"
    layers = "all layers" if n_gpu_layers < 0 else f"{n_gpu_layers} layers"
    return f"{target.label}, {layers}"


HOST = "host"  # where buffers in the machine's RAM are reported (CPU, mmap'd, repacked, pinned for a GPU)


def buffer_device(buffer: str, found: tuple[Device, ...]) -> str:
    """The device whose memory a llama.cpp buffer takes, by the buffer's name: a GPU's own ("CUDA0",
    "MTL0_Private", "MTL0_Mapped" -> its device name) or the host's (CPU, CPU_Mapped, CPU_REPACK, AMX, a GPU
    backend's pinned "CUDA_Host" -> HOST). A name that is neither (e.g. a split over several GPUs) stays as it is."""
    head = buffer.split("_", 1)[0]
    dev = next((d for d in found if d.name == head), None)
    if dev is not None and dev.kind != "cpu":
        return dev.name
    if dev is not None or head == "CPU" or buffer == "AMX" or buffer.endswith("_Host"):
        return HOST
    return buffer


@dataclass(frozen=True)
class PoolCheck:
    """The pair's need against one memory pool."""

    pool: str  # what was checked, in words
    need: int
    available: int | None  # None: the backend does not say
    fits: bool
    note: str = ""


def memory_pools(models: list[tuple[int, int, int, int]], ram_available: int, n_gpu_layers: int,
                 found: tuple[Device, ...]) -> list[PoolCheck]:
    """Where the weights live decides which memory they need: system RAM for layers on the CPU; the GPU's
    free memory for offloaded layers on a discrete GPU (and compute buffers there); on an integrated GPU
    (Apple Silicon's Metal, AMD's unified memory) the working set the GPU may use, and the RAM it comes from.
    `models`: (weights, kv_cache, compute, n_layer) per model."""
    total = sum(w + kv + c for w, kv, c, _ in models)
    target = offload_device(found) if n_gpu_layers != 0 else None
    ram = PoolCheck("system RAM", total, ram_available, total <= ram_available)
    if target is None:
        return [ram]
    on_device = host = 0
    for w, kv, c, n_layer in models:
        share = 1.0 if n_gpu_layers < 0 else min(n_gpu_layers, n_layer) / max(n_layer, 1)
        on_device += int(share * (w + kv)) + (c if share > 0 else 0)
        host += int((1 - share) * (w + kv)) + (0 if share > 0 else c)
    name = ("Metal's recommended working set" if is_metal(target.name) else
            f"{target.label}'s memory (shared with the CPU)") if target.kind == "igpu" else f"{target.label}'s free memory"
    if target.total == 0:
        device = PoolCheck(name, on_device, None, True, f"the backend does not say how much memory {target.label} "
                                                       "has: only system RAM was checked")
    else:
        device = PoolCheck(name, on_device, target.free, on_device <= target.free)
    if target.kind == "igpu":  # one memory: the GPU's share of it, and all of it against the RAM
        return [device, ram]
    return [device, PoolCheck("system RAM", host, ram_available, host <= ram_available)]
