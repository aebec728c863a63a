"""What the App needs from an engine, as an abstract adapter (harlequin's pattern).

`GenerationBackend` is the protocol the App is written against; `EngineBackend` wraps the real
`speclocal.engine.Engine` (llama.cpp is imported only when it is built, never at import time; the
App runs it in a process of its own, `speclocal.tui.engine_process.ProcessBackend`) and
`FakeBackend` produces scripted tokens on a timer for tests and demos.

Also here: resolving the configured pair to files (`plan_models`) and reading their headers for
the compatibility and memory verdict (`inspect_plan`), both without loading weights.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Protocol, Sequence

from speclocal.errors import SpeclocalError
from speclocal.engine.types import MemoryParts, StepEvent

# llama.cpp's sampling defaults (speclocal.engine.Sampling), kept here so the TUI need not import it
TOP_K, TOP_P, MIN_P = 40, 0.95, 0.05


@dataclass(frozen=True)
class RunRequest:
    """One generation the App asks for: a chat (messages) in one mode."""

    messages: tuple[dict, ...]
    mode: str  # plain | spec | lookup
    n_predict: int = 256
    temperature: float = 0.0
    seed: int = 0
    draft_max: int = 3
    draft_min: int = 0
    draft_p_min: float = 0.0
    task: str | None = None  # the task type (auto mode's prior); None = let the engine detect it


@dataclass(frozen=True)
class Outcome:
    """The summary of one finished (or cancelled) generation."""

    mode: str
    text: str
    n_generated: int
    stop_reason: str
    n_prompt: int
    n_prompt_cached: int
    ttft: float
    t_decode: float
    decode_tps: float
    n_drafted: int
    n_accepted: int
    acceptance: float | None
    n_passes: int
    tokens_per_pass: float
    draft_share: float
    peak_rss: int
    memory: MemoryParts
    dropped_turns: int = 0  # oldest chat turns left out so the prompt fits the context
    auto: dict | None = None  # auto mode: what it chose and why ("sentence")

    @classmethod
    def from_result(cls, r, dropped_turns: int = 0) -> "Outcome":
        """The summary of an engine `GenerationResult` (same field names, without tokens and steps)."""
        return cls(**{f.name: getattr(r, f.name) for f in fields(cls) if f.name != "dropped_turns"},
                   dropped_turns=dropped_turns)


OnStep = Callable[[StepEvent], None]


class GenerationBackend(Protocol):
    """The calls the App makes. `generate` runs in a worker thread; the rest are quick."""

    def describe(self) -> str:
        """One line naming the loaded models (shown in the header)."""

    @property
    def has_draft_model(self) -> bool: ...

    def generate(self, request: RunRequest, on_step: OnStep | None, cancel: threading.Event) -> Outcome:
        """Generate; call `on_step` after each main-model pass; stop before the next step once
        `cancel` is set and return the partial outcome (stop_reason "cancelled")."""

    def reset(self) -> None:
        """Forget KV caches (a new chat)."""

    def memory(self) -> MemoryParts: ...

    def close(self) -> None: ...


# ---- the real engine ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadSpec:
    main_path: Path
    draft_path: Path | None
    n_ctx: int = 4096
    threads: int = 0  # 0 = default (physical cores)
    n_gpu_layers: int = 0
    force: bool = False  # load although the memory estimate says it will not fit


class EngineBackend:
    """`speclocal.engine.Engine` behind the protocol. Construction loads the weights (seconds)."""

    def __init__(self, spec: LoadSpec):
        from speclocal.engine import Engine  # imports llama_cpp: only here, in the loading worker

        # the pair was checked by inspect_plan() before loading (the verdict screen), so not again here
        self.engine = Engine(spec.main_path, spec.draft_path, n_ctx=spec.n_ctx, n_threads=spec.threads or None,
                             n_gpu_layers=spec.n_gpu_layers, check_pair=False, force=spec.force)
        self.spec = spec

    @classmethod
    def wrap(cls, engine) -> "EngineBackend":
        """A backend around an Engine that is already loaded (benchmarks share one engine)."""
        self = cls.__new__(cls)
        self.engine = engine
        self.spec = None
        return self

    def describe(self) -> str:
        e = self.engine
        names = e.main.path.name + (f" + {e.draft.path.name}" if e.draft else "")
        return f"{names} · {e.n_threads} threads · ctx {e.main.n_ctx}"

    @property
    def has_draft_model(self) -> bool:
        return self.engine.draft is not None

    def generate(self, request: RunRequest, on_step: OnStep | None, cancel: threading.Event) -> Outcome:
        from speclocal.engine import DraftParams, GenerationRequest, Sampling

        # a long chat: leave out the oldest turns so that the prompt and the answer fit the context
        messages, dropped = self.engine.fit_chat(list(request.messages), reserve=request.n_predict)
        req = GenerationRequest(
            messages=tuple(messages), mode=request.mode, n_predict=request.n_predict,
            sampling=Sampling(temp=request.temperature, top_k=TOP_K, top_p=TOP_P, min_p=MIN_P, seed=request.seed),
            draft=DraftParams(max=request.draft_max, min=request.draft_min, p_min=request.draft_p_min),
            task=request.task if request.mode == "auto" else None,
        )
        return Outcome.from_result(self.engine.generate(req, on_step=on_step, cancel=cancel), dropped)

    def reset(self) -> None:
        self.engine.reset()

    def memory(self) -> MemoryParts:
        m = self.engine.memory()
        return MemoryParts(m.main_weights, m.draft_weights, m.main_kv, m.draft_kv)

    def close(self) -> None:
        self.engine.close()


# ---- a scripted fake -----------------------------------------------------------------------------
FAKE_TEXT = (
    "def fibonacci(n: int) -> int:\n"
    '    """Return the n-th Fibonacci number, iteratively."""\n'
    "    a, b = 0, 1\n"
    "    for _ in range(n):\n"
    "        a, b = b, a + b\n"
    "    return a\n"
)
_PIECE = re.compile(r"\s*[A-Za-z_]+|\s*\d+|\s*[^\sA-Za-z_\d]|\s+")


_CODEISH = re.compile(r"```|\b(code|function|python|def|class|json|sql|script|regex|implement)\b", re.I)


def _looks_like_code(text: str) -> bool:
    return bool(_CODEISH.search(text))


def fake_pieces(text: str) -> list[str]:
    """Split text into token-like pieces (words with their leading space, single symbols)."""
    return _PIECE.findall(text)


class FakeBackend:
    """Deterministic tokens on a timer. Spec/lookup/auto steps accept drafts following `pattern`
    (`chat_pattern` when the last user message does not look like code; capped by draft max), and times are synthetic (plain `plain_tps` tokens/s, a draft token
    costs `draft_cost` of a main token, verifying costs `verify_cost`), so numbers never vary.

    `pause_at={"spec": 12}` blocks that mode once 12 tokens are out, until `resume()` or cancel;
    `paused` is set while blocked (for snapshots mid-run). `requests` records every request."""

    def __init__(self, text: str = FAKE_TEXT, *, plain_tps: float = 16.0, draft_cost: float = 0.3,
                 verify_cost: float = 1.2, pattern: Sequence[int] = (3, 2, 3, 1, 3, 0, 2, 3),
                 chat_pattern: Sequence[int] = (1, 0, 0, 2, 0, 1, 0, 0),
                 step_delay: float = 0.0, pause_at: dict[str, int] | None = None, has_draft: bool = True,
                 name: str = "fake-main.gguf + fake-draft.gguf"):
        self.pieces = fake_pieces(text)
        self.plain_tps = plain_tps
        self.draft_cost = draft_cost
        self.verify_cost = verify_cost
        self.pattern = tuple(pattern)
        self.chat_pattern = tuple(chat_pattern)
        self.step_delay = step_delay
        self.pause_at = dict(pause_at or {})
        self._has_draft = has_draft
        self.name = name
        self.requests: list[RunRequest] = []
        self.outcomes: list[Outcome] = []
        self.resets = 0
        self.paused = threading.Event()
        self._resume = threading.Event()
        self.closed = False

    def describe(self) -> str:
        return f"{self.name} · fake backend"

    @property
    def has_draft_model(self) -> bool:
        return self._has_draft

    def resume(self) -> None:
        self._resume.set()

    def memory(self) -> MemoryParts:
        return MemoryParts(main_weights=1_066_000_000, draft_weights=469_000_000 if self._has_draft else 0,
                      main_kv=117_440_512, draft_kv=50_331_648 if self._has_draft else 0)

    def reset(self) -> None:
        self.resets += 1

    def close(self) -> None:
        self.closed = True
        self._resume.set()

    def _wait_if_paused(self, mode: str, n: int, cancel: threading.Event, on_step) -> None:
        at = self.pause_at.get(mode)
        if at is None or n < at:
            return
        del self.pause_at[mode]
        flush = getattr(on_step, "flush", None)
        if flush is not None:
            flush()  # show everything produced so far before blocking (deterministic snapshots)
        self.paused.set()
        while not (self._resume.is_set() or cancel.is_set() or self.closed):
            self._resume.wait(0.01)
        self.paused.clear()

    def generate(self, request: RunRequest, on_step: OnStep | None, cancel: threading.Event) -> Outcome:
        if request.mode not in ("plain", "spec", "lookup", "auto"):
            raise SpeclocalError(f"unknown mode {request.mode!r}")
        if request.mode == "spec" and not self._has_draft:
            raise SpeclocalError("mode 'spec' needs a draft model")
        self.requests.append(request)
        total = min(request.n_predict, len(self.pieces))
        k = request.draft_max if request.mode != "plain" else 0
        c = self.draft_cost if request.mode in ("spec", "auto") else 0.0
        last_user = next((m["content"] for m in reversed(request.messages) if m.get("role") == "user"), "")
        pattern = self.pattern if _looks_like_code(last_user) else self.chat_pattern
        unit = 1.0 / self.plain_tps
        out: list[str] = []
        flags: list[bool] = []
        elapsed = t_draft = t_verify = 0.0
        n_drafted = n_accepted = passes = 0
        stop = "length"
        i = 0
        while len(out) < total:
            if cancel.is_set():
                stop = "cancelled"
                break
            self._wait_if_paused(request.mode, len(out), cancel, on_step)
            if cancel.is_set():
                stop = "cancelled"
                break
            kk = min(k, total - len(out) - 1)
            acc = min(pattern[i % len(pattern)], kk) if kk > 0 else 0
            new = self.pieces[len(out): len(out) + acc + 1]
            origins = [j < acc for j in range(len(new))]
            td, tv = kk * c * unit, (self.verify_cost if kk else 1.0) * unit
            elapsed += td + tv
            t_draft += td
            t_verify += tv
            n_drafted += kk
            n_accepted += acc
            passes += 1
            i += 1
            out += new
            flags += origins
            if self.step_delay:
                time.sleep(self.step_delay)
            if on_step is not None:
                on_step(StepEvent(list(range(len(out) - len(new), len(out))), list(new), origins, kk, acc, td, tv, 0.0,
                             len(out), elapsed))
        if len(out) >= len(self.pieces) and stop == "length":
            stop = "eos"
        n = len(out)
        n_prompt = 20 + 10 * sum(1 for m in request.messages if m.get("role") == "user")
        outcome = Outcome(
            mode=request.mode, text="".join(out), n_generated=n, stop_reason=stop, n_prompt=n_prompt,
            n_prompt_cached=0, ttft=0.05 + n_prompt / 400 + (elapsed / passes if passes else 0.0), t_decode=elapsed,
            decode_tps=n / elapsed if elapsed else 0.0, n_drafted=n_drafted, n_accepted=n_accepted,
            acceptance=n_accepted / n_drafted if n_drafted else None, n_passes=passes,
            tokens_per_pass=n / passes if passes else 0.0, draft_share=t_draft / elapsed if elapsed else 0.0,
            peak_rss=1_900_000_000, memory=self.memory(),
            auto={"sentence": "fake auto: drafted with the model on every step"} if request.mode == "auto" else None,
        )
        self.outcomes.append(outcome)
        return outcome


# ---- which files, and may they be loaded -------------------------------------------------------
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
        if self.models_dir is not None:
            import os

            from speclocal.models.catalogue import MODELS_ENV

            if os.environ.get(MODELS_ENV):
                cmd += f" --dir {self.models_dir}"
        return cmd


def plan_models(pair: str = "", main: str = "", draft: str = "", want_draft: bool = True,
                directory: str | Path | None = None) -> ModelPlan:
    """Resolve a pair id and -m/-md style overrides to paths (catalogue ids or GGUF files)."""
    from speclocal.models.catalogue import load_catalogue, models_dir

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
    compat_detail: str
    verdict: str  # fits | tight | does not fit
    need: int
    ram_total: int
    ram_available: int
    lines: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.compatible and self.verdict != "does not fit"


def inspect_plan(plan: ModelPlan, n_ctx: int) -> Inspection:
    """Read both GGUF headers: llama.cpp's pair compatibility rules and the memory estimate."""
    from speclocal.models.gguf_info import check_compat, estimate_memory, read_gguf

    main = read_gguf(plan.main_path)
    draft = read_gguf(plan.draft_path) if plan.draft_path else None
    compat_ok, detail = True, "no draft model"
    if draft is not None:
        c = check_compat(main, draft)
        compat_ok, detail = c.ok, c.detail
    est = estimate_memory(main, draft if compat_ok else None, n_ctx)
    lines = [f"main   {main.path.name}: {main.architecture}, {main.quantization}, {_gb(main.tensor_bytes)} weights"]
    if draft is not None:
        lines.append(f"draft  {draft.path.name}: {draft.architecture}, {draft.quantization}, "
                     f"{_gb(draft.tensor_bytes)} weights")
        lines.append(("compatible: " if compat_ok else "NOT compatible: ") + detail)
    lines.append(f"memory at context {est.n_ctx}: need {_gb(est.total)}; this machine has {_gb(est.ram_total)} "
                 f"({_gb(est.ram_available)} available): {est.verdict}")
    return Inspection(compat_ok, detail, est.verdict, est.total, est.ram_total, est.ram_available, lines)


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"
