"""The suffix drafter's copy pointer: where in the context the output is copying from, found again after each
edit."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np

from speclocal.drafts import Source
from speclocal.engine.drafting.base import Proposal
from speclocal.engine.drafting.context import ContextIndex
from speclocal.engine.matching import Match, match_lengths

RATES = ("run-0", "run-4", "run-16", "run-64", "rejoin-1", "rejoin-2", "rejoin-3", "anchor")  # the pointer's counts


@cache
def calibration_priors() -> dict:
    """The calibration priors (`speclocal/data/priors.json`, written by `scripts/lookup_ceiling.py
    --write-priors`): "suffix", per task type the suffix drafter's accepted / predicted tokens per match-length
    class; "copy", per task type and for "all" of them, the copy pointer's rates; "model", per task type the draft
    model's acceptance."""
    return json.loads(resources.files("speclocal").joinpath("data/priors.json").read_text())


@dataclass
class Rate:
    """A probability counted from outcomes, starting from a prior worth `weight` trials."""

    prior: float
    weight: float = 4.0
    hits: float = 0.0
    trials: float = 0.0

    @property
    def value(self) -> float:
        return (self.hits + self.weight * self.prior) / (self.trials + self.weight)

    def add(self, hits: float, trials: float) -> None:
        self.hits += hits
        self.trials += trials


class CopyPointer:
    """Follows the place in the live context that the output is copying (a file being returned with edits, an
    earlier answer being revised). Suffix matching loses such a copy at every edit: after a renamed word or an
    inserted type hint the last few tokens occur nowhere, or in many places, and a match of one or two tokens
    drafts at most that many. The pointer remembers where the copy was and, after the output left it, looks
    for the last tokens only in the next `WINDOW` tokens of the source (the nearest place wins a tie): that
    is where an edited copy resumes. Where it has no position (or an edit ran past `GAP` tokens), a match of
    `ANCHOR` tokens or more anywhere in the context places it (the longest, then the latest).

    How likely each proposed token is comes from this generation's own record, counted like the suffix
    drafter's occurrences (`rates`): a copy that has gone on for longer is likelier to go on, so the chance
    that the next token follows is counted per class of the copy's length since the output last left it
    (`run-0` … `run-64`); the first token after the pointer was placed (`rejoin-1`, `rejoin-2`, `rejoin-3`:
    on that many tokens after an edit; `anchor`) has counts of its own. Every proposal is scored against
    what the main model then produced, drafted or not. The priors (`priors`, each worth `Rate.weight`
    outcomes) default to `PRIORS`, the rates at every position of the tiny pair's greedy answers to the
    whole built-in suite (`calibration_priors()["copy"]["all"]`); auto gives its task type's."""

    WINDOW = 64
    GAP = 32
    ANCHOR = 3
    RMAX = 16  # tokens compared when rejoining
    RUN_CLASSES = (0, 4, 16, 64)  # lower bounds of the run-length classes
    PRIORS = {name: calibration_priors()["copy"]["all"][name] for name in RATES}

    def __init__(self) -> None:
        self.clear(self.PRIORS)

    def clear(self, priors: dict[str, float] | None = None) -> None:
        """Forget the copy and the counts; count again from `priors` (over `PRIORS`; None: the same as before)."""
        if priors is not None:
            self.priors = self.PRIORS | priors
        self.src: int | None = None  # the source position of the next token, as of history length `at`
        self.at = 0
        self.run = 0
        self.left_at: int | None = None  # where the output left the copy, until it is back on it
        self.pending: tuple | None = None  # the last proposal: (history length, start, how placed, tokens)
        self.rates = {name: Rate(p) for name, p in self.priors.items()}

    def _rate(self, j: int, placed: str | None, run: int) -> Rate:
        """The count behind proposed token j: the first token's after the pointer was placed, else the run's."""
        if j == 0 and placed is not None:
            return self.rates[placed]
        return self.rates[f"run-{max(b for b in self.RUN_CLASSES if b <= run)}"]

    def propose(self, index: ContextIndex, live: Match | None, k: int, p_min: float) -> Proposal | None:
        """The source's continuation from where the output is copying, with its cumulative probabilities, or
        None when the output is not copying anything it can place."""
        n = len(index)
        buf = index.tokens
        self._score_pending(buf, n)
        if n < 2 or k <= 0:
            return None
        if self.at > n:  # the history was cut back: a new generation
            self.src, self.left_at = None, None
        start, matched, placed = None, 0, None
        if self.src is not None and self.at == n:  # the output followed the last proposal to its end
            start, matched = self.src, self.RMAX
        elif self.src is not None and n - self.at <= self.GAP:
            lo, hi = max(self.src - 1, 0), min(self.src + (n - self.at) + self.WINDOW, n - 1)
            js = np.flatnonzero(buf[lo:hi] == buf[n - 1]) + lo if hi > lo else ()
            if len(js):
                ml = match_lengths(buf, js.astype(np.int64), index.recent(self.RMAX))
                i = int(np.argmax(ml))  # the first of the longest: the nearest after the pointer
                start, matched = int(js[i]) + 1, int(ml[i])
                if self.left_at is not None:  # back on the source after an edit (else it outran a proposal)
                    placed = f"rejoin-{min(matched, 3)}"
                    self.run = min(matched, n - self.left_at)
        if start is None and live is not None and live.longest >= self.ANCHOR:
            i = int(np.argmax(live.ml))  # rows are most recent first
            start, matched, placed = int(live.rows[i]) + 1, live.longest, "anchor"
            self.run, self.left_at = matched, None  # the matched tokens were copied already
        if start is None or start >= n:
            return None
        self.src, self.at = start, n
        tokens = buf[start : start + k].tolist()
        self.pending = (n, start, placed, tokens)
        scores, p = [], 1.0
        for j in range(len(tokens)):
            p *= self._rate(j, placed, self.run + j).value
            if p < p_min:
                break
            scores.append(p)
        if not scores:
            return None
        return Proposal(tokens[: len(scores)], source=Source.COPY, scores=scores, match_len=matched)

    def _score_pending(self, buf: np.ndarray, n: int) -> None:
        """Count how the last proposal fared against the tokens produced since (once some were) and follow it:
        the pointer moves past what the output copied, or notes where the output left the source."""
        if self.pending is None:
            return
        n0, start, placed, tokens = self.pending
        if n < n0:
            self.pending = None
            return
        seen = min(n - n0, len(tokens))
        if seen == 0:
            return
        self.pending = None
        m = 0
        while m < seen and buf[n0 + m] == tokens[m]:
            m += 1
        for j in range(min(m + 1, seen)):  # outcomes seen: m tokens followed, then (if seen) one did not
            self._rate(j, placed, self.run).add(1.0 if j < m else 0.0, 1.0)
            self.run += j < m
        self.src, self.at = start + m, n0 + m
        if m < seen:
            self.run, self.left_at = 0, self.at
        elif m:
            self.left_at = None
