"""The tally of a generation's steps."""

from __future__ import annotations

import time

import psutil

from speclocal.drafts import Source
from speclocal.engine.types import GenerationResult, MemoryParts, StepEvent


RSS_INTERVAL = 0.25  # seconds: the RSS is read a few times a second (and at the end), not every step


class Tally:
    """A generation's counters, timings and peak RSS, and the result they add up to."""

    def __init__(self) -> None:
        self.t_start = time.perf_counter()
        self.t_decode0 = self.t_start
        self.t_draft_prompt0 = 0.0  # the draft model's prompt processing before decoding began
        self.late = 0.0  # ... and after (auto brought it in mid-answer): prompt time, not decode time
        self.ttft: float | None = None
        self.tokens: list[int] = []
        self.from_draft: list[bool] = []
        self.steps: list[tuple[int, int, int, float]] = []
        self.sources: list[str | None] = []
        self.n_drafted = self.n_accepted = 0
        self.t_draft = self.t_verify = self.t_sample = 0.0
        self._proc = psutil.Process()
        self.peak_rss = self._proc.memory_info().rss
        self._t_rss = self.t_start  # when the RSS was last read
        self.t_end: float | None = None  # when decoding ended (`stop`)

    @property
    def n_generated(self) -> int:
        return len(self.tokens)

    def stop(self) -> None:
        """Decoding is over: the clock stops now, before what follows (learning, memory, text) is done."""
        self.t_end = time.perf_counter()

    def decoding(self, t_draft_prompt: float = 0.0) -> None:
        """The prompt phase is over (`t_draft_prompt`: the seconds of it the draft model spent): decode time starts
        now."""
        self.t_decode0 = time.perf_counter()
        self.t_draft_prompt0 = t_draft_prompt

    def step(self, new: list[int], pieces: list[str], origins: list[bool], drafted: int, accepted: int,
             t0: float, t1: float, t2: float, t3: float, source: Source | None = None,
             t_draft_prompt: float = 0.0) -> StepEvent:
        """One main-model pass: drafting t0..t1 (with any prompt the draft model caught up on: `t_draft_prompt`, its
        prompt seconds so far, which are not decode time), verifying t1..t2, accepting and rolling back t2..t3;
        the event that reports it."""
        t_draft = t1 - t0 - self._catch_up(t_draft_prompt)
        self.tokens.extend(new)
        self.from_draft.extend(origins)
        self.n_drafted += drafted
        self.n_accepted += accepted
        self.t_draft += t_draft
        self.t_verify += t2 - t1
        self.t_sample += t3 - t2
        elapsed = t3 - self.t_decode0 - self.late
        self.steps.append((len(new), drafted, accepted, elapsed))
        self.sources.append(source)
        if self.ttft is None:
            self.ttft = t3 - self.t_start
        if t3 - self._t_rss >= RSS_INTERVAL:
            self._read_rss(t3)
        return StepEvent(tokens=new, pieces=pieces, from_draft=origins, drafted=drafted, accepted=accepted,
                         t_draft=t_draft, t_verify=t2 - t1, t_sample=t3 - t2, n_generated=self.n_generated,
                         elapsed=elapsed, source=source)

    def _catch_up(self, t_draft_prompt: float) -> float:
        """The draft model's prompt seconds so far are `t_draft_prompt`: what of them came after decoding began
        (auto brought it in mid-answer) is prompt time, not decode or drafting time. Returns the seconds new since
        the last call."""
        late = max(0.0, t_draft_prompt - self.t_draft_prompt0)
        new, self.late = late - self.late, late
        return new

    def _read_rss(self, now: float) -> None:
        """Fold the current RSS into the peak."""
        self.peak_rss = max(self.peak_rss, self._proc.memory_info().rss)
        self._t_rss = now

    def drop(self, n: int) -> None:
        """Take the last `n` tokens back (they began a stop string), with their counts, latest steps first."""
        i = len(self.steps) - 1
        while n > 0 and i >= 0:
            tokens, drafted, accepted, t = self.steps[i]
            take = min(n, tokens)
            if take:
                acc = sum(self.from_draft[-take:])
                del self.tokens[-take:], self.from_draft[-take:]
                self.n_accepted -= acc
                self.n_drafted -= acc
                self.steps[i] = (tokens - take, drafted - acc, accepted - acc, t)
                n -= take
            i -= 1

    def result(self, *, mode: str, text: str, stop_reason: str, n_prompt: int, n_cached: int, memory: MemoryParts,
               auto: dict | None, dropped_turns: int, seed: int, draft_prompt: tuple[int, float]) -> GenerationResult:
        t_end = self.t_end if self.t_end is not None else time.perf_counter()
        self._read_rss(t_end)  # the last step's memory, however soon after the previous read
        self.t_draft -= self._catch_up(draft_prompt[1])  # any catch-up no step has counted yet
        t_decode = t_end - self.t_decode0 - self.late
        n, passes = self.n_generated, len(self.steps)
        return GenerationResult(
            mode=mode, text=text, tokens=self.tokens, from_draft=self.from_draft, stop_reason=stop_reason,
            n_prompt=n_prompt, n_prompt_cached=n_cached, t_prompt=self.t_decode0 - self.t_start + self.late,
            ttft=self.ttft if self.ttft is not None else t_end - self.t_start,
            n_generated=n, t_decode=t_decode, decode_tps=n / t_decode if t_decode > 0 and n else 0.0,
            n_drafted=self.n_drafted, n_accepted=self.n_accepted,
            acceptance=self.n_accepted / self.n_drafted if self.n_drafted else None,
            n_passes=passes, tokens_per_pass=n / passes if passes else 0.0,
            t_draft=self.t_draft, t_verify=self.t_verify, t_sample=self.t_sample,
            draft_share=self.t_draft / t_decode if t_decode > 0 else 0.0,
            peak_rss=self.peak_rss, memory=memory, auto=auto, steps=self.steps, dropped_turns=dropped_turns,
            seed=seed, step_sources=self.sources, draft_prompt_tokens=draft_prompt[0], t_draft_prompt=draft_prompt[1],
        )

