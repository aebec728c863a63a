"""The policy: the cost model, the machine's measured cost curve, and auto mode, which speculates only
where the curve says it pays. `open_engine` builds an Engine that can run auto mode."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from speclocal.engine import Engine, GenerationRequest
    from speclocal.engine.drafting.base import Drafter
    from speclocal.options import Settings


def auto_drafter(engine: "Engine", req: "GenerationRequest", priors_file: "Path | None" = None) -> "Drafter":
    """Auto mode's drafter for one request: the cost curve of this machine, the prompt's task type, the
    draft model (if loaded), the engine's suffix drafter (with its store, as the request allows), prompt
    lookup, and the task priors learnt in `priors_file` (None: the user's)."""
    from speclocal.engine.drafting.lookup import PromptLookupDrafter
    from speclocal.errors import SpeclocalError
    from speclocal.policy.auto import AutoDrafter
    from speclocal.policy.profile import cost_curve
    from speclocal.tasks import TASKS, detect_task

    if req.task is not None and req.task not in TASKS:
        raise SpeclocalError(f"unknown task type {req.task!r} (choose from {', '.join(TASKS)})")
    model = engine.model_drafter(req) if engine.draft is not None else None
    return AutoDrafter(cost_curve(engine), req.task or detect_task(req.last_user_text), model,
                       PromptLookupDrafter(req.draft), suffix=engine.suffix_drafter(req),
                       second_candidates=engine.main.n_seq > 1, n_predict=req.n_predict,
                       priors_file=priors_file)


def open_engine(settings: "Settings", need_draft: bool = True, priors_file: "Path | None" = None, **kw) -> "Engine":
    """Load the engine for `settings` (see Engine.from_settings), able to run every mode, auto included (its
    task priors learnt in `priors_file`; None: the user's)."""
    from speclocal.engine import Engine

    return Engine.from_settings(settings, need_draft, auto_drafter=partial(auto_drafter, priors_file=priors_file), **kw)
