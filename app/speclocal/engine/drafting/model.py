"""The `spec` drafter: a second, smaller model."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

from speclocal.drafts import Source
from speclocal.engine.drafting.base import Drafter, DraftParams, Proposal
from speclocal.engine.sampling import Dist, Sampling, distribution, sample, top_probability

if TYPE_CHECKING:
    from speclocal.engine.llama import LoadedModel


class ModelDrafter(Drafter):
    """A second, smaller GGUF model with its own KV cache, rolled back to the accepted prefix. It processes
    the prompt in `prepare` (spec mode), or, when auto brings it in later, catches up on the prompt and the
    answer so far at its first draft; either way it counts the prompt tokens it processed and their time."""

    CATCH_UP = 2  # a draft step evaluates at most this many tokens it does not hold; more is a catch-up

    def __init__(self, model: "LoadedModel", params: DraftParams, main_vocab: int):
        self.model = model
        self.params = params
        self.main_vocab = main_vocab
        self.begin([])

    def begin(self, prompt: list[int]) -> None:
        """A generation starts from `prompt`: its counters start at zero; nothing is processed yet."""
        self.n_prompt_tokens, self.prompt_len = 0, len(prompt)
        self.t_prompt = 0.0

    def behind(self, history: list[int]) -> int:
        """Tokens of `history` (but the pending last one) that the model would have to process to draft."""
        return len(history) - 1 - self.model.held(history, keep_last=True)

    def catch_up(self, tokens: list[int]) -> None:
        """Process what the model does not hold of `tokens` in one batch, counting the prompt's share."""
        m = self.model
        kept = m.reuse_prefix(tokens, keep_last=False)
        if kept >= len(tokens):
            return
        t0 = time.perf_counter()
        m.eval(tokens[kept:], outputs="none")
        in_prompt = max(0, min(self.prompt_len, len(tokens)) - kept)
        self.n_prompt_tokens += in_prompt
        self.t_prompt += (time.perf_counter() - t0) * in_prompt / (len(tokens) - kept)

    def cap(self, params: DraftParams) -> int:
        return params.max

    def prepare(self, prompt: list[int]) -> None:
        self.begin(prompt)
        self.catch_up(prompt[:-1])

    def prompt_work(self) -> tuple[int, float]:
        return self.n_prompt_tokens, self.t_prompt

    def draft(self, history: list[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Proposal:
        m = self.model
        kept = m.reuse_prefix(history)  # what it holds of history (but the pending token); one scan a step
        if len(history) - 1 - kept > self.CATCH_UP:
            self.catch_up(history[:-1])
            kept = len(m.tokens)
        rows = m.eval(history[kept:], outputs="last")
        tokens: list[int] = []
        qs: list[Dist] | None = None if sampling.greedy else []
        while True:
            logits = rows[-1]
            if self.params.p_min > 0 and top_probability(logits) < self.params.p_min:
                break
            if qs is None:
                tok = int(logits.argmax())
            else:
                q = distribution(logits, sampling).below(self.main_vocab)
                tok = sample(q, rng)
                qs.append(q)
            if tok >= self.main_vocab:
                if qs:
                    qs.pop()
                break
            tokens.append(tok)
            if len(tokens) >= k:
                break
            rows = m.eval([tok], outputs="last")
        if len(tokens) < self.params.min:
            return Proposal(q=None if qs is None else [])
        return Proposal(tokens, qs, Source.MODEL)

    def rollback(self, history: list[int]) -> None:
        m = self.model
        if m.tokens:
            m.truncate(m.held(history, keep_last=True))

    def reset(self) -> None:
        self.model.clear()
