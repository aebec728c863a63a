"""Plain data behind the widgets: live numbers of a run, history records, task detection, export.

Rates are computed from the engine's own clock (`elapsed` in each step), never from when the UI got
around to drawing, so what the TUI shows is what the engine measured.
"""

from __future__ import annotations

import csv
import io
import json
import re
import statistics
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from speclocal.tui.messages import StepInfo

MODE_LABELS = {"plain": "Plain", "spec": "Speculative", "lookup": "Prompt lookup"}
SPARK_BUCKET_S = 0.25  # one sparkline bar per quarter second of decoding
NOW_WINDOW_S = 1.0  # "tokens/s now" = rate over the last second of decoding

_CODE = re.compile(
    r"```|^\s*(def|class|import|from|fn|func|function|public|private|#include|package|SELECT|CREATE)\b|"
    r"[{};]\s*$|=>|->|\b(python|javascript|typescript|rust|golang|java|c\+\+|c#|sql|bash|shell|regex|json|yaml|"
    r"toml|html|css|code|script|function|method|refactor|implement|compile|bug|stack ?trace|unit tests?|"
    r"type hints?|docstring|api|class|parse|algorithm)\b",
    re.IGNORECASE | re.MULTILINE,
)


def detect_task(prompt: str) -> str:
    """'code' for prompts about code or structured output (JSON...), else 'chat'."""
    return "code" if _CODE.search(prompt) else "chat"


@dataclass
class LiveMode:
    """Numbers of one mode of the current run, updated as token batches arrive."""

    mode: str
    n_generated: int = 0
    elapsed: float = 0.0
    drafted: int = 0
    accepted: int = 0
    passes: int = 0
    t_draft: float = 0.0
    points: list[tuple[float, int]] = field(default_factory=lambda: [(0.0, 0)])
    outcome: object | None = None  # backend.Outcome once finished
    failed: str | None = None

    def add(self, steps: list[StepInfo]) -> None:
        for s in steps:
            self.n_generated = s.n_generated
            self.elapsed = s.elapsed
            self.drafted += s.drafted
            self.accepted += s.accepted
            self.passes += 1
            self.t_draft += s.t_draft
            self.points.append((s.elapsed, s.n_generated))

    @property
    def running(self) -> bool:
        return self.outcome is None and self.failed is None

    def tps_avg(self) -> float | None:
        if self.outcome is not None:
            return self.outcome.decode_tps
        return self.n_generated / self.elapsed if self.elapsed > 0 and self.n_generated else None

    def tps_now(self) -> float | None:
        if len(self.points) < 2:
            return None
        t1, n1 = self.points[-1]
        target = t1 - NOW_WINDOW_S
        t0, n0 = self.points[0]
        for t, n in reversed(self.points):
            if t <= target:
                t0, n0 = t, n
                break
        return (n1 - n0) / (t1 - t0) if t1 > t0 else None

    def acceptance(self) -> float | None:
        if self.outcome is not None:
            return self.outcome.acceptance
        return self.accepted / self.drafted if self.drafted else None

    def tokens_per_pass(self) -> float | None:
        if self.outcome is not None:
            return self.outcome.tokens_per_pass or None
        return self.n_generated / self.passes if self.passes else None

    def draft_share(self) -> float | None:
        if self.outcome is not None:
            return self.outcome.draft_share
        return self.t_draft / self.elapsed if self.elapsed > 0 else None

    def ttft(self) -> float | None:
        return self.outcome.ttft if self.outcome is not None else None

    def spark(self, bucket: float = SPARK_BUCKET_S) -> list[float]:
        """Tokens/s in consecutive buckets of decoding time (the last, partial bucket left out
        unless the mode has finished)."""
        if len(self.points) < 2:
            return []
        end = self.points[-1][0]
        n_buckets = int(end / bucket) + (1 if self.outcome is not None and end % bucket > 1e-9 else 0)
        out, j, prev_n = [], 0, 0
        for b in range(n_buckets):
            hi = min((b + 1) * bucket, end)
            while j + 1 < len(self.points) and self.points[j + 1][0] <= hi + 1e-12:
                j += 1
            n = self.points[j][1]
            width = hi - b * bucket
            out.append((n - prev_n) / width if width > 0 else 0.0)
            prev_n = n
        return out


