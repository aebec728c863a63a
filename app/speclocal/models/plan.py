"""Which model files a pair or -m/-md choice means, whether they are downloaded, and whether they may be
loaded (`check_load`: llama.cpp's pair compatibility, the memory estimate against each pool it needs): all
from the catalogue and GGUF headers, no weights loaded. The TUI plans and checks before it loads; the engine
and `speclocal inspect` give the same verdict."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from speclocal.errors import SpeclocalError
from speclocal.formatting import fmt_bytes
from speclocal.locations import MODELS_ENV, models_dir
from speclocal.models.catalogue import load_catalogue
from speclocal.models.devices import PoolCheck, compute_label, devices, memory_pools, resolve_gpu_layers
from speclocal.models.gguf_info import (LLAMA_CTX_PAD, Compat, GGUFInfo, MemoryEstimate, check_compat,
                                        estimate_memory, read_gguf)


@dataclass
class ModelPlan:
    """The configured pair resolved to files, or what is missing."""

    label: str
    main_path: Path | None = None
    draft_path: Path | None = None
    missing: list = field(default_factory=list)  # catalogue ModelEntry objects not downloaded
    fetch_targets: list[str] = field(default_factory=list)  # ids for `speclocal fetch`
    models_dir: Path | None = None
    error: str | None = None

    @property
    def fetch_command(self) -> str:
        cmd = "speclocal fetch " + " ".join(self.fetch_targets)
        if self.models_dir is not None and os.environ.get(MODELS_ENV):
            cmd += f" --dir {self.models_dir}"
        return cmd


def plan_models(pair: str = "", main: str = "", draft: str = "", want_draft: bool = True,
                directory: str | Path | None = None) -> ModelPlan:
    """Resolve a pair id and -m/-md style overrides to paths (catalogue ids or GGUF files)."""
    try:
        cat = load_catalogue()
        p = cat.pair(pair or cat.default_pair)
    except SpeclocalError as e:
        return ModelPlan(label=pair or "?", error=str(e))
    main_spec = main or p.main
    draft_spec = (draft or p.draft) if want_draft else ""
    directory = models_dir(directory)
    plan = ModelPlan(label=p.id if not (main or draft) else "custom", models_dir=directory)
    paths: list[Path | None] = []
    for spec in (main_spec, draft_spec):
        if not spec:
            paths.append(None)
            continue
        if spec in cat.models:
            entry = cat.models[spec]
            path = directory / entry.file
            if not path.is_file():
                plan.missing.append(entry)
                plan.fetch_targets.append(entry.id)
            paths.append(path)
            continue
        path = Path(spec).expanduser()
        if not path.is_file():
            plan.error = f"model file not found: {spec}"
        paths.append(path)
    if plan.fetch_targets and not (main or draft) and len(plan.missing) == 2:
        plan.fetch_targets = [p.id]  # the whole pair: one id
    plan.main_path, plan.draft_path = paths
    def short(spec: str) -> str:
        return spec if spec in cat.models else Path(spec).name

    plan.label = f"{plan.label}: {short(main_spec)}" + (f" + {short(draft_spec)}" if draft_spec else "")
    return plan


@dataclass(frozen=True)
class LoadCheck:
    """Whether a pair may load here, from the GGUF headers: llama.cpp's pair rules and, for the memory each
    part would live in (system RAM; a GPU's for offloaded layers), the estimated need against what is there."""

    main: GGUFInfo
    draft: GGUFInfo | None
    compat: Compat | None  # None: no draft model
    n_ctx: int  # the context asked for (the estimate's is padded as llama.cpp pads it)
    memory: MemoryEstimate
    n_gpu_layers: int  # as llama.cpp takes it: -1 = every layer
    compute: str  # which device computes, in words
    pools: tuple[PoolCheck, ...]

    @property
    def compatible(self) -> bool:
        return self.compat is None or self.compat.ok

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.pools)

    def pair_problem(self) -> str | None:
        """Why llama.cpp would refuse the pair, or None."""
        if self.compatible:
            return None
        return f"{self.draft.path.name} cannot draft for {self.main.path.name}: {self.compat.detail}"

    def memory_problem(self) -> str | None:
        """Which memory pool is short, by how much and what would fit, or None."""
        short = next((p for p in self.pools if not p.fits), None)
        if short is None:
            return None
        infos = [self.main] + ([self.draft] if self.draft else [])
        per_token = sum(m.kv_bytes_per_token for m in infos)
        fixed = short.need - per_token * self.memory.n_ctx
        fits = (short.available - fixed) // per_token // LLAMA_CTX_PAD * LLAMA_CTX_PAD if per_token else 0
        hint = f"-c {fits} would fit" if fits >= LLAMA_CTX_PAD else "a smaller model is needed"
        if short.pool != "system RAM":
            hint += " (or fewer layers on the GPU: a lower -ngl)"
        detail = ", ".join(f"{m.role} {fmt_bytes(m.weights)} weights + {fmt_bytes(m.kv_cache)} KV + "
                           f"{fmt_bytes(m.compute)} buffers" for m in self.memory.models)
        return (f"not enough memory: -c {self.n_ctx} needs ~{fmt_bytes(short.need)} of {short.pool} ({detail}) "
                f"but {fmt_bytes(short.available)} is available; {hint}, or pass --force to load anyway")

    def require(self, pair: bool = True, memory: bool = True) -> None:
        """Raise a SpeclocalError where the memory (if `memory`) or the pair (if `pair`) says no."""
        for why in (self.memory_problem() if memory else None, self.pair_problem() if pair else None):
            if why is not None:
                raise SpeclocalError(why)

    @property
    def lines(self) -> list[str]:
        """What was found, for the user."""
        m, d, est = self.main, self.draft, self.memory
        out = [f"main   {m.path.name}: {m.architecture}, {m.quantization}, {fmt_bytes(m.tensor_bytes)} weights"]
        if d is not None:
            out.append(f"draft  {d.path.name}: {d.architecture}, {d.quantization}, {fmt_bytes(d.tensor_bytes)} weights")
            out.append(("compatible: " if self.compatible else "NOT compatible: ") + self.compat.detail)
        out.append(f"memory at context {est.n_ctx}: need {fmt_bytes(est.total)}; this machine has "
                   f"{fmt_bytes(est.ram_total)} ({fmt_bytes(est.ram_available)} available): {est.verdict}")
        out += [f"{p.pool}: needs {fmt_bytes(p.need)}, {fmt_bytes(p.available)} available: does not fit"
                for p in self.pools if not p.fits]
        return out


