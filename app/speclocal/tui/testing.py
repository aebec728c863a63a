"""The testing backend: a scripted stand-in for the engine, for the TUI's layout tests, snapshots and UI
benchmarks. It loads no model and measures nothing; never use it to claim anything about the engine."""

from __future__ import annotations

import re
import threading
import time
from typing import Sequence

from speclocal.drafts import MODES, Source, needs_draft_model
from speclocal.engine.types import GenerationRequest, GenerationResult, MemoryParts, StepEvent
from speclocal.errors import SpeclocalError
from speclocal.tasks import detect_task
from speclocal.tui.backend import OnStep

FAKE_TEXT = (
    "def fibonacci(n: int) -> int:\n"
    '    """Return the n-th Fibonacci number, iteratively."""\n'
    "    a, b = 0, 1\n"
    "    for _ in range(n):\n"
    "        a, b = b, a + b\n"
    "    return a\n"
)
_PIECE = re.compile(r"\s*[A-Za-z_]+|\s*\d+|\s*[^\sA-Za-z_\d]|\s+")


def fake_pieces(text: str) -> list[str]:
    """Split text into token-like pieces (words with their leading space, single symbols)."""
    return _PIECE.findall(text)


SOURCES = {Source.MODEL: (Source.MODEL,), Source.LOOKUP: (Source.LOOKUP,),
           Source.SUFFIX: (Source.SUFFIX, Source.SUFFIX, Source.STORE),
           Source.AUTO: (Source.SUFFIX, Source.MODEL, Source.STORE, Source.LOOKUP)}


