"""Auto mode: per step, draft with the source and length the cost model predicts to be fastest.

Sources: the draft model, the suffix drafter (the conversation, the output so far and the store of earlier
generations) and prompt lookup, or none (plain). The draft model's acceptance is estimated as the
maximum-likelihood rate of the i.i.d. model, a = accepted / (accepted + rejections), with exponential
forgetting and a prior from the task type. The suffix drafter says, per proposal, how likely each prefix is
to be accepted (its cumulative empirical probabilities, `Proposal.scores`); those are overconfident where the
match is short (one earlier occurrence of one token reads as certain), so auto corrects them with an online
calibration per match-length class: the decayed ratio of accepted to predicted tokens over recent
proposals, from a prior per task type (measured on the built-in suite, then learnt across runs like the
acceptance priors). The suffix drafter's copy pointer counts its probabilities from the generation's own
record, so its proposals are taken as they are; auto starts the pointer's counts from priors per task type
and learns them across runs too. It then drafts the prefix length that maximises
the predicted speedup (`costmodel.best_prefix`). Prompt lookup is a source beside it, for where the suffix
drafter's match is short (right after an edited token), as the copy pointer is. Its acceptance is
estimated like the model's, separately after a fully accepted proposal and after a failed one, since it
comes in bursts. The model-free drafters are free to propose, so while one is not used its proposals are
scored in the shadow against what the main model actually produced: auto learns where copying pays at no
cost. The draft model is only ever run where it can pay at all on this machine's curve, so on a
compute-bound CPU auto costs (almost) nothing; a drafting choice must predict a 5 % gain over plain, and
a new choice must beat the current one by 5 % (hysteresis).

What the user waits for is the whole request, so the draft model's prompt processing is a cost auto chooses
to pay: every request starts with what processes no prompt (plain and the model-free drafters), and the draft
model is brought in, catching up on the prompt and the answer so far in one batch, only once the saving it is
expected to make over the rest of the answer (the task's learnt answer length, capped by the request's) beats
that catch-up, on this machine's measured prompt-processing cost; a chat whose earlier turns it holds pays for
the new tokens only. The saving is weighed against what the model-free steps have cost this request so far, per
token, as they turned out (auto's own time per step included), from what they cost the task type before (a
learnt prior). Its cost per drafted token is taken at the context depth it runs at. Once brought in, it is
drafted by an optimistic estimate of its acceptance (one posterior standard deviation up, shrinking as the
request shows more), so that one early rejection does not end a model whose catch-up is already paid.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from speclocal import locations
from speclocal.drafts import Source
from speclocal.engine.drafting.base import Drafter, Proposal
from speclocal.engine.drafting.lookup import PromptLookupDrafter
from speclocal.engine.drafting.model import ModelDrafter
from speclocal.engine.drafting.copy import RATES, calibration_priors
from speclocal.engine.drafting.suffix import SuffixDrafter
from speclocal.files import atomic_write, read_json, set_aside
from speclocal.policy.costmodel import CostCurve, best_k, best_tree, break_even_acceptance, can_pay, expected_tokens

log = logging.getLogger("speclocal.policy")

SUFFIX_CLASSES = (1, 2, 4, 8, 16)


def suffix_key(match_cls: int) -> str:
    """The priors' key of the suffix drafter's calibration for a match-length class."""
    return f"suffix_{match_cls}"


def copy_key(rate: str) -> str:
    """The priors' key of one of the copy pointer's rates."""
    return f"copy_{rate}"


# priors per task type (speclocal.tasks.TASKS), before any run taught us better: acceptance of prompt lookup (set
# by hand), and from `calibration_priors()` the draft model's acceptance, the suffix drafter's calibration per
# match-length class (the longest class whose bound the match reaches) and the copy pointer's rates, measured at
# every position of the tiny pair's greedy answers to the built-in suite.
LENGTH = "length"  # the priors' key of the expected answer length, in tokens (the rest but FREE: rates in [0, 1])
DEFAULT_LENGTH = 200.0  # before any answer of a task type was seen: a few paragraphs
# the priors' key of what a token costs with the model-free drafters alone, as a share of plain's: what the
# draft model has to beat. Defaults: 1/decode speedup averaged per task type over auto's runs without the draft
# model in two Intel Xeon (AMX) benches (`git show 87c04dd:docs/bench-e2e-xeon/results.json` and
# `...:docs/bench-all-xeon/results.json`); learnt per machine across runs from what their steps cost
# (`AutoDrafter.free`), above 1 where copying lost. (Until 2026-12 it was learnt from each step's prediction,
# under the key "free", which is no longer read: the best of several predictions is optimistic.)
FREE = "free_cost"
DEFAULT_FREE = {"code": 0.93, "edit": 0.5, "json": 0.83, "chat": 0.62, "creative": 1.0}
FREE_MAX = 2.0  # a learnt FREE is clamped to this: one run whose copying lost badly moves the prior only so far
FREE_WEIGHT = 4.0  # that prior counts as this many tokens, so a request's own first steps soon outweigh it
FREE_LEARN_STEPS = 8  # steps without the draft model a run needs for its mean to be learnt
DEFAULT_PRIORS = {
    task: {"model": calibration_priors()["model"][task], "lookup": lookup,
           **{suffix_key(c): calibration_priors()["suffix"][task][str(c)] for c in SUFFIX_CLASSES},
           **{copy_key(name): calibration_priors()["copy"][task][name] for name in RATES}, LENGTH: DEFAULT_LENGTH,
           FREE: DEFAULT_FREE[task]}
    for task, lookup in (("code", 0.35), ("edit", 0.80), ("json", 0.40), ("chat", 0.15), ("creative", 0.10))
}
PRIOR_WEIGHT = 4.0  # the prior counts as this many observed tokens
FORGET = 0.9  # per-step decay of old observations
HYSTERESIS = 0.05  # a new choice must beat the current one's prediction by 5 %
DEPTH_STEP = 64  # tokens of context after which auto works out the cost curve at the new depth again
PROBE = 8  # shadow-scored lookup proposals are this long at most
SUFFIX_PROBE = 16  # shadow-scored suffix proposals are this long at most


def match_class(m: int) -> int:
    """The calibration class of a match length: 1, 2-3, 4-7, 8-15, 16+."""
    return max(c for c in SUFFIX_CLASSES if c <= max(m, 1))


def suffix_class(p: Proposal) -> int | None:
    """The calibration class of a suffix proposal; None for the copy pointer's, whose probabilities are counted
    from the generation's own record and need none."""
    return None if p.source == Source.COPY else match_class(p.match_len)


