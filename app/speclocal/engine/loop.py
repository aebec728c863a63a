"""The decode loop, the same for every mode: draft, verify in one main-model pass, accept a prefix and one token of
the main model's own, roll both models' caches back to what was kept (llama.cpp's speculative-simple, mlx-lm's
speculative_generate_step)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from speclocal.engine import verify
from speclocal.engine.drafting.base import Drafter, Proposal
from speclocal.engine.sampling import Sampling
from speclocal.engine.tally import Tally
from speclocal.engine.text import Text, cut_at_stop
from speclocal.engine.types import GenerationRequest, StepEvent

if TYPE_CHECKING:
    from speclocal.engine.llama import LoadedModel

NO_DRAFT = Proposal()


@dataclass
class Decoded:
    """What the loop leaves: its tally, the text, why it stopped, and the prompt tokens the cache already held."""

    tally: Tally
    text: Text
    stop_reason: str
    cached: int


def decode(main: "LoadedModel", drafter: Drafter, req: GenerationRequest, prompt: list[int], s: Sampling,
           on_step: Callable[[StepEvent], None] | None, cancel: threading.Event | None) -> Decoded:
    """Generate after `prompt` with `drafter`, reporting each step to `on_step`; `cancel` is checked before each."""
    rng = np.random.default_rng(s.seed)
    tally, text = Tally(), Text(main.piece, req.stop)
    # prompt processing: all but the last token, reusing what the cache holds (up to the request's limit)
    cached = main.reuse_prefix(prompt[:-1][: req.reuse_limit], keep_last=False)
    main.eval(prompt[cached:-1], outputs="none")
    drafter.prepare(prompt)
    tally.decoding(drafter.prompt_work()[1])
    history = list(prompt)  # main's KV holds history[:-1]; history[-1] is the pending token
    stop_reason = "length"
    while tally.n_generated < req.n_predict:
        room, cancelled = main.n_ctx - len(main.tokens) - 1, cancel is not None and cancel.is_set()
        if cancelled or room < 0:
            stop_reason = "cancelled" if cancelled else "context"
            break
        k = min(drafter.cap(req.draft), req.n_predict - tally.n_generated - 1, room)
        t0 = time.perf_counter()
        draft = drafter.draft(history, k, s, rng) if k > 0 else NO_DRAFT  # 1. draft
        t1 = time.perf_counter()
        base = len(main.tokens)
        rows = verify.evaluate(main, history[-1], draft)  # 2. verify in one pass
        t2 = time.perf_counter()
        new, n_acc, on_branch = verify.accept(main, rows, draft, s, rng)  # 3. accept the agreed prefix + one token
        eog = next((i for i, t in enumerate(new) if main.is_eog(t)), None)
        if eog is not None:
            new, n_acc, stop_reason = new[:eog], min(n_acc, eog), "eos"
        drafter.observe(draft.n_drafted, n_acc, on_branch)
        main.truncate(base + len(new))  # 4. roll back: the KV cache holds history[:-1] again
        history.extend(new)
        drafter.rollback(history)  # and the draft model's, what it drafted past the kept tokens
        t3 = time.perf_counter()

        last = (stop_reason == "eos" or tally.n_generated + len(new) >= req.n_predict
                or len(main.tokens) >= main.n_ctx)  # no step follows: nothing is held back
        pieces, past_stop = text.add(new, final=last)
        n_draft = draft.n_drafted
        if text.stopped:  # the output ends at the stop string, and so do its tokens and counts
            stop_reason = "stop"
            new, n_acc, n_draft, earlier = cut_at_stop(new, n_acc, n_draft, past_stop)
            tally.drop(earlier)  # tokens of earlier steps that began the stop string
        source = draft.source.reported if n_draft else None
        event = tally.step(new, pieces, [i < n_acc for i in range(len(new))], n_draft, n_acc, t0, t1, t2, t3, source,
                           drafter.prompt_work()[1])
        if on_step is not None:
            on_step(event)
        if stop_reason in ("eos", "stop"):
            break
    tally.stop()
    return Decoded(tally, text, stop_reason, cached)
