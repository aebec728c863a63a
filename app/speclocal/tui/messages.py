"""Dataclass messages: the only way worker threads talk to the UI (toolong's pattern).

Workers call `post_message` (thread-safe, never blocks); the UI thread handles the message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.message import Message


@dataclass
class StepInfo:
    """The numbers of one main-model pass, without its text (the text travels in `pieces`)."""

    n_tokens: int
    drafted: int
    accepted: int
    t_draft: float
    t_verify: float
    t_sample: float
    n_generated: int
    elapsed: float


@dataclass
class RunStarted(Message):
    """One mode of a run is about to start (modes of a run follow each other, never overlap)."""

    run_id: int
    mode: str
    position: int  # 0 = first mode of this run
    n_modes: int


@dataclass
class TokensArrived(Message):
    """A batch of tokens (all steps since the last batch, ~every 80 ms at most)."""

    run_id: int
    mode: str
    pieces: list[str]
    from_draft: list[bool]
    steps: list[StepInfo] = field(default_factory=list)


@dataclass
class ModeFinished(Message):
    run_id: int
    mode: str
    outcome: Any  # backend.Outcome


@dataclass
class RunFinished(Message):
    run_id: int
    cancelled: bool


@dataclass
class RunFailed(Message):
    run_id: int
    mode: str
    error: str


@dataclass
class PlanReady(Message):
    """Model files resolved and inspected: load them, or show why not."""

    plan: Any  # backend.ModelPlan
    inspection: Any  # backend.Inspection | None


@dataclass
class BackendLoaded(Message):
    backend: Any  # backend.GenerationBackend
    seconds: float


@dataclass
class LoadFailed(Message):
    error: str


@dataclass
class FetchProgress(Message):
    model_id: str
    stage: str
    done: int
    total: int


@dataclass
class FetchDone(Message):
    error: str | None
    summary: list[str] = field(default_factory=list)
