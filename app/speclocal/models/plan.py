"""Which model files a pair or -m/-md choice means, whether they are downloaded, and whether they may be
loaded (llama.cpp's pair compatibility, the memory estimate): all from the catalogue and GGUF headers, no
weights loaded. The TUI plans and inspects before it loads."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from speclocal.errors import SpeclocalError
from speclocal.formatting import fmt_bytes
from speclocal.locations import MODELS_ENV, models_dir
from speclocal.models.catalogue import load_catalogue
from speclocal.models.gguf_info import check_compat, estimate_memory, read_gguf


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


@dataclass
class Inspection:
    compatible: bool
    verdict: str  # fits | tight | does not fit
    lines: list[str] = field(default_factory=list)  # what was found, for the user


def inspect_plan(plan: ModelPlan, n_ctx: int) -> Inspection:
    """Read both GGUF headers: llama.cpp's pair compatibility rules and the memory estimate."""
    main = read_gguf(plan.main_path)
    draft = read_gguf(plan.draft_path) if plan.draft_path else None
    compat_ok, detail = True, "no draft model"
    if draft is not None:
        c = check_compat(main, draft)
        compat_ok, detail = c.ok, c.detail
    est = estimate_memory(main, draft if compat_ok else None, n_ctx)
    lines = [f"main   {main.path.name}: {main.architecture}, {main.quantization}, "
             f"{fmt_bytes(main.tensor_bytes)} weights"]
    if draft is not None:
        lines.append(f"draft  {draft.path.name}: {draft.architecture}, {draft.quantization}, "
                     f"{fmt_bytes(draft.tensor_bytes)} weights")
        lines.append(("compatible: " if compat_ok else "NOT compatible: ") + detail)
    lines.append(f"memory at context {est.n_ctx}: need {fmt_bytes(est.total)}; this machine has "
                 f"{fmt_bytes(est.ram_total)} ({fmt_bytes(est.ram_available)} available): {est.verdict}")
    return Inspection(compat_ok, est.verdict, lines)


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


def compatible_drafts(main_path: Path | None, candidates: list[tuple[str, str, Path]]) -> tuple[list, str]:
    """The candidates llama.cpp would accept as drafts for `main_path` (LM Studio's filtered list)."""
    if main_path is None or not main_path.is_file():
        return [], "main model not downloaded: no drafts to check"
    try:
        main = read_gguf(main_path)
    except SpeclocalError as e:
        return [], str(e)
    ok, rejected = [], 0
    for label, value, path in candidates:
        if path == main_path:
            continue
        try:
            info = read_gguf(path)
        except SpeclocalError:
            rejected += 1
            continue
        if info.tensor_bytes >= main.tensor_bytes:
            rejected += 1  # not smaller: no use as a draft
            continue
        if check_compat(main, info).ok:
            ok.append((label, value, path))
        else:
            rejected += 1
    hidden = f"; {rejected} other file(s) hidden" if rejected else ""
    note = f"{len(ok)} compatible draft(s) for {main_path.name}{hidden}"
    return ok, note