class FakeBackend:
    """Deterministic tokens on a timer. Spec/lookup/auto steps accept drafts following `pattern`
    (`chat_pattern` when the last user message is chat or creative writing; capped by draft max), and
    times are synthetic (plain `plain_tps` tokens/s, a draft token costs `draft_cost` of a main token,
    verifying costs `verify_cost`), so numbers never vary. Drafting steps name their source in turn from
    `SOURCES` (auto: every source; suffix: the conversation and the store), and suffix and auto runs report a
    suffix store of `store_tokens` tokens that grows with each of them.

    `pause_at={"spec": 12}` blocks that mode once 12 tokens are out, until `resume()` or cancel;
    `paused` is set while blocked (for snapshots mid-run). `requests` records every request, `results`
    every result."""

    def __init__(self, text: str = FAKE_TEXT, *, plain_tps: float = 16.0, draft_cost: float = 0.3,
                 verify_cost: float = 1.2, pattern: Sequence[int] = (3, 2, 3, 1, 3, 0, 2, 3),
                 chat_pattern: Sequence[int] = (1, 0, 0, 2, 0, 1, 0, 0),
                 step_delay: float = 0.0, pause_at: dict[str, int] | None = None, has_draft: bool = True,
                 name: str = "fake-main.gguf + fake-draft.gguf", store_tokens: int = 48_213, notice: str = ""):
        self.pieces = fake_pieces(text)
        self.notice = notice
        self.plain_tps = plain_tps
        self.draft_cost = draft_cost
        self.verify_cost = verify_cost
        self.pattern = tuple(pattern)
        self.chat_pattern = tuple(chat_pattern)
        self.step_delay = step_delay
        self.pause_at = dict(pause_at or {})
        self._has_draft = has_draft
        self.name = name
        self.requests: list[GenerationRequest] = []
        self.results: list[GenerationResult] = []
        self.resets = 0
        self.store_tokens = store_tokens
        self.store_generations = 7
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
        draft = {"host": {"weights": 469_000_000, "kv": 50_331_648, "compute": 300_000_000, "output": 2_400_000}}
        return MemoryParts(main_weights=1_066_000_000, draft_weights=469_000_000 if self._has_draft else 0,
                           main_kv=117_440_512, draft_kv=50_331_648 if self._has_draft else 0,
                           main_held={"host": {"weights": 1_066_000_000, "kv": 117_440_512, "compute": 314_000_000,
                                               "output": 2_400_000}},
                           draft_held=draft if self._has_draft else {})

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

    def _result(self, request: GenerationRequest, events: list[StepEvent], stop: str) -> GenerationResult:
        """The result of the steps `events`, with synthetic prompt figures."""
        out = [p for e in events for p in e.pieces]
        elapsed = events[-1].elapsed if events else 0.0
        t_draft, t_verify = sum(e.t_draft for e in events), sum(e.t_verify for e in events)
        n_drafted, n_accepted = sum(e.drafted for e in events), sum(e.accepted for e in events)
        flags = [f for e in events for f in e.from_draft]
        steps = [(len(e.tokens), e.drafted, e.accepted, e.elapsed) for e in events]
        sources = [e.source for e in events]
        n, passes = len(out), len(steps)
        n_prompt = 20 + 10 * sum(1 for m in request.messages or () if m.get("role") == "user")
        return GenerationResult(
            mode=request.mode, text="".join(out), tokens=list(range(n)), from_draft=flags, stop_reason=stop,
            n_prompt=n_prompt, n_prompt_cached=0, t_prompt=0.05 + n_prompt / 400,
            ttft=0.05 + n_prompt / 400 + (elapsed / passes if passes else 0.0), n_generated=n, t_decode=elapsed,
            decode_tps=n / elapsed if elapsed else 0.0, n_drafted=n_drafted, n_accepted=n_accepted,
            acceptance=n_accepted / n_drafted if n_drafted else None, n_passes=passes,
            tokens_per_pass=n / passes if passes else 0.0, t_draft=t_draft, t_verify=t_verify, t_sample=0.0,
            draft_share=t_draft / elapsed if elapsed else 0.0, peak_rss=1_900_000_000, memory=self.memory(),
            auto={"sentence": "fake auto: drafted with the model on every step", "draft_model_brought_in": {"at": 0}}
            if request.mode == "auto" else None,
            steps=steps, step_sources=sources,
            draft_prompt_tokens=n_prompt - 1 if needs_draft_model(request.mode) else 0,
        )

    def generate(self, request: GenerationRequest, on_step: OnStep | None,
                 cancel: threading.Event) -> GenerationResult:
        if request.mode not in MODES:
            raise SpeclocalError(f"unknown mode {request.mode!r}")
        if request.mode == "spec" and not self._has_draft:
            raise SpeclocalError("mode 'spec' needs a draft model")
        self.requests.append(request)
        total = min(request.n_predict, len(self.pieces))
        k = request.draft.max if request.mode != "plain" else 0
        c = self.draft_cost if needs_draft_model(request.mode) else 0.0
        chat = detect_task(request.last_user_text) in ("chat", "creative")
        pattern = self.chat_pattern if chat else self.pattern
        unit = 1.0 / self.plain_tps
        events: list[StepEvent] = []
        cycle = SOURCES.get(Source.of_mode(request.mode), ())
        elapsed, n_out, stop = 0.0, 0, "length"
        while n_out < total:
            if not cancel.is_set():
                self._wait_if_paused(request.mode, n_out, cancel, on_step)
            if cancel.is_set():
                stop = "cancelled"
                break
            kk = min(k, total - n_out - 1)
            acc = min(pattern[len(events) % len(pattern)], kk) if kk > 0 else 0
            new = self.pieces[n_out: n_out + acc + 1]
            td, tv = kk * c * unit, (self.verify_cost if kk else 1.0) * unit
            elapsed += td + tv
            n_out += len(new)
            event = StepEvent(tokens=list(range(n_out - len(new), n_out)), pieces=list(new),
                              from_draft=[j < acc for j in range(len(new))], drafted=kk, accepted=acc, t_draft=td,
                              t_verify=tv, t_sample=0.0, n_generated=n_out, elapsed=elapsed,
                              source=cycle[len(events) % len(cycle)] if kk and cycle else None)
            events.append(event)
            if self.step_delay:
                time.sleep(self.step_delay)
            if on_step is not None:
                on_step(event)
        if n_out >= len(self.pieces) and stop == "length":
            stop = "eos"
        result = self._result(request, events, stop)
        if request.mode in ("suffix", "auto") and request.store != "off":
            added = 0
            if request.store == "on" and stop != "cancelled":
                added = result.n_prompt + result.n_generated
                self.store_tokens += added
                self.store_generations += 1
            result.store = {"generations": self.store_generations, "tokens": self.store_tokens,
                            "bytes": 4096 + 12 * self.store_tokens, "added": added, "add_s": 0.0}
        self.results.append(result)
        return result
