"""What `speclocal serve` tells its operator: one line per request on stderr (task, mode and drafter chosen,
tokens, t/s, acceptance) and, on exit, a summary per task type like the TUI's history table.

Memory stays bounded however long the server runs: per task type, counters and the latest `KEEP` rates."""

from __future__ import annotations

import sys
import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TextIO

from speclocal.engine.types import GenerationResult
from speclocal.stats import spread

KEEP = 10_000  # decode rates kept per task type for the medians


@dataclass
class TaskTally:
    requests: int = 0
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    cancelled: int = 0
    tps: deque = field(default_factory=lambda: deque(maxlen=KEEP))
    drafters: Counter = field(default_factory=Counter)  # the drafter used most in each request


class StatusLog:
    """Thread-safe: the engine worker records finished generations, the web side refusals."""

    def __init__(self, out: TextIO | None = None):
        self._out = out
        self._lock = threading.Lock()
        self.by_task: dict[str, TaskTally] = {}
        self.n = 0
        self.refused_busy = 0
        self.rejected = 0  # 4xx after parsing (e.g. a prompt over the context)
        self.failed = 0
        self.walls: deque = deque(maxlen=20)  # seconds per generation, for Retry-After

    def _print(self, line: str) -> None:
        out = self._out or sys.stderr
        try:
            print(line, file=out, flush=True)
        except (OSError, ValueError):  # stderr gone (a closed pipe): keep serving
            pass

    def finished(self, kind: str, task: str, result: GenerationResult, drafters: dict[str, int],
                 wall: float, queued: float) -> None:
        with self._lock:
            self.n += 1
            n = self.n
            t = self.by_task.setdefault(task, TaskTally())
            t.requests += 1
            t.tokens += result.n_generated
            t.drafted += result.n_drafted
            t.accepted += result.n_accepted
            top = next(iter(drafters), "plain")
            t.drafters[top] += 1
            if result.stop_reason == "cancelled":
                t.cancelled += 1
            elif result.n_generated > 1:
                t.tps.append(result.decode_tps)
            self.walls.append(wall)
        self._print(status_line(n, kind, task, result, drafters, wall, queued))

    def refused(self) -> None:
        with self._lock:
            self.refused_busy += 1

    def rejected_prompt(self) -> None:
        with self._lock:
            self.rejected += 1

    def failure(self, message: str) -> None:
        with self._lock:
            self.failed += 1
        self._print(f"speclocal: request failed: {message}")

    def note(self, message: str) -> None:
        self._print(f"speclocal: {message}")

    def mean_wall(self) -> float:
        with self._lock:
            return sum(self.walls) / len(self.walls) if self.walls else 1.0

    def summary(self) -> str:
        with self._lock:
            return summary_text(self.by_task, self.refused_busy, self.rejected, self.failed)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def status_line(n: int, kind: str, task: str, r: GenerationResult, drafters: dict[str, int], wall: float,
                queued: float) -> str:
    steps = sum(drafters.values())
    chosen = ", ".join(f"{d} {c}/{steps}" for d, c in drafters.items()) if len(drafters) > 1 else \
        next(iter(drafters), "plain")
    mode = f"auto -> {chosen}" if r.mode == "auto" else r.mode
    acc = "-" if r.acceptance is None else f"{r.acceptance:.0%} ({r.n_accepted}/{r.n_drafted})"
    wait = f", waited {queued:.1f} s" if queued >= 0.05 else ""
    return (f"speclocal: #{n} {kind}, {task} prompt: {mode}; {r.n_generated} tokens ({r.stop_reason}), "
            f"{r.decode_tps:.1f} t/s, acceptance {acc}; prompt {r.n_prompt} tokens "
            f"({r.n_prompt_cached} cached); {wall:.2f} s{wait}")


def summary_text(by_task: dict[str, TaskTally], refused: int, rejected: int, failed: int) -> str:
    total = sum(t.requests for t in by_task.values())
    lines = [f"speclocal serve: {total} generations"
             + f", {refused} refused busy (503), {rejected} prompts rejected (400), {failed} failed"]
    if not by_task:
        return lines[0]
    lines.append(f"{'task':10}{'requests':>9}{'tokens':>8}  {'t/s median (min-max)':22}{'acceptance':>11}"
                 f"  {'drafter used (requests)'}")
    for task, t in by_task.items():
        s = spread(list(t.tps))
        rate = f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})" if s else "-"
        used = ", ".join(f"{d} {c}" for d, c in t.drafters.most_common())
        cancelled = f" ({t.cancelled} cancelled)" if t.cancelled else ""
        lines.append(f"{task:10}{t.requests:>9}{t.tokens:>8}  {rate:22}"
                     f"{_pct(t.accepted / t.drafted if t.drafted else None):>11}  {used}{cancelled}")
    return "\n".join(lines)
