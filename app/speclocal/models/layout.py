"""The weight layout llama.cpp loads models in, chosen by trying each where a crash cannot hurt.

At load llama.cpp moves the weights it can into the CPU's "extra" buffer types: AMX tiles where the build and the
CPU have AMX, else CPU_REPACK's interleaved blocks for the SIMD kernels. Those kernels can crash: on Xeons with AMX
under KVM the first batched decode dies in `ggml_backend_amx_mul_mat` (llama.cpp issue #20824), and plain
`llama_cpp.Llama` dies with it. So before a model is first loaded on a machine, a child process loads it in each
layout in turn and decodes small batches; the first layout that survives is used:

- `default`: llama.cpp's own choice (AMX where present, else CPU_REPACK);
- `no-amx`: CPU_REPACK without AMX (the tensors CPU_REPACK takes are placed there by per-tensor buffer-type
  overrides, the rest stays as stored); only where the build has AMX;
- `stored`: the weights as stored in the file (llama.cpp's --no-repack).

Verdicts are cached in the user cache (`locations.layouts_path()`) per llama.cpp build x CPU x device x the weight
types the model's kernels see, so a machine pays a few seconds once and a new build checks again. `--repack` and
`--no-repack` are obeyed as given, without a probe.

Testing without the hardware: `SPECLOCAL_PROBE_CRASH` (comma-separated layout names, or `all`), read only by the
probe's child, makes that child kill itself with SIGSEGV after loading in those layouts.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from speclocal import locations
from speclocal.files import atomic_write, read_json
from speclocal.models.cpu import cpu_id

log = logging.getLogger("speclocal.layout")

LAYOUTS = ("default", "no-amx", "stored")
DESCRIPTIONS = {"default": "llama.cpp's default weight layout", "no-amx": "the weights repacked without AMX",
                "stored": "the weights as stored (not repacked)"}
# how the compute label names a layout that is not llama.cpp's default (the label keys cost profiles)
LABELS = {"default": "", "no-amx": ", weights repacked without AMX", "stored": ", weights not repacked"}
CRASH_ENV = "SPECLOCAL_PROBE_CRASH"
PROBE_TIMEOUT_S = 300.0
PROBE_CTX = 64
# CPU_REPACK's x86 kernels (ggml-cpu/repack.cpp, ggml_repack_get_optimal_repack_type: AVX2) and the row multiple
# each needs; a tensor placed there that it cannot take would abort the load
REPACK_TYPES = {"Q4_0": 8, "Q4_K": 8, "IQ4_NL": 8}
_MATMUL = re.compile(r"blk\.(\d+)\.([A-Za-z0-9_]+)\.weight")


@dataclass(frozen=True)
class Choice:
    """The layout to load in, and the one line that says why when it is not what llama.cpp would do."""

    layout: str
    note: str = ""
    news: bool = False  # a probe found a layout failing just now (the note is news, said once), not the cache


# ---- loading in a layout ---------------------------------------------------------------------------------
class _Override(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def repack_patterns(matrices: tuple[tuple[str, str, int], ...]) -> list[str]:
    """Regexes (llama.cpp matches them with std::regex_search) naming every layer matrix CPU_REPACK can take: its
    types, rows a multiple of its block; grouped by tensor so llama.cpp compiles a handful, not hundreds."""
    layers: dict[str, list[str]] = {}
    output = False
    for name, qtype, rows in matrices:
        if qtype not in REPACK_TYPES or rows % REPACK_TYPES[qtype]:
            continue
        if m := _MATMUL.fullmatch(name):
            layers.setdefault(m.group(2), []).append(m.group(1))
        elif name == "output.weight":  # token_embd is read by row (get_rows): never repacked
            output = True
    out = [rf"^blk\.({'|'.join(ids)})\.{tensor}\.weight$" for tensor, ids in layers.items()]
    return out + ([r"^output\.weight$"] if output else [])


def apply(mparams, layout: str, path: Path) -> object | None:
    """Set llama.cpp's model parameters for `layout`; returns what must stay alive while the model loads."""
    if layout == "default":
        return None
    mparams.use_extra_bufts = False  # no AMX, no automatic CPU_REPACK
    if layout == "stored":
        return None
    from speclocal.models.devices import cpu_extra_buffer_types
    from speclocal.models.gguf_info import read_gguf

    repack = cpu_extra_buffer_types().get("CPU_REPACK")
    patterns = repack_patterns(read_gguf(path).matrices) if repack else []
    if not patterns:
        return None
    table = (_Override * (len(patterns) + 1))(*[_Override(p.encode(), repack) for p in patterns], _Override(None, None))
    mparams.tensor_buft_overrides = ctypes.addressof(table)
    return table


