"""What the App needs from an engine, as an abstract adapter (harlequin's pattern).

`GenerationBackend` is the protocol the App is written against. `EngineBackend` is the real engine behind
it (llama.cpp is imported only when one is built, never at import time); the App runs it in a process of
its own (`speclocal.tui.engine_process.ProcessBackend`). Tests drive the App with
`speclocal.tui.testing.FakeBackend`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from speclocal import options
from speclocal.engine.types import GenerationRequest, GenerationResult, MemoryParts, StepEvent

OnStep = Callable[[StepEvent], None]


class GenerationBackend(Protocol):
    """The calls the App makes. `generate` runs in a worker thread; the rest are quick."""

    def describe(self) -> str:
        """One line naming the loaded models (shown in the header)."""

    @property
    def has_draft_model(self) -> bool: ...

    def generate(self, request: GenerationRequest, on_step: OnStep | None,
                 cancel: threading.Event) -> GenerationResult:
        """Generate; call `on_step` after each main-model pass; stop before the next step once `cancel` is set
        and return the partial result (stop_reason "cancelled")."""

    def reset(self) -> None:
        """Forget KV caches (a new chat)."""

    def memory(self) -> MemoryParts: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class LoadSpec:
    """What loading needs: the planned files and the load settings."""

    main_path: Path
    draft_path: Path | None
    n_ctx: int = options.default("ctx_size")
    threads: int = options.default("threads")  # 0 = one per physical core
    n_gpu_layers: str = options.default("n_gpu_layers")  # auto | all | a number
    force: bool = False  # load although the memory estimate says it will not fit
    repack: bool = options.default("repack")  # llama.cpp's weight repacking for this CPU (--no-repack: off)
    store_dir: Path | None = None  # the suffix store's directory (opened only when a request uses it)


class EngineBackend:
    """The real engine behind the protocol. Construction loads the weights (seconds)."""

    def __init__(self, spec: LoadSpec):
        from speclocal.engine import Engine  # imports llama_cpp: only here, in the engine process
        from speclocal.policy import auto_drafter

        # the pair was checked by inspect_plan() before loading (the verdict screen), so not again here
        self.engine = Engine(spec.main_path, spec.draft_path, n_ctx=spec.n_ctx, n_threads=spec.threads or None,
                             n_gpu_layers=spec.n_gpu_layers, check_pair=False, force=spec.force,
                             auto_drafter=auto_drafter, store_dir=spec.store_dir, repack=spec.repack)

    def describe(self) -> str:
        e = self.engine
        names = e.main.path.name + (f" + {e.draft.path.name}" if e.draft else "")
        return f"{names} · {e.compute} · {e.n_threads} threads · ctx {e.main.n_ctx}"

    @property
    def has_draft_model(self) -> bool:
        return self.engine.draft is not None

    def generate(self, request: GenerationRequest, on_step: OnStep | None,
                 cancel: threading.Event) -> GenerationResult:
        return self.engine.generate(request, on_step=on_step, cancel=cancel)

    def reset(self) -> None:
        self.engine.reset()

    def memory(self) -> MemoryParts:
        return self.engine.memory()

    def close(self) -> None:
        self.engine.close()