@dataclass
class Calibration:
    """How far the suffix drafter's probabilities hold in one match-length class: accepted / predicted
    tokens, decayed per observed proposal, starting from a prior worth PRIOR_WEIGHT predicted tokens."""

    prior: float
    accepted: float = 0.0
    expected: float = 0.0

    @property
    def ratio(self) -> float:
        return (self.accepted + PRIOR_WEIGHT * self.prior) / (self.expected + PRIOR_WEIGHT)

    def observe(self, expected: float, accepted: int) -> None:
        if expected <= 0:
            return
        self.accepted = FORGET * self.accepted + accepted
        self.expected = FORGET * self.expected + expected


def calibrated(scores: list[float], ratio: float) -> list[float]:
    """The drafter's cumulative probabilities scaled by the calibration ratio, at most 1 and non-increasing."""
    out, last = [], 1.0
    for p in scores:
        last = min(last, ratio * p, 1.0)
        out.append(last)
    return out


@dataclass
class Estimate:
    """Decayed acceptance counts for one draft source, started from a prior; `seen`: the same counts undecayed
    (how much this request has shown)."""

    prior: float
    accepted: float = 0.0
    rejected: float = 0.0
    seen: float = 0.0

    @property
    def a(self) -> float:
        return (self.accepted + PRIOR_WEIGHT * self.prior) / (self.accepted + self.rejected + PRIOR_WEIGHT)

    @property
    def optimistic(self) -> float:
        """The rate one standard deviation above the estimate, the deviation of a Beta posterior worth the prior
        plus every outcome seen (at most 1): what auto drafts the draft model by once it has paid to bring it in.
        One early rejection then does not end a model that pays (it moves a prior of 0.92 worth 4 tokens to
        0.74, under the break-even of a CPU where c is 0.5), a run of them does, and the margin shrinks as the
        request shows more."""
        a = self.a
        return min(1.0, a + (a * (1 - a) / (self.seen + PRIOR_WEIGHT + 1)) ** 0.5)

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        missed = 1.0 if accepted < drafted else 0.0
        self.accepted = FORGET * self.accepted + accepted
        self.rejected = FORGET * self.rejected + missed
        self.seen += accepted + missed


