"""What the App needs from an engine, as an abstract adapter (harlequin's pattern).

`GenerationBackend` is the protocol the App is written against. The real engine behind it runs in a process of
its own (`speclocal.engine_process.ProcessBackend`, which `speclocal serve` uses too); tests drive the App with
`speclocal.tui.testing.FakeBackend`.
"""

from __future__ import annotations

import threading
from typing import Callable, Protocol

from speclocal.engine.types import GenerationRequest, GenerationResult, MemoryParts, StepEvent

OnStep = Callable[[StepEvent], None]


class GenerationBackend(Protocol):
    """The calls the App makes. `generate` runs in a worker thread; the rest are quick."""

    def describe(self) -> str:
        """One line naming the loaded models (shown in the header)."""

    @property
    def has_draft_model(self) -> bool: ...

    @property
    def notice(self) -> str:
        """What loading found that the user should hear once (e.g. a weight layout that crashed here), or ""."""

    def generate(self, request: GenerationRequest, on_step: OnStep | None,
                 cancel: threading.Event) -> GenerationResult:
        """Generate; call `on_step` after each main-model pass; stop before the next step once `cancel` is set
        and return the partial result (stop_reason "cancelled")."""

    def reset(self) -> None:
        """Forget KV caches (a new chat)."""

    def memory(self) -> MemoryParts: ...

    def close(self) -> None: ...