@dataclass
class RunRecord:
    """One row of the history: a prompt run in plain and in the speculative mode."""

    run: int
    time: str
    task: str
    prompt: str
    spec_mode: str  # spec | lookup | "" (plain only)
    order: str  # e.g. "plain>spec"
    draft_max: int
    temperature: float
    plain_tokens: int | None
    plain_tps: float | None
    plain_ttft: float | None
    spec_tokens: int | None
    spec_tps: float | None
    spec_ttft: float | None
    speedup: float | None
    acceptance: float | None
    n_drafted: int
    n_accepted: int
    tokens_per_pass: float | None
    draft_share: float | None
    peak_rss: int

    @classmethod
    def from_outcomes(cls, run: int, task: str, prompt: str, order: list[str], draft_max: int, temperature: float,
                      outcomes: dict[str, object], peak_rss: int, now: datetime | None = None) -> "RunRecord":
        p = outcomes.get("plain")
        spec_mode = next((m for m in order if m != "plain"), "")
        s = outcomes.get(spec_mode) if spec_mode else None
        speedup = s.decode_tps / p.decode_tps if p is not None and s is not None and p.decode_tps else None
        return cls(
            run=run, time=(now or datetime.now()).isoformat(timespec="seconds"), task=task,
            prompt=" ".join(prompt.split())[:200], spec_mode=spec_mode, order=">".join(order), draft_max=draft_max,
            temperature=temperature,
            plain_tokens=p.n_generated if p else None, plain_tps=p.decode_tps if p else None,
            plain_ttft=p.ttft if p else None,
            spec_tokens=s.n_generated if s else None, spec_tps=s.decode_tps if s else None,
            spec_ttft=s.ttft if s else None, speedup=speedup,
            acceptance=s.acceptance if s else None, n_drafted=s.n_drafted if s else 0,
            n_accepted=s.n_accepted if s else 0, tokens_per_pass=s.tokens_per_pass if s else None,
            draft_share=s.draft_share if s else None, peak_rss=peak_rss,
        )


@dataclass
class TaskSummary:
    task: str
    runs: int
    plain_tps: float | None  # medians
    spec_tps: float | None
    speedup: float | None
    acceptance: float | None  # pooled: accepted / drafted over all runs

    def verdict(self) -> str:
        if self.speedup is None:
            return "-"
        if self.speedup >= 1.05:
            return "spec pays"
        if self.speedup <= 0.95:
            return "plain wins"
        return "even"


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(records: list[RunRecord]) -> list[TaskSummary]:
    """Per task type (in order of first appearance): medians of t/s and speedup, pooled acceptance."""
    out = []
    for task in dict.fromkeys(r.task for r in records):
        rs = [r for r in records if r.task == task]
        drafted = sum(r.n_drafted for r in rs)
        out.append(TaskSummary(
            task=task, runs=len(rs), plain_tps=_median([r.plain_tps for r in rs]),
            spec_tps=_median([r.spec_tps for r in rs]), speedup=_median([r.speedup for r in rs]),
            acceptance=sum(r.n_accepted for r in rs) / drafted if drafted else None,
        ))
    return out


def history_csv(records: list[RunRecord]) -> str:
    buf = io.StringIO()
    names = list(RunRecord.__dataclass_fields__)
    w = csv.DictWriter(buf, fieldnames=names, lineterminator="\n")
    w.writeheader()
    for r in records:
        w.writerow({k: ("" if v is None else v) for k, v in asdict(r).items()})
    return buf.getvalue()


def history_json(records: list[RunRecord], meta: dict | None = None) -> str:
    data = {"meta": meta or {}, "runs": [asdict(r) for r in records],
            "summary": [asdict(s) for s in summarize(records)]}
    return json.dumps(data, indent=2) + "\n"


def export_history(records: list[RunRecord], directory: Path, meta: dict | None = None,
                   now: datetime | None = None) -> tuple[Path, Path]:
    """Write history-<time>.csv and .json into `directory` (atomically); return both paths."""
    from speclocal.tui.config import atomic_write

    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    csv_path = directory / f"history-{stamp}.csv"
    json_path = directory / f"history-{stamp}.json"
    atomic_write(csv_path, history_csv(records))
    atomic_write(json_path, history_json(records, meta))
    return csv_path, json_path


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    if n >= 1e10:
        return f"{n / 1e9:.1f} GB"
    if n >= 1e9:
        return f"{n / 1e9:.2f} GB"
    if n >= 1e6:
        return f"{n / 1e6:.0f} MB"
    return f"{n / 1e3:.0f} kB"


def fmt(x: float | None, spec: str = ".1f", none: str = "-") -> str:
    return none if x is None else format(x, spec)
