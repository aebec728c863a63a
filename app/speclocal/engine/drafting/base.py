"""What every drafter shares: its parameters, the `Proposal` it returns, the `Drafter` interface (which, as
itself, proposes nothing), and plain decoding's drafter, which is not asked to."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from speclocal import options
from speclocal.drafts import Source
from speclocal.engine.sampling import Dist, Sampling
from speclocal.errors import SpeclocalError


CONTINUES_TAIL = 8  # last indexed tokens a history must repeat to be taken as the continuation of an index


def continues(indexed: Sequence[int], history: Sequence[int]) -> bool:
    """Whether `history` goes on from what a model-free drafter has indexed (`indexed`): it is at least as long
    and repeats the last CONTINUES_TAIL indexed tokens. Within a generation the engine only appends, so the
    index then takes just the new tokens; anything else starts it over."""
    n = len(indexed)
    lo = max(0, n - CONTINUES_TAIL)
    return len(history) >= n and list(indexed[lo:n]) == list(history[lo:n])


@dataclass(frozen=True)
class DraftParams:
    """Draft lengths and thresholds: --draft-max, --draft-min, --draft-p-min (llama.cpp's meanings) and
    --lookup-max; defaults and allowed values are the settings' (speclocal.options)."""

    max: int = options.default("draft_max")  # draft-model tokens per step
    min: int = options.default("draft_min")
    p_min: float = options.default("draft_p_min")
    lookup_max: int = options.default("lookup_max")  # model-free draft tokens per step
    ngram_max: int = 4  # prompt lookup: longest n-gram tried first
    ngram_min: int = 2

    def __post_init__(self) -> None:
        options.check("draft_max", self.max)
        options.check("lookup_max", self.lookup_max)
        options.check("draft_min", self.min)
        options.check("draft_p_min", self.p_min)
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise SpeclocalError("prompt lookup needs 1 <= ngram-min <= ngram-max")


@dataclass
class Proposal:
    """What a drafter proposes for one step; auto and the decode loop read nothing else. `q`: each token's draft
    distribution, None for point masses. `scores`: the cumulative probability that each prefix is accepted (the
    suffix drafter's estimates; empty where a drafter has none). `match_len`: the match a model-free proposal was
    drafted from. `runner_up`: a second candidate that shares `tokens[:runner_up.at]` and goes on with its own
    `tokens` (the runner-up where the first is uncertain), verified in the same main-model pass as a second
    sequence; a proposal with a runner-up is made of point masses."""

    tokens: list[int] = field(default_factory=list)
    q: list[Dist] | None = None
    source: Source | None = None
    scores: list[float] = field(default_factory=list)
    match_len: int = 0
    runner_up: Proposal | None = None
    at: int = 0  # a runner-up's: where it leaves the proposal it stands beside

    @property
    def expected(self) -> float:
        """The expected number of accepted tokens: the sum of `scores`."""
        return sum(self.scores)

    @property
    def n_drafted(self) -> int:
        """Drafted tokens the main model verifies (both candidates' rows)."""
        return len(self.tokens) + (len(self.runner_up.tokens) if self.runner_up else 0)

    def prefix(self, k: int, branch: int = 0) -> Proposal:
        """The first `k` tokens, with the runner-up's first `branch` tokens (none when 0)."""
        r = self.runner_up
        return replace(self, tokens=self.tokens[:k], q=None if self.q is None else self.q[:k], scores=self.scores[:k],
                       runner_up=replace(r, tokens=r.tokens[:branch], scores=r.scores[:branch]) if r and branch else None)


class Drafter:
    """Proposes up to k tokens that continue `history` (prompt + generated, last = pending token)."""

    def cap(self, params: DraftParams) -> int:
        """The most tokens one step may draft under `params` (a drafter that does not say: the larger cap)."""
        return max(params.max, params.lookup_max)

    def prepare(self, prompt: list[int]) -> None:
        """Called once per generation, inside the prompt-processing phase."""

    def draft(self, history: list[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Proposal:
        return Proposal()

    def observe(self, drafted: int, accepted: int, on_branch: bool = False) -> None:
        """Told after each step how many of its drafted tokens the main model accepted (`on_branch`: along the
        draft's second candidate)."""

    def rollback(self, history: list[int]) -> None:
        """After a step: a draft model's cache keeps no more than what agrees with `history` (the pending token
        aside), as the main model's does."""

    def reset(self) -> None:
        """Forget cached state (KV caches, indexes)."""

    def finish(self, n_generated: int, stop_reason: str) -> dict | None:
        """Called once when the generation ends (with how many tokens it kept and why it stopped): what the
        drafter chose and why, if it has something to say (auto mode), else None."""
        return None

    def prompt_work(self) -> tuple[int, float]:
        """Prompt tokens a draft model processed for this generation, and the seconds it took: (0, 0.0) for a
        drafter without one."""
        return 0, 0.0


class PlainDrafter(Drafter):
    """Plain decoding: drafts nothing, and the loop does not ask it to."""

    def cap(self, params: DraftParams) -> int:
        return 0
