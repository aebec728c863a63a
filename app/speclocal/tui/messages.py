"""Dataclass messages: the only way worker threads talk to the UI (toolong's pattern).

Workers call `post_message` (thread-safe, never blocks); the UI thread handles the message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from textual.message import Message

from speclocal.engine.types import GenerationResult, StepEvent


@dataclass
class RunStarted(Message):
    """One mode of a run is about to start (modes of a run follow each other, never overlap)."""

    run_id: int
    mode: str
    position: int  # 0 = first mode of this run
    n_modes: int


@dataclass
class TokensArrived(Message):
    """A batch of steps: every main-model pass since the last batch (one batch per BATCH_INTERVAL_S at most)."""

    run_id: int
    mode: str
    steps: list[StepEvent]

    @property
    def pieces(self) -> list[str]:
        return [p for s in self.steps for p in s.pieces]

    @property
    def from_draft(self) -> list[bool]:
        return [f for s in self.steps for f in s.from_draft]

    @property
    def sources(self) -> list[str | None]:
        """Each token's draft source if it was an accepted draft token, else None."""
        return [s.source if f else None for s in self.steps for f in s.from_draft]


@dataclass
class ModeFinished(Message):
    run_id: int
    mode: str
    result: GenerationResult


@dataclass
class RunFinished(Message):
    run_id: int
    cancelled: bool


@dataclass
class RunFailed(Message):
    run_id: int
    mode: str
    error: str
    crashed: bool = False  # the engine died (a native crash): the next run starts a new one


@dataclass
class PlanReady(Message):
    """Model files resolved and inspected: load them, or show why not."""

    plan: Any  # models.plan.ModelPlan
    check: Any  # models.plan.LoadCheck


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