def check_load(main: Path, draft: Path | None, n_ctx: int, n_gpu_layers: str | int,
               found: tuple | None = None) -> LoadCheck:
    """May `main` (with `draft`) load here at context `n_ctx` with `n_gpu_layers` (as -ngl takes it, or resolved)
    on the GPU? The one verdict the engine, `speclocal inspect` and the TUI give; no weights loaded. `found`: the
    devices as `devices()` reads them (read here if not given)."""
    ngl = resolve_gpu_layers(n_gpu_layers) if isinstance(n_gpu_layers, str) else n_gpu_layers
    infos = [read_gguf(main)] + ([read_gguf(draft)] if draft else [])
    d = infos[1] if draft else None
    est = estimate_memory(infos[0], d, n_ctx)
    found = devices() if found is None else found
    pools = memory_pools([(m.weights, m.kv_cache, m.compute, info.n_layer) for m, info in zip(est.models, infos)],
                         est.ram_available, ngl, found)
    return LoadCheck(infos[0], d, check_compat(infos[0], d) if d else None, n_ctx, est, ngl,
                     compute_label(ngl, found), tuple(pools))


def local_models(directory: Path) -> list[tuple[str, str, Path]]:
    """(label, value, path) of GGUF files in the models dir: catalogue ids first, then other files."""
    out: list[tuple[str, str, Path]] = []
    seen: set[Path] = set()
    try:
        cat = load_catalogue()
        for m in cat.models.values():
            p = directory / m.file
            if p.is_file():
                out.append((f"{m.id} ({m.params} {m.quant})", m.id, p))
                seen.add(p)
    except SpeclocalError:
        pass
    try:
        files = sorted(directory.glob("*.gguf"))
    except OSError:
        files = []
    for p in files:
        if p not in seen:
            out.append((p.name, str(p), p))
    return out


@dataclass
class DraftScan:
    """Which candidates could draft for a main model: `ok` and `rejected` as (label, value, path) rows, the
    latter with the reason (the rule llama.cpp's check fails, or why the file is no use as a draft)."""

    main: GGUFInfo
    ok: list = field(default_factory=list)
    rejected: list = field(default_factory=list)  # (label, value, path, reason)


def scan_drafts(main_path: Path, candidates: list[tuple[str, str, Path]]) -> DraftScan:
    """The candidates llama.cpp would accept as drafts for `main_path`, and why each other one is not: unreadable,
    not smaller than the main model, or failing a compatibility rule. Raises where the main is not a GGUF."""
    main = read_gguf(main_path)
    scan = DraftScan(main)
    for label, value, path in candidates:
        if path.resolve() == main_path.resolve():
            continue
        try:
            info = read_gguf(path)
        except SpeclocalError as e:
            scan.rejected.append((label, value, path, str(e)))
            continue
        compat = check_compat(main, info)
        if not compat.ok:
            scan.rejected.append((label, value, path, f"{compat.rule}: {compat.detail}"))
        elif info.tensor_bytes >= main.tensor_bytes:
            scan.rejected.append((label, value, path, f"not smaller than the main model "
                                  f"({fmt_bytes(info.tensor_bytes)} >= {fmt_bytes(main.tensor_bytes)} weights)"))
        else:
            scan.ok.append((label, value, path))
    return scan


def remote_drafts(main: GGUFInfo, directory: Path) -> list:
    """Catalogue models not downloaded to `directory` that could draft for `main`: the same tokenizer (the
    catalogue's family names its vocabulary size) at most half its parameters (the catalogue's figures are rounded: the 1.5B has 1.78 B with its embeddings)."""
    try:
        cat = load_catalogue()
    except SpeclocalError:
        return []
    vocab = f"{main.vocab_size:,} tokens"
    return [m for m in cat.models.values()
            if vocab in m.family and not (directory / m.file).is_file() and _params(m.params) <= main.n_params / 2]


def _params(text: str) -> float:
    """"0.5B" -> 5e8, "135M" -> 1.35e8 (inf where unreadable)."""
    try:
        return float(text[:-1]) * {"B": 1e9, "M": 1e6}[text[-1].upper()]
    except (ValueError, KeyError, IndexError):
        return float("inf")


def compatible_drafts(main_path: Path | None, candidates: list[tuple[str, str, Path]]) -> tuple[list, str]:
    """The candidates llama.cpp would accept as drafts for `main_path` (LM Studio's filtered list)."""
    if main_path is None or not main_path.is_file():
        return [], "main model not downloaded: no drafts to check"
    try:
        scan = scan_drafts(main_path, candidates)
    except SpeclocalError as e:
        return [], str(e)
    hidden = f"; {len(scan.rejected)} other file(s) hidden" if scan.rejected else ""
    return scan.ok, f"{len(scan.ok)} compatible draft(s) for {main_path.name}{hidden}"
