"""The `lookup` drafter: n-gram matches in the prompt and the output so far."""

from __future__ import annotations

import numpy as np

from speclocal.drafts import Source
from speclocal.engine.drafting.base import Drafter, DraftParams, Proposal, continues
from speclocal.engine.sampling import Sampling


class PromptLookupDrafter(Drafter):
    """Drafts by n-gram match: the tokens that followed an earlier occurrence of the current suffix
    (longest n-gram first) in prompt + output. Of several occurrences it takes the one whose preceding
    tokens match the current context longest (the latest on a tie): while an answer copies a stretch of
    the prompt, that is the place it is copying from, not a later line that happens to share the last
    few tokens. Costs no model evaluation."""

    CANDIDATES = 32  # occurrences compared, the latest ones
    CONTEXT = 32  # tokens of context compared at most

    def __init__(self, params: DraftParams):
        self.params = params
        self.reset()

    def reset(self) -> None:
        self._index: dict[tuple[int, ...], list[int]] = {}
        self._history: list[int] = []

    def cap(self, params: DraftParams) -> int:
        return params.lookup_max

    def prepare(self, prompt: list[int]) -> None:
        self.reset()

    def _extend_index(self, history: list[int]) -> None:
        """Index every n-gram whose continuation token exists: n-gram -> indices after it, in order. Within a
        generation the engine only appends, so only the new tokens are indexed; a history that is shorter or
        differs in the last tokens indexed starts the index over (`continues`)."""
        if not continues(self._history, history):
            self.reset()
        seen = len(self._history)
        lo, hi = self.params.ngram_min, self.params.ngram_max
        for end in range(max(seen, 1), len(history)):  # continuation index = end
            for n in range(lo, hi + 1):
                if end - n >= 0:
                    self._index.setdefault(tuple(history[end - n : end]), []).append(end)
        self._history.extend(history[seen:])

    def _best_occurrence(self, history: list[int], starts: list[int], n: int) -> int:
        """Of the occurrences continuing at `starts` (their last n tokens equal history's), the one whose
        earlier tokens match history's longest; the latest on a tie."""
        best, best_len = starts[-1], -1
        for start in reversed(starts[-self.CANDIDATES:]):
            m = n
            while m < self.CONTEXT and start - 1 - m >= 0 and history[start - 1 - m] == history[-1 - m]:
                m += 1
            if m > best_len:
                best, best_len = start, m
        return best

    def draft(self, history: list[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Proposal:
        self._extend_index(history)
        for n in range(self.params.ngram_max, self.params.ngram_min - 1, -1):
            if len(history) < n:
                continue
            starts = self._index.get(tuple(history[-n:]))
            if starts:
                start = self._best_occurrence(history, starts, n)
                tokens = history[start : start + k]
                if len(tokens) < max(self.params.min, 1):
                    return Proposal()
                return Proposal(tokens, source=Source.LOOKUP, match_len=n)
        return Proposal()

