"""A benchmark-only drafter with a set acceptance rate."""

from __future__ import annotations

import numpy as np

from speclocal.drafts import Source
from speclocal.engine.drafting.base import Drafter, Proposal
from speclocal.engine.drafting.model import ModelDrafter
from speclocal.engine.sampling import Sampling
from speclocal.errors import SpeclocalError


class SyntheticDrafter(Drafter):
    """Benchmark-only (llama.cpp's --spec-synth-rates): proposes the main model's own greedy continuation,
    known from a plain run (`reference`, the tokens after the prompt), each token right with probability
    `rate` and otherwise replaced by a wrong one, so acceptance is what the experiment sets, at any rate.
    Drafting is free unless `charge` (the real draft model) is given: then each step also runs it for as many
    tokens as are proposed, and pays its real decode time."""

    def __init__(self, reference: list[int], rate: float, n_vocab: int, seed: int = 0,
                 charge: ModelDrafter | None = None):
        if not 0 <= rate <= 1:
            raise SpeclocalError(f"a synthetic acceptance rate is in [0, 1], got {rate}")
        self.reference, self.rate, self.n_vocab, self.charge = reference, rate, n_vocab, charge
        self._rng = np.random.default_rng(seed)
        self._prompt_len = 0

    def prepare(self, prompt: list[int]) -> None:
        self._prompt_len = len(prompt)
        if self.charge is not None:
            self.charge.prepare(prompt)

    def prompt_work(self) -> tuple[int, float]:
        return self.charge.prompt_work() if self.charge is not None else (0, 0.0)

    def draft(self, history: list[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Proposal:
        at = len(history) - self._prompt_len  # reference index of the first token to propose
        truth = self.reference[at : at + k]
        if self.charge is not None and truth:
            self.charge.draft(history, len(truth), sampling, rng)  # its time, not its tokens
        wrong = self._rng.random(len(truth)) >= self.rate
        return Proposal([(t + 1) % self.n_vocab if w else t for t, w in zip(truth, wrong)], source=Source.SYNTHETIC)

    def rollback(self, history: list[int]) -> None:
        if self.charge is not None:
            self.charge.rollback(history)

    def reset(self) -> None:
        if self.charge is not None:
            self.charge.reset()