@dataclass(frozen=True)
class Choice:
    source: Source  # PLAIN, MODEL, LOOKUP or SUFFIX
    k: int
    predicted: float
    branch: int = 0  # suffix: tokens of the runner-up candidate verified beside the k drafted


def choose(a_model: float | None, a_lookup: float, lookup_len: int, curve: CostCurve, k_cap: int,
           current: str = Source.PLAIN, suffix: list[float] | None = None,
           runner_up: tuple[int, list[float]] | None = None, free_cap: int | None = None) -> Choice:
    """The fastest predicted option this step: the draft model up to `k_cap` tokens (a_model None = no
    usable draft model), prompt lookup up to the `lookup_len` tokens it proposes, a prefix of the suffix
    drafter's proposal (`suffix`: the calibrated probability that its first 1, 2, ... tokens are accepted;
    `runner_up`: where its second candidate leaves it and that one's calibrated probabilities, verified
    beside it where that pays; `free_cap`: the most tokens both together may draft), or plain. `curve`: the
    machine's, at the context depth the models are at (`CostCurve.at`)."""
    options = {Source.PLAIN: Choice(Source.PLAIN, 0, 1.0)}
    if a_model is not None and k_cap > 0:
        k, s = best_k(a_model, curve.cost_of(Source.MODEL), curve, k_cap)
        if k:
            options[Source.MODEL] = Choice(Source.MODEL, k, s)
    if lookup_len > 0:
        k, s = best_k(a_lookup, curve.cost_of(Source.LOOKUP), curve, lookup_len)
        if k:
            options[Source.LOOKUP] = Choice(Source.LOOKUP, k, s)
    if suffix:
        at, alt = runner_up or (0, [])
        k, m, s = best_tree(suffix, at, alt, curve.cost_of(Source.SUFFIX), curve, free_cap)
        if k:
            options[Source.SUFFIX] = Choice(Source.SUFFIX, k, s, m)
    best = max(options.values(), key=lambda o: o.predicted)
    held = options.get(current)
    if held is not None and best.predicted < held.predicted * (1 + HYSTERESIS):
        return held
    if best.source != Source.PLAIN and best.predicted < 1 + HYSTERESIS:
        return options[Source.PLAIN]
    return best


PRIORS_VERSION = 2  # the learnt priors file: {"version": 2, "learnt": {task: {key: value}}}, only what runs taught


def learnt_priors(path: Path | None = None) -> dict[str, dict[str, float]]:
    """What runs have taught, per task type, from `path` (default: the user's, `locations.priors_path`): only
    keys that were observed, so that a later release's defaults apply wherever nothing was learnt. A file of an
    older format (which stored every default beside what was learnt, so those defaults never changed again) or
    with bad values is set aside."""
    path = path or locations.priors_path()
    stored = read_json(path)
    if stored is None:
        return {}
    if not isinstance(stored, dict):
        set_aside(path, "not a mapping")
        return {}
    if stored.get("version") != PRIORS_VERSION:
        set_aside(path, "an older format, which froze the defaults of its day", label="outdated")
        return {}
    learnt: dict[str, dict[str, float]] = {}
    try:
        for task, by_key in stored["learnt"].items():
            for key, a in by_key.items():
                top = {LENGTH: 1e6, FREE: FREE_MAX}.get(key, 1.0)
                if task in DEFAULT_PRIORS and key in DEFAULT_PRIORS[task] and 0.0 <= float(a) <= top and (
                        key != LENGTH or float(a) > 0):
                    learnt.setdefault(task, {})[key] = float(a)
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        set_aside(path, f"unexpected content: {e}")
        return {}
    return learnt


