"""Auto mode: per step, draft with the source and length the cost model predicts to be fastest.

Acceptance is estimated per source as the maximum-likelihood rate of the i.i.d. model,
a = accepted / (accepted + rejections), with exponential forgetting and a prior from the task type.
Prompt lookup's acceptance comes in bursts (long copied runs, then none), so it is estimated
separately after a fully accepted proposal and after a failed one. Lookup is free to propose, so
while it is not used its proposals are scored in the shadow against what the main model actually
produced: auto learns where copying pays at no cost. The draft
model is only ever run where it can pay at all on this machine's curve, so on a compute-bound CPU
auto costs (almost) nothing.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field

from speclocal import locations
from speclocal.engine.drafters import Draft, Drafter, ModelDrafter, PromptLookupDrafter
from speclocal.files import atomic_write, read_json, set_aside
from speclocal.policy.costmodel import CostCurve, best_k, break_even_acceptance, can_pay

log = logging.getLogger("speclocal.policy")

# acceptance priors (model draft, prompt lookup) per task type (speclocal.tasks.TASKS), before any run taught
# us better
DEFAULT_PRIORS = {
    "code": {"model": 0.85, "lookup": 0.35},
    "edit": {"model": 0.90, "lookup": 0.80},
    "json": {"model": 0.75, "lookup": 0.40},
    "chat": {"model": 0.55, "lookup": 0.15},
    "creative": {"model": 0.50, "lookup": 0.10},
}
PRIOR_WEIGHT = 4.0  # the prior counts as this many observed tokens
FORGET = 0.9  # per-step decay of old observations
HYSTERESIS = 0.05  # a new choice must beat the current one's prediction by 5 %
PROBE = 8  # shadow-scored lookup proposals are this long at most


@dataclass
class Estimate:
    """Decayed acceptance counts for one draft source, started from a prior."""

    prior: float
    accepted: float = 0.0
    rejected: float = 0.0

    @property
    def a(self) -> float:
        return (self.accepted + PRIOR_WEIGHT * self.prior) / (self.accepted + self.rejected + PRIOR_WEIGHT)

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.accepted = FORGET * self.accepted + accepted
        self.rejected = FORGET * self.rejected + (1.0 if accepted < drafted else 0.0)


@dataclass(frozen=True)
class Choice:
    source: str  # plain | model | lookup
    k: int
    predicted: float


def choose(a_model: float | None, a_lookup: float, lookup_len: int, curve: CostCurve, k_cap: int,
           current: str = "plain") -> Choice:
    """The fastest predicted option this step: the draft model up to `k_cap` tokens (a_model None = no
    usable draft model), prompt lookup up to the `lookup_len` tokens it proposes, or plain."""
    options = {"plain": Choice("plain", 0, 1.0)}
    if a_model is not None and k_cap > 0:
        k, s = best_k(a_model, curve.cost_of("model"), curve, k_cap)
        if k:
            options["model"] = Choice("model", k, s)
    if lookup_len > 0:
        k, s = best_k(a_lookup, curve.cost_of("lookup"), curve, lookup_len)
        if k:
            options["lookup"] = Choice("lookup", k, s)
    best = max(options.values(), key=lambda o: o.predicted)
    held = options.get(current)
    if held is not None and best.predicted < held.predicted * (1 + HYSTERESIS):
        return held
    if best.source != "plain" and best.predicted < 1 + HYSTERESIS:
        return options["plain"]
    return best


def load_priors() -> dict[str, dict[str, float]]:
    """Acceptance priors per task type: learnt values from the cache over the defaults."""
    priors = {t: dict(v) for t, v in DEFAULT_PRIORS.items()}
    learnt = read_json(locations.priors_path())
    if learnt is None:
        return priors
    try:
        for task, by_source in learnt.items():
            for source, a in by_source.items():
                if task in priors and source in priors[task] and 0.0 <= float(a) <= 1.0:
                    priors[task][source] = float(a)
    except (ValueError, TypeError, AttributeError) as e:
        set_aside(locations.priors_path(), f"unexpected content: {e}")
        return {t: dict(v) for t, v in DEFAULT_PRIORS.items()}
    return priors


def learn_priors(task: str, observed: dict[str, float], weight: float = 0.3) -> None:
    """Move the stored priors for `task` towards acceptances observed in a run (atomic write)."""
    priors = load_priors()
    for source, a in observed.items():
        priors[task][source] = (1 - weight) * priors[task][source] + weight * a
    try:
        atomic_write(locations.priors_path(), json.dumps(priors, indent=1))
    except OSError as e:
        log.warning("could not save learnt priors to %s: %s", locations.priors_path(), e)  # best effort


@dataclass
class AutoDrafter(Drafter):
    """A Drafter that picks plain, prompt lookup or the draft model (and k) before every step."""

    curve: CostCurve
    task: str
    model: ModelDrafter | None
    lookup: PromptLookupDrafter
    priors: dict = field(default_factory=load_priors)

    def __post_init__(self) -> None:
        p = self.priors.get(self.task, DEFAULT_PRIORS["chat"])
        self.model_ok = self.model is not None and can_pay(self.curve.cost_of("model"), self.curve)
        self.est = {"model": Estimate(p["model"])}
        self.lookup_est = {True: Estimate(p["lookup"]), False: Estimate(p["lookup"])}  # by last proposal's fate
        self.lookup_last_ok = False
        self.current = "plain"
        self.last: Choice = Choice("plain", 0, 1.0)
        self.decisions: Counter = Counter()
        self.predicted_sum = 0.0
        self.shadow: tuple[int, list[int]] | None = None  # (history length, lookup proposal)
        self.shadow_seen = 0

    def prepare(self, prompt: list[int]) -> None:
        self.lookup.prepare(prompt)
        if self.model_ok:
            self.model.prepare(prompt)

    def reset(self) -> None:
        self.lookup.reset()
        if self.model is not None:
            self.model.reset()

    def draft(self, history, k, sampling, rng) -> Draft:
        self._score_shadow(history)
        params = self.lookup.params  # the request's caps: --draft-max for the draft model, --lookup-max for lookup
        proposal = self.lookup.draft(history, min(k, params.lookup_max, self.curve.k_max), sampling, rng)
        a_model = self.est["model"].a if self.model_ok else None
        a_lookup = self.lookup_est[self.lookup_last_ok].a
        choice = choose(a_model, a_lookup, len(proposal.tokens), self.curve, min(k, params.max), self.current)
        self.current, self.last = choice.source, choice
        self.decisions[choice.source] += 1
        self.predicted_sum += choice.predicted
        if choice.source == "lookup":
            return Draft(proposal.tokens[: choice.k], None)
        if proposal.tokens and self.shadow is None:
            self.shadow = (len(history), proposal.tokens[:PROBE])
        if choice.source == "model":
            return self.model.draft(history, choice.k, sampling, rng)
        return Draft([], None)

    def observe(self, drafted: int, accepted: int) -> None:
        if self.last.source == "model":
            self.est["model"].observe(drafted, accepted)
        elif self.last.source == "lookup":
            self._observe_lookup(drafted, accepted)

    def _observe_lookup(self, drafted: int, accepted: int) -> None:
        self.lookup_est[self.lookup_last_ok].observe(drafted, accepted)
        self.lookup_last_ok = accepted == drafted

    def _score_shadow(self, history: list[int]) -> None:
        """Score a lookup proposal made earlier against the tokens generated since."""
        if self.shadow is None:
            return
        start, tokens = self.shadow
        produced = history[start:]
        m = 0
        while m < len(tokens) and m < len(produced) and tokens[m] == produced[m]:
            m += 1
        if m < len(tokens) and m == len(produced):
            return  # not decided yet: wait for more tokens
        self._observe_lookup(len(tokens), m)
        self.shadow_seen += 1
        self.shadow = None

    def explain(self) -> dict:
        """What auto chose and why, in numbers and one sentence."""
        c = self.curve
        steps = sum(self.decisions.values())
        k4 = min(4, c.k_max)
        be_model = break_even_acceptance(k4, c.cost_of("model"), c) if self.model is not None else None
        be_lookup = break_even_acceptance(k4, c.cost_of("lookup"), c)
        parts = [f"one main-model pass over {k4 + 1} tokens ({k4} drafted + 1) costs {c.V(k4 + 1):.1f} single-token decodes here"]
        if self.model is not None:
            if not self.model_ok:
                parts.append(f"a {c.draft_cost:.2f}-cost draft model cannot pay on this machine at any plausible acceptance, "
                             "so it was never run")
            else:
                parts.append(f"the draft model pays above {be_model:.0%} acceptance at k={k4}" if be_model
                             else "the draft model does not pay at k=4")
        parts.append(f"prompt lookup pays above {be_lookup:.0%} acceptance at k={k4}" if be_lookup
                     else "prompt lookup cannot pay at k=4")
        used = ", ".join(f"{src} {n}/{steps}" for src, n in self.decisions.most_common()) or "no steps"
        return {
            "task": self.task,
            "decisions": dict(self.decisions),
            "acceptance_estimate": {"model": round(self.est["model"].a, 3),
                                    "lookup_after_hit": round(self.lookup_est[True].a, 3),
                                    "lookup_after_miss": round(self.lookup_est[False].a, 3)},
            "predicted_speedup": self.predicted_sum / steps if steps else 1.0,
            "draft_model_can_pay": self.model_ok,
            "break_even_k4": {"model": be_model, "lookup": be_lookup},
            "verify_curve": list(c.verify),
            "draft_cost": c.draft_cost,
            "sentence": "; ".join(parts) + f". Steps used: {used}.",
        }

    def finish(self) -> dict:
        """Learn from this run, and say what auto chose and why."""
        explanation = self.explain()
        self.learn()
        return explanation

    def learn(self) -> None:
        """Feed this run's estimates back into the stored priors for its task type."""
        observed = {}
        if self.decisions.get("model"):
            observed["model"] = self.est["model"].a
        if self.decisions.get("lookup") or self.shadow_seen:
            observed["lookup"] = self.lookup_est[False].a
        if observed:
            learn_priors(self.task, observed)