def candidates() -> tuple[str, ...]:
    """The layouts worth trying here, in order: `no-amx` only where this build's CPU backend has AMX."""
    from speclocal.models.devices import cpu_extra_buffer_types

    extra = cpu_extra_buffer_types()
    return ("default", "no-amx", "stored") if "AMX" in extra and "CPU_REPACK" in extra else ("default", "stored")


# ---- choosing ----------------------------------------------------------------------------------------------
def build_id() -> str:
    """This llama.cpp build: the binding's version and its libraries' sizes and dates (a rebuild changes them)."""
    import llama_cpp

    lib = Path(llama_cpp.__file__).resolve().parent / "lib"
    files = sorted(p for p in lib.glob("*") if p.is_file() and not p.is_symlink()) if lib.is_dir() else []
    parts = [llama_cpp.__version__] + [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def machine_key(compute: str) -> str:
    return hashlib.sha256(f"{build_id()}|{cpu_id()}|{compute}".encode()).hexdigest()[:20]


def choose(paths: list[Path], compute: str, n_gpu_layers: int, repack: bool | None) -> Choice:
    """The layout to load the models at `paths` in: as `repack` says when given (True: llama.cpp's default, False:
    stored), else the first candidate that survived a probe with every weight type of these models (cached)."""
    if repack is not None:
        return Choice("default" if repack else "stored")
    failures: list[tuple[str, str]] = []
    news = False
    for layout in candidates():
        ok, detail, probed = survives(layout, paths, compute, n_gpu_layers)
        if ok is None:  # inconclusive: not the layout's doing; load as llama.cpp would
            return Choice("default")
        if ok:
            return Choice(layout, _note(layout, failures), news)
        failures.append((layout, detail))
        news = news or probed
    return Choice("stored", _note(None, failures), news)


def known(paths: list[Path], compute: str) -> str | None:
    """The layout `choose` would pick, from the cached verdicts alone; None where a probe is still to run."""
    from speclocal.models.gguf_info import read_gguf

    data = read_json(locations.layouts_path())
    seen = data.get(machine_key(compute), {}) if isinstance(data, dict) else {}
    types = set().union(*(read_gguf(p).tensor_types for p in paths))
    for layout in candidates():
        verdict = seen.get(layout) if isinstance(seen.get(layout), dict) else {}
        if verdict.get("ok") is False:
            continue
        return layout if verdict.get("ok") and types <= set(verdict.get("types", [])) else None
    return None


def survives(layout: str, paths: list[Path], compute: str, n_gpu_layers: int) -> tuple[bool | None, str, bool]:
    """Whether `layout` survives a test decode with the models at `paths` here: (verdict, what happened, probed
    just now). The verdict is None when a probe was inconclusive (killed from outside, a bad file)."""
    from speclocal.models.gguf_info import read_gguf

    store = locations.layouts_path()
    data = read_json(store)
    data = data if isinstance(data, dict) else {}
    seen = data.setdefault(machine_key(compute), {})
    verdict = seen.get(layout) if isinstance(seen.get(layout), dict) else {}
    probed = False
    for path in paths:
        if verdict.get("ok") is False:
            break
        covered, types = set(verdict.get("types", [])), set(read_gguf(path).tensor_types)
        if types <= covered:
            continue
        ok, detail, conclusive = probe(path, layout, n_gpu_layers)
        probed = True
        if not conclusive:
            log.info("layout probe %s of %s inconclusive: %s", layout, path.name, detail)
            return None, detail, True
        verdict = {"ok": ok, "detail": detail, "types": sorted(covered | types),
                   "when": time.strftime("%Y-%m-%d %H:%M:%S")}
        seen[layout] = verdict
        _save(store, data)
    return verdict.get("ok") is not False, str(verdict.get("detail", "")), probed


def _save(store: Path, data: dict) -> None:
    try:
        atomic_write(store, json.dumps(data, indent=1, sort_keys=True))
    except OSError as e:  # a read-only cache costs a probe per run, not the run
        log.warning("cannot save the weight layout verdict in %s: %s", store, e)


def _note(chosen: str | None, failures: list[tuple[str, str]]) -> str:
    if not failures:
        return ""
    what = "; ".join(f"{DESCRIPTIONS[name]}{' (AMX)' if name == 'default' and 'no-amx' in candidates() else ''} "
                     f"{detail}" for name, detail in failures)
    if chosen is None:
        return f"every weight layout failed a test decode on this machine ({what}): trying the stored layout"
    return (f"{what} on this CPU: using {DESCRIPTIONS[chosen]}; --repack forces llama.cpp's default, "
            "--no-repack the stored layout")


def probe(path: Path, layout: str, n_gpu_layers: int) -> tuple[bool, str, bool]:
    """Load `path` in `layout` in a child process and decode small batches there: (survived, what happened,
    conclusive). A crash (a signal) or a hang condemns the layout; a Python error, or a kill from outside
    (SIGKILL: e.g. out of memory), is not the layout's doing and decides nothing."""
    cmd = [sys.executable, "-m", "speclocal.models.layout", str(path), layout, str(n_gpu_layers)]
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
                              timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return False, f"did not finish a test decode in {PROBE_TIMEOUT_S:.0f} s", True
    except OSError as e:
        return True, f"could not start the probe: {e}", False
    took = time.monotonic() - t0
    tail = " | ".join(done.stderr.strip().splitlines()[-3:])
    log.info("layout probe %s of %s: exit %s in %.1f s%s", layout, path.name, done.returncode, took,
             f" ({tail})" if tail else "")
    rc = done.returncode
    if rc == 0:
        return True, f"passed a test decode in {took:.1f} s", True
    if rc < 0 and -rc != signal.SIGKILL:
        return False, f"crashed in a test decode ({_signal_name(-rc)})", True
    return False, f"exit code {rc}" + (f": {tail}" if tail else ""), False


def _signal_name(signum: int) -> str:
    try:
        return f"signal {signum}, {signal.Signals(signum).name}"
    except ValueError:
        return f"signal {signum}"


def _probe_child(path: str, layout: str, n_gpu_layers: int) -> int:
    """In the child: load in `layout` through llama.cpp's C API, decode batches of 8, 2 and 1 tokens (batched
    kernels are where the crashes are: llama-bench with AMX decodes single tokens fine and dies at its first batch
    of 2). Exit 0 when they ran."""
    import llama_cpp as ll

    ll.llama_backend_init()  # llama.cpp logs to stderr, which the parent keeps the end of
    mparams = ll.llama_model_default_params()
    mparams.n_gpu_layers = n_gpu_layers
    keep = apply(mparams, layout, Path(path))
    model = ll.llama_model_load_from_file(path.encode(), mparams)
    del keep
    if not model:
        print(f"llama.cpp could not load {path}", file=sys.stderr)
        return 1
    cparams = ll.llama_context_default_params()
    cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = PROBE_CTX
    cparams.n_threads = cparams.n_threads_batch = os.cpu_count() or 1
    ctx = ll.llama_init_from_model(model, cparams)
    if not ctx:
        print("llama.cpp could not create a context", file=sys.stderr)
        return 1
    crash = os.environ.get(CRASH_ENV, "")
    if layout in crash.split(",") or crash == "all":
        os.kill(os.getpid(), signal.SIGSEGV)
    vocab = ll.llama_model_get_vocab(model)
    text = b"def add(a, b):\n    return a + b\n" * 4
    buf = (ll.llama_token * 64)()
    n = max(0, ll.llama_tokenize(vocab, text, len(text), buf, 64, False, True))
    tokens = list(buf[:n]) + [0] * max(0, 11 - n)
    batch = ll.llama_batch_init(8, 0, 1)
    pos = 0
    for size in (8, 2, 1):
        for i in range(size):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tokens[pos + i], pos + i, 1, True
            batch.seq_id[i][0] = 0
        batch.n_tokens = size
        if ll.llama_decode(ctx, batch) != 0:
            print(f"llama_decode failed on a batch of {size}", file=sys.stderr)
            return 1
        ll.llama_synchronize(ctx)
        pos += size
    ll.llama_batch_free(batch)
    ll.llama_free(ctx)
    ll.llama_model_free(model)
    return 0


if __name__ == "__main__":
    sys.exit(_probe_child(sys.argv[1], sys.argv[2], int(sys.argv[3])))