def load_priors(path: Path | None = None) -> dict[str, dict[str, float]]:
    """Priors per task type: what runs taught (`learnt_priors`, from `path`) over the defaults."""
    learnt = learnt_priors(path)
    return {t: v | learnt.get(t, {}) for t, v in DEFAULT_PRIORS.items()}


def learn_priors(task: str, observed: dict[str, float], weight: float = 0.3, path: Path | None = None) -> None:
    """Move the priors for `task` towards acceptances (and an answer length) observed in a run, and store what
    was learnt in `path` (default: the user's; an atomic write)."""
    path = path or locations.priors_path()
    learnt = learnt_priors(path)
    mine = learnt.setdefault(task, {})
    for key, a in observed.items():
        mine[key] = (1 - weight) * mine.get(key, DEFAULT_PRIORS[task][key]) + weight * a
    try:
        atomic_write(path, json.dumps({"version": PRIORS_VERSION, "learnt": learnt}, indent=1))
    except OSError as e:
        log.warning("could not save learnt priors to %s: %s", path, e)  # best effort


@dataclass
class AutoDrafter(Drafter):
    """A Drafter that picks plain, the suffix drafter, prompt lookup or the draft model (and k) before every
    step. `lookup` None (or `use_lookup` False): no prompt lookup; `suffix` None: no suffix drafter. The task
    priors: `priors`, or if None those learnt in `priors_file` (None: the user's) over the defaults; what a run
    teaches goes to `priors_file` either way."""

    curve: CostCurve
    task: str
    model: ModelDrafter | None
    lookup: PromptLookupDrafter | None
    priors: dict | None = None
    suffix: SuffixDrafter | None = None
    use_lookup: bool = True
    second_candidates: bool = True  # whether the main model can verify a runner-up beside a draft (its n_seq)
    n_predict: int | None = None  # the request's cap on the answer's length
    priors_file: Path | None = None

    def __post_init__(self) -> None:
        if self.priors is None:
            self.priors = load_priors(self.priors_file)
        p = DEFAULT_PRIORS.get(self.task, DEFAULT_PRIORS["chat"]) | self.priors.get(self.task, {})
        self.model_ok = self.model is not None and can_pay(self.curve.cost_of(Source.MODEL), self.curve)
        self.expected_length = p[LENGTH]
        self.prompt_len = 0
        self.model_in = False  # whether the draft model was brought in (it then follows the context)
        self.brought_in: dict | None = None  # when and at what price
        self.free_prior = p[FREE]
        # what the steps without the draft model cost (single-decode units, on the curve at their depth) and the
        # tokens they gave: decayed per step (`free`), and in all with their number (`learn`)
        self.free_cost = self.free_tokens = 0.0
        self.free_cost_seen = self.free_tokens_seen = 0.0
        self.free_n = 0
        self._step_curve = self.curve  # the curve at the depth of the last step drafted (`_observe_free`)
        self._step_overhead = 0.0  # auto's own time in the last step (`_note_overhead`)
        self._step_open = False  # whether `draft` ran since the last `observe`
        self.overhead_sum = self.overhead_steps = 0.0  # decayed: auto's own time per step, in single decodes
        self.bring_in: dict = {}  # the last weighing of bringing it in
        self.use_lookup = bool(self.use_lookup and self.lookup is not None)
        self.est = {Source.MODEL: Estimate(p["model"])}
        self.lookup_est = {True: Estimate(p["lookup"]), False: Estimate(p["lookup"])}  # by last proposal's fate
        self.lookup_last_ok = False
        self._deep: tuple[int, CostCurve] | None = None  # (depth, the curve there): `curve_at`
        self.calibration = {c: Calibration(p[suffix_key(c)]) for c in SUFFIX_CLASSES}
        self.copy_priors = {name: p[copy_key(name)] for name in RATES}
        self.branches = Counter()  # steps that verified a second candidate, and those whose tokens followed it
        self._drafted = Proposal()  # the last suffix proposal drafted (with the runner-up verified beside it)
        self.current = Source.PLAIN
        self.last: Choice = Choice(Source.PLAIN, 0, 1.0)
        self.decisions: Counter = Counter()
        self.predicted_sum = 0.0
        self.shadow: tuple[int, list[int]] | None = None  # (history length, lookup proposal)
        self.shadow_seen = 0
        self.suffix_shadow: tuple[int, Proposal] | None = None  # (history length, suffix proposal)
        self.suffix_shadow_seen = 0

    def prepare(self, prompt: list[int]) -> None:
        """The model-free drafters index the prompt; the draft model processes nothing yet (`_weigh_model`)."""
        self.prompt_len = len(prompt)
        if self.use_lookup:
            self.lookup.prepare(prompt)
        if self.suffix is not None:
            self.suffix.prepare(prompt, copy_priors=self.copy_priors)
        if self.model is not None:
            self.model.begin(prompt)

    def remaining(self, history: list[int]) -> float:
        """Tokens the answer is expected to go on for: to the task's expected length (past it, a quarter of
        that), at most to the request's cap."""
        done = len(history) - self.prompt_len
        left = max(self.expected_length - done, self.expected_length / 4)
        return min(left, self.n_predict - done) if self.n_predict is not None else left

    @property
    def free(self) -> float:
        """F, what a token costs without the draft model, as a share of plain's: what this request's steps without
        it cost over the tokens they gave (decayed: the model-free drafters' gain comes and goes with the text),
        from the task type's learnt prior, worth FREE_WEIGHT tokens. Measured from the steps' outcomes, not
        from what each step predicted: the best of several predictions is optimistic on average."""
        return (self.free_cost + FREE_WEIGHT * self.free_prior) / (self.free_tokens + FREE_WEIGHT)

    def _weigh_model(self, history: list[int], k_cap: int) -> None:
        """Bring the draft model in once what it is expected to save over the rest of the answer exceeds what
        its catch-up costs: (tokens it does not hold) x its prompt processing per token, against remaining
        tokens x (F - W), all in single-decode units (F: `free`; W: a token's cost with the model, 1/S plus its
        share of auto's own time per step). A request's first steps alone (where nothing has been copied yet) do
        not bring the model in on a task that mostly copies."""
        curve, context, a = self.curve_at(len(history)), len(history), self.est[Source.MODEL].a
        k, s_model = best_k(a, curve.cost_of(Source.MODEL), curve, k_cap)
        overhead = self.overhead_sum / self.overhead_steps if self.overhead_steps else 0.0
        with_model = 1 / s_model + overhead / expected_tokens(a, k)  # a token's cost: its share of a step's
        free = self.free
        behind = self.model.behind(history)
        cost = behind * curve.draft_prefill_cost
        saving = self.remaining(history) * max(0.0, free - with_model)
        self.bring_in = {"behind": behind, "cost": cost, "saving": saving, "free": free, "with_model": with_model}
        if saving > cost * (1 + HYSTERESIS):
            self.model_in = True
            self.brought_in = {"at": context - self.prompt_len, **self.bring_in}

    def prompt_work(self) -> tuple[int, float]:
        return self.model.prompt_work() if self.model is not None else (0, 0.0)

    def rollback(self, history: list[int]) -> None:
        if self.model_in:
            self.model.rollback(history)

    def curve_at(self, context: int) -> CostCurve:
        """The machine's curve at this context depth, worked out again each DEPTH_STEP tokens."""
        depth = context // DEPTH_STEP * DEPTH_STEP
        if self._deep is None or self._deep[0] != depth:
            self._deep = (depth, self.curve.at(depth))
        return self._deep[1]

    def reset(self) -> None:
        for d in (self.lookup, self.suffix, self.model):
            if d is not None:
                d.reset()

    def suffix_estimate(self, p: Proposal) -> list[float]:
        """The suffix drafter's probabilities for a proposal, calibrated for its match-length class; a copy-pointer
        proposal's as they are: the pointer counts them from this generation's own record."""
        cls = suffix_class(p)
        return list(p.scores) if cls is None else calibrated(p.scores, self.calibration[cls].ratio)

    def draft(self, history, k, sampling, rng) -> Proposal:
        t_enter = time.perf_counter()
        self._step_open = True  # `observe` follows; a step without a draft (k = 0, the last) is not observed
        self._score_shadow(history)
        self._score_suffix_shadow(history)
        params = (self.suffix or self.lookup).params  # the request's caps: --draft-max (model), --lookup-max
        free_k = min(k, params.lookup_max, self.curve.k_max)
        proposal = self.lookup.draft(history, free_k, sampling, rng) if self.use_lookup else Proposal()
        s_prop, s_est, alt = Proposal(), None, None
        if self.suffix is not None:
            s_prop = self.suffix.draft(history, free_k, sampling, rng, runner_up=self.second_candidates)
            if s_prop.tokens:
                s_est = self.suffix_estimate(s_prop)
                if s_prop.runner_up:
                    alt = (s_prop.runner_up.at, self.suffix_estimate(s_prop.runner_up))
        a_lookup = self.lookup_est[self.lookup_last_ok].a
        model_cap = min(k, params.max)
        curve = self.curve_at(len(history))

        def best(a_model: float | None) -> Choice:
            return choose(a_model, a_lookup, len(proposal.tokens), curve, model_cap, self.current,
                          suffix=s_est, runner_up=alt, free_cap=free_k)

        choice = best(self.est[Source.MODEL].optimistic if self.model_in else None)
        if self.model_ok and not self.model_in and model_cap > 0:
            self._weigh_model(history, model_cap)
            if self.model_in:
                choice = best(self.est[Source.MODEL].optimistic)
        self.current, self.last, self._step_curve = choice.source, choice, curve
        self.decisions[choice.source] += 1
        self.predicted_sum += choice.predicted
        if choice.source != Source.LOOKUP and proposal.tokens and self.shadow is None:
            self.shadow = (len(history), proposal.tokens[:PROBE])
        if choice.source != Source.SUFFIX and s_prop.tokens and self.suffix_shadow is None:
            self.suffix_shadow = (len(history), s_prop.prefix(SUFFIX_PROBE))
        out = Proposal()
        if choice.source == Source.LOOKUP:
            out = proposal.prefix(choice.k)
        elif choice.source == Source.SUFFIX:
            self._drafted = out = s_prop.prefix(choice.k, choice.branch)
            self.branches["verified"] += bool(choice.branch)
        self._note_overhead(time.perf_counter() - t_enter, curve)
        if choice.source == Source.MODEL:
            return self.model.draft(history, choice.k, sampling, rng)
        return out

    def _note_overhead(self, seconds: float, curve: CostCurve) -> None:
        """Auto's own time this step (both model-free drafters, the shadows, the choice; not the draft model's
        decodes), in single decodes at this depth: every step pays it, whatever it drafts. ~0.2 ms a step on the
        2-core Intel Xeon (AVX-512, `scripts/step_costs.py auto`), 0.3 % of a CPU decode; a GPU decodes a small model in a few ms."""
        self._step_overhead = seconds / curve.t_single if curve.t_single else 0.0
        self.overhead_sum = FORGET * self.overhead_sum + self._step_overhead
        self.overhead_steps = FORGET * self.overhead_steps + 1

    def observe(self, drafted: int, accepted: int, on_branch: bool = False) -> None:
        if not self._step_open:
            return
        self._step_open = False
        if self.last.source != Source.MODEL and not self.model_in:
            self._observe_free(drafted, accepted)
        if self.last.source == Source.MODEL:
            self.est[Source.MODEL].observe(drafted, accepted)
        elif self.last.source == Source.LOOKUP:
            self._observe_lookup(drafted, accepted)
        elif self.last.source == Source.SUFFIX and drafted:
            p, cls = self._drafted, suffix_class(self._drafted)
            if cls is not None:
                self.calibration[cls].observe(p.expected + (p.runner_up.expected if p.runner_up else 0.0), accepted)
            self.branches["taken"] += on_branch

    def _observe_free(self, drafted: int, accepted: int) -> None:
        """Count a step before the draft model was brought in into `free`: its pass on the curve at its depth and
        auto's own time (which includes the model-free drafting), and its tokens. Steps after it came in are
        those where copying beat the model: they would read copying as cheaper than it is without the model."""
        cost = self._step_curve.V(drafted + 1) + self._step_overhead
        self.free_cost = FORGET * self.free_cost + cost
        self.free_tokens = FORGET * self.free_tokens + accepted + 1
        self.free_cost_seen += cost
        self.free_tokens_seen += accepted + 1
        self.free_n += 1

    def _observe_lookup(self, drafted: int, accepted: int) -> None:
        self.lookup_est[self.lookup_last_ok].observe(drafted, accepted)
        self.lookup_last_ok = accepted == drafted

    @staticmethod
    def _agreed(tokens: list[int], produced: list[int]) -> int | None:
        """How many of a shadow proposal's tokens the main model produced, or None while undecided."""
        m = 0
        while m < len(tokens) and m < len(produced) and tokens[m] == produced[m]:
            m += 1
        if m < len(tokens) and m == len(produced):
            return None  # not decided yet: wait for more tokens
        return m

    def _score_shadow(self, history: list[int]) -> None:
        """Score a lookup proposal made earlier against the tokens generated since."""
        if self.shadow is None:
            return
        start, tokens = self.shadow
        m = self._agreed(tokens, history[start:])
        if m is None:
            return
        self._observe_lookup(len(tokens), m)
        self.shadow_seen += 1
        self.shadow = None

    def _score_suffix_shadow(self, history: list[int]) -> None:
        """Score a suffix proposal auto did not draft against the tokens generated since: its calibration."""
        if self.suffix_shadow is None:
            return
        start, p = self.suffix_shadow
        m = self._agreed(p.tokens, history[start:])
        if m is None:
            return
        if (cls := suffix_class(p)) is not None:
            self.calibration[cls].observe(p.expected, m)
        self.suffix_shadow_seen += 1
        self.suffix_shadow = None

    def explain(self) -> dict:
        """What auto chose and why, in numbers and one sentence."""
        c = self.curve
        steps = sum(self.decisions.values())
        k4 = min(4, c.k_max)
        be_model = break_even_acceptance(k4, c.cost_of(Source.MODEL), c) if self.model is not None else None
        be_lookup = break_even_acceptance(k4, c.cost_of(Source.LOOKUP), c)
        be_suffix = break_even_acceptance(k4, c.cost_of(Source.SUFFIX), c)
        parts = [f"one main-model pass over {k4 + 1} tokens ({k4} drafted + 1) costs {c.V(k4 + 1):.1f} single-token decodes here"]
        if self.model is not None:
            parts += self._model_sentence(be_model, k4)
        if self.suffix is not None:
            parts.append(f"a suffix draft of {k4} pays where its first {k4} tokens are expected to be accepted "
                         f"{be_suffix:.0%} of the time per token" if be_suffix else "a suffix draft cannot pay at k=4")
        if self.use_lookup:
            parts.append(f"prompt lookup pays above {be_lookup:.0%} acceptance at k={k4}" if be_lookup
                         else "prompt lookup cannot pay at k=4")
        used = ", ".join(f"{src} {n}/{steps}" for src, n in self.decisions.most_common()) or "no steps"
        out = {
            "task": self.task,
            "decisions": dict(self.decisions),
            "acceptance_estimate": {"model": round(self.est[Source.MODEL].a, 3),
                                    "lookup_after_hit": round(self.lookup_est[True].a, 3),
                                    "lookup_after_miss": round(self.lookup_est[False].a, 3)},
            "predicted_speedup": self.predicted_sum / steps if steps else 1.0,
            "draft_model_can_pay": self.model_ok,
            "expected_length": round(self.expected_length, 1),
            "break_even_k4": {"model": be_model, "lookup": be_lookup, "suffix": be_suffix},
            "verify_curve": list(c.verify),
            "draft_cost": c.draft_cost if math.isfinite(c.draft_cost) else None,  # None: no draft model (JSON)
            "sources": [s for s, on in ((Source.MODEL, self.model_ok), (Source.SUFFIX, self.suffix is not None),
                                        (Source.LOOKUP, self.use_lookup)) if on],
            "sentence": "; ".join(parts) + f". Steps used: {used}.",
        }
        if self.model is not None:  # {"at": answer tokens, "behind", "cost", "saving", "free", "with_model"}
            out["draft_model_brought_in"] = self.brought_in
            out["draft_model_weighed"] = self.bring_in or None  # the last weighing
        if self.suffix is not None:
            out["suffix_calibration"] = {f"{cl}+" if cl == SUFFIX_CLASSES[-1] else str(cl): round(x.ratio, 3)
                                         for cl, x in self.calibration.items()}
            out["suffix_shadow_scored"] = self.suffix_shadow_seen
            out["second_candidates"] = {"verified": self.branches["verified"], "followed": self.branches["taken"]}
            if self.suffix.pointer is not None:  # what the copy pointer counted (its rates, where it saw outcomes)
                out["copy_rates"] = {name: round(r.value, 3) for name, r in self.suffix.pointer.rates.items() if r.trials}
        return out

    def _model_sentence(self, be_model: float | None, k4: int) -> list[str]:
        """What `explain` says of the draft model: whether it can pay, and why it was or was not brought in."""
        c = self.curve
        if not self.model_ok:
            return [f"a {c.draft_cost:.2f}-cost draft model cannot pay on this machine at any plausible acceptance, "
                    "so it was never run"]
        parts = [f"the draft model pays above {be_model:.0%} acceptance at k={k4}" if be_model
                 else "the draft model does not pay at k=4"]
        w = self.brought_in or self.bring_in
        if self.brought_in:
            parts.append(f"it was brought in after {w['at']} tokens: catching up on {w['behind']} tokens cost "
                         f"{w['cost']:.0f} decodes, against {w['saving']:.0f} it was expected to save")
        elif w:
            parts.append(f"it was never brought in: catching up on {w['behind']} tokens would have cost "
                         f"{w['cost']:.0f} decodes, more than the {w['saving']:.0f} it was expected to save "
                         f"over the rest of a ~{self.expected_length:.0f}-token answer, where a token cost "
                         f"{w['free']:.2f} of plain's without it and {w['with_model']:.2f} with it")
        return parts

    def finish(self, n_generated: int, stop_reason: str) -> dict:
        """Learn from this run, and say what auto chose and why."""
        explanation = self.explain()
        self.learn(n_generated, stop_reason)
        return explanation

    def learn(self, n_generated: int, stop_reason: str) -> None:
        """Feed this run's estimates back into the stored priors for its task type: acceptances, what a token cost
        without the draft model, and the answer's length where it ended by itself (one cut at a cap only says the
        answer is at least that long)."""
        observed = {}
        if stop_reason in ("eos", "stop") or (stop_reason in ("length", "context") and n_generated > self.expected_length):
            observed[LENGTH] = float(n_generated)
        if self.decisions.get(Source.MODEL):
            observed["model"] = self.est[Source.MODEL].a
        if self.free_n >= FREE_LEARN_STEPS:
            observed[FREE] = min(FREE_MAX, self.free_cost_seen / self.free_tokens_seen)
        if self.decisions.get(Source.LOOKUP) or self.shadow_seen:
            observed["lookup"] = self.lookup_est[False].a
        for cl, cal in self.calibration.items():  # drafted or shadow-scored proposals of this class
            if cal.expected > 0:
                observed[suffix_key(cl)] = min(1.0, cal.ratio)
        pointer = self.suffix.pointer if self.suffix is not None else None
        for name, rate in (pointer.rates.items() if pointer is not None else ()):
            if rate.trials > 0:
                observed[copy_key(name)] = rate.value
        if observed:
            learn_priors(self.task, observed, path=self.priors_file)
