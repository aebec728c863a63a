"""Drafters: where speculative tokens come from. `none` drafts nothing (plain decoding)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from speclocal import options
from speclocal.drafts import Source
from speclocal.engine.sampling import Dist, Sampling, distribution, sample
from speclocal.errors import SpeclocalError

if TYPE_CHECKING:
    from speclocal.engine.llama import LoadedModel


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

    def cap(self, mode: str) -> int:
        """The most tokens a step of `mode` may draft."""
        return {"plain": 0, "spec": self.max, "lookup": self.lookup_max, "suffix": self.lookup_max}.get(
            mode, max(self.max, self.lookup_max))

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

    def prepare(self, prompt: list[int]) -> None:
        """Called once per generation, inside the prompt-processing phase."""

    def draft(self, history: list[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Proposal:
        return Proposal()

    def observe(self, drafted: int, accepted: int, on_branch: bool = False) -> None:
        """Told after each step how many of its drafted tokens the main model accepted (`on_branch`: along the
        draft's second candidate)."""

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
        return len(history) - 1 - self.model.held(history[:-1])

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

    def prepare(self, prompt: list[int]) -> None:
        self.begin(prompt)
        self.catch_up(prompt[:-1])

    def prompt_work(self) -> tuple[int, float]:
        return self.n_prompt_tokens, self.t_prompt

    def draft(self, history: list[int], k: int, sampling: Sampling, rng: np.random.Generator) -> Proposal:
        m = self.model
        if self.behind(history) > self.CATCH_UP:
            self.catch_up(history[:-1])
        kept = m.reuse_prefix(history)
        rows = m.eval(history[kept:], outputs="last")
        tokens: list[int] = []
        qs: list[Dist] | None = None if sampling.greedy else []
        while True:
            logits = rows[-1]
            if self.params.p_min > 0 and _top_probability(logits) < self.params.p_min:
                break
            if qs is None:
                tok = int(np.argmax(logits))
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

    def reset(self) -> None:
        self.model.clear()


def _top_probability(logits: np.ndarray, top_k: int = 10) -> float:
    """Probability of the best token among the top 10 (llama.cpp's --draft-p-min test)."""
    top = logits[np.argpartition(-logits, top_k)[:top_k]].astype(np.float64)
    e = np.exp(top - top.max())
    return float(e.max() / e.sum())


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

    def prepare(self, prompt: list[int]) -> None:
        self.reset()

    def _extend_index(self, history: list[int]) -> None:
        """Index every n-gram whose continuation token exists: n-gram -> indices after it, in order."""
        if history[: len(self._history)] != self._history:
            self.reset()
        lo, hi = self.params.ngram_min, self.params.ngram_max
        for end in range(max(len(self._history), 1), len(history)):  # continuation index = end
            for n in range(lo, hi + 1):
                if end - n >= 0:
                    self._index.setdefault(tuple(history[end - n : end]), []).append(end)
        self._history = list(history)

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

    def reset(self) -> None:
        if self.charge is not None:
            self.charge.reset()
