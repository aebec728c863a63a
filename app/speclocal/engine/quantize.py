"""Draft candidates without the hub: a GGUF requantized to another type by llama.cpp's own quantizer
(`llama_model_quantize`, through the binding), e.g. the 0.5B draft at Q8_0 or Q2_K, or the main model's own
weights at Q2_K (a self-draft). Same vocabulary, other costs and acceptances. Made once, kept beside the
source (the models dir by default) under a name that says what it is."""

from __future__ import annotations

import os
import time
from pathlib import Path

from speclocal.errors import SpeclocalError

TYPES = ("Q2_K", "Q3_K_M", "Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")  # llama_ftype LLAMA_FTYPE_MOSTLY_<type>


def requantized_path(src: Path, qtype: str, directory: Path | None = None) -> Path:
    """Where `src` requantized to `qtype` lives: `<stem>.requant-<type>.gguf` in `directory` (default: beside it)."""
    return (directory or src.parent) / f"{src.stem}.requant-{qtype.lower()}.gguf"


def requantize(src: str | os.PathLike, qtype: str, directory: str | os.PathLike | None = None,
               threads: int = 0) -> tuple[Path, float]:
    """`src` requantized to `qtype` (allow_requantize: from an already quantized file), written once; returns
    (path, seconds it took, 0.0 where the file was already there)."""
    qtype = qtype.upper()
    if qtype not in TYPES:
        raise SpeclocalError(f"cannot quantize to {qtype!r}: choose from {', '.join(TYPES)}")
    src = Path(src)
    if not src.is_file():
        raise SpeclocalError(f"model file not found: {src}")
    out = requantized_path(src, qtype, Path(directory) if directory else None)
    if out.is_file():
        return out, 0.0
    import ctypes

    import llama_cpp as ll

    from speclocal.engine.llama import init_backend

    init_backend()  # llama.cpp's log to `logging`, not the terminal
    params = ll.llama_model_quantize_default_params()
    params.ftype = getattr(ll, f"LLAMA_FTYPE_MOSTLY_{qtype}")
    params.allow_requantize = True
    params.nthread = threads
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.part")
    t0 = time.perf_counter()
    try:
        rc = ll.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0:
            raise SpeclocalError(f"llama.cpp could not quantize {src.name} to {qtype} (code {rc})")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out, time.perf_counter() - t0
