"""The standard cost model of speculative decoding (Leviathan et al. 2023), as pure functions.

With acceptance rate a, draft length k, drafting cost D(k) (in units of one main-model single-token
decode) and V(n) the cost of verifying n tokens in one main-model pass (same units):
    expected tokens per step  E(a, k) = (1 - a^(k+1)) / (1 - a)
    predicted speedup         S(a, k) = E(a, k) / (D(k) + V(k+1))
A draft model pays per drafted token, D(k) = k*c; a model-free drafter (prompt lookup, the suffix drafter)
pays per proposal, D(k) = c_step whatever k is (`DraftCost`; a bare number c means per token). A second
candidate verified in the same pass adds its rows to V and its expected accepted tokens to E (`best_tree`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

K_MAX = 16
CONTEXT_POS = 64  # the context depth a profile measures V(n) and c at
LONG_N = (2, 5, 9, 17)  # the pass sizes a profile measures again deeper in the context
DEPTH_REACH = 8  # a fit through two depths is trusted at most this many times their distance past the first


@dataclass(frozen=True)
class DraftCost:
    """What drafting costs, in single-decode units: per drafted token (a draft model's decodes) and per
    proposal (a lookup's search), the latter charged only on steps that draft."""

    per_token: float = 0.0
    per_step: float = 0.0

    def of(self, k: int) -> float:
        return k * self.per_token + (self.per_step if k > 0 else 0.0)


def _cost(c: "DraftCost | float") -> DraftCost:
    return c if isinstance(c, DraftCost) else DraftCost(per_token=c)


@dataclass(frozen=True)
class Depth:
    """What a profile measured again deeper in the context: the single decode's seconds, V(n) for n in LONG_N
    (in units of that decode; () where only c was measured, profiles before version 5) and c (None: no draft
    model)."""

    pos: int
    t_single: float
    verify: tuple[tuple[int, float], ...] = ()
    draft_cost: float | None = None

    def V(self, n: int) -> float:
        """V(n) this deep, linear in n between the pass sizes measured (V(1) = 1)."""
        pts = ((1, 1.0),) + self.verify
        (n0, v0), (n1, v1) = next(((a, b) for a, b in zip(pts, pts[1:]) if n <= b[0]), pts[-2:])
        return v0 + (n - n0) * (v1 - v0) / (n1 - n0)


@dataclass(frozen=True)
class CostCurve:
    """V[n-1] = cost of evaluating n tokens in one pass, in single-decode units (V[0] == 1)."""

    verify: tuple[float, ...]
    draft_cost: float  # c: one draft-model token / one main-model token (inf when there is no draft model)
    lookup_cost: float = 0.0  # one prompt-lookup proposal (a search, whatever its length), same units
    t_single: float = 0.0  # seconds per main-model single-token decode
    meta: dict = field(default_factory=dict, compare=False)
    suffix_cost: float | None = None  # one suffix-drafter proposal, same units (None: not measured; lookup's)
    # the draft model's prompt processing, per token in a batch (None: not measured; `draft_prefill_cost`)
    draft_prefill: float | None = None
    deep: tuple[Depth, ...] = ()  # the same measured deeper in the context, shallowest first: what long prompts pay

    def V(self, n: int) -> float:
        """Verify cost of n tokens; beyond the measured range, extrapolated linearly from the last two points."""
        if n <= len(self.verify):
            return self.verify[n - 1]
        last, prev = self.verify[-1], self.verify[-2]
        return last + (n - len(self.verify)) * max(last - prev, 0.0)

    def cost_of(self, source: str) -> DraftCost:
        """What drafting costs for a draft source: "model" (the draft model, per token) or a model-free one
        ("lookup", "suffix" or "store", per proposal); at a context depth: `at(context).cost_of(source)`."""
        if source == "model":
            return DraftCost(per_token=self.draft_cost)
        if source in ("suffix", "store") and self.suffix_cost is not None:
            return DraftCost(per_step=self.suffix_cost)
        return DraftCost(per_step=self.lookup_cost)

    def at(self, context: int | None) -> "CostCurve":
        """This curve at a context depth (None: as measured), in units of a single decode that deep: each pass's
        time is piecewise linear in the depth (attention reads every cached position) through the depths
        measured (`_along`), for V(n) (interpolated in n between the pass sizes measured deep), c and the
        model-free drafters' searches (whose seconds do not change). Unchanged without a deeper measurement;
        V(n) unchanged where only c was measured deep (profiles before version 5)."""
        if context is None or not self.deep or not self.t_single:
            return self
        depths = [CONTEXT_POS] + [d.pos for d in self.deep]
        t1 = _along(depths, [self.t_single] + [d.t_single for d in self.deep], context)
        shallow = replace(self, deep=())
        if not all(d.verify for d in self.deep):
            return replace(shallow, draft_cost=self.draft_cost_at(context))
        verify = tuple(max(1.0, _along(depths, [v * self.t_single] + [d.V(n) * d.t_single for d in self.deep],
                                       context) / t1)
                       for n, v in enumerate(self.verify, start=1))
        scale = self.t_single / t1
        return replace(shallow, verify=(1.0,) + verify[1:], draft_cost=self.draft_cost_at(context),
                       lookup_cost=self.lookup_cost * scale, t_single=t1,
                       suffix_cost=None if self.suffix_cost is None else self.suffix_cost * scale,
                       draft_prefill=None if self.draft_prefill is None else self.draft_prefill * scale)

    def draft_cost_at(self, context: int) -> float:
        """c at a context depth: each model's per-token time piecewise linear in the depth through the depths
        measured (`_along`); their ratio. Without a deeper measurement of c, c as measured."""
        if not self.deep or any(d.draft_cost is None for d in self.deep) or not self.t_single:
            return self.draft_cost
        depths = [CONTEXT_POS] + [d.pos for d in self.deep]
        return (_along(depths, [self.draft_cost * self.t_single] + [d.draft_cost * d.t_single for d in self.deep],
                       context)
                / _along(depths, [self.t_single] + [d.t_single for d in self.deep], context))

    @property
    def draft_prefill_cost(self) -> float:
        """The draft model's prompt processing per token in single-decode units: as measured, or else estimated
        as c times what batching saves the main model (V(n)/n at the longest pass measured)."""
        if self.draft_prefill is not None:
            return self.draft_prefill
        return self.draft_cost * self.V(len(self.verify)) / len(self.verify)

    @property
    def k_max(self) -> int:
        return len(self.verify) - 1

    def to_dict(self) -> dict:
        """Strict JSON's shape (`from_dict` reads it back): no draft model's infinite cost as None."""
        d = asdict(self)
        if not math.isfinite(self.draft_cost):
            d["draft_cost"] = None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CostCurve":
        """A curve from `to_dict`'s JSON, or from a profile before version 6 (one depth, as `long_pos`,
        `t_single_long`, `verify_long`, `draft_cost_long`)."""
        c = d["draft_cost"]  # None (strict JSON) = no draft model

        def opt(x) -> float | None:
            return None if x is None else float(x)

        def depth(pos, t_single, verify, draft_cost) -> Depth:
            return Depth(int(pos), float(t_single), tuple((int(n), float(v)) for n, v in verify or ()), opt(draft_cost))

        if "deep" in d:
            deep = tuple(depth(x["pos"], x["t_single"], x.get("verify"), x.get("draft_cost")) for x in d["deep"])
        elif d.get("long_pos") and d.get("t_single_long"):
            deep = (depth(d["long_pos"], d["t_single_long"], d.get("verify_long"), d.get("draft_cost_long")),)
        else:
            deep = ()
        return cls(tuple(float(v) for v in d["verify"]), float("inf") if c is None else float(c), float(d.get("lookup_cost", 0.0)),
                   float(d.get("t_single", 0.0)), dict(d.get("meta", {})), opt(d.get("suffix_cost")),
                   opt(d.get("draft_prefill")), tuple(sorted(deep, key=lambda x: x.pos)))


def _along(depths: list[int], times: list[float], context: int) -> float:
    """A time at a context depth on the piecewise-linear fit through the times measured at these depths
    (ascending), extrapolated past the deepest along the last segment, to DEPTH_REACH times its length from its
    start at most. A pass is never cheaper deeper in the context, so a time below one measured shallower (the
    machine's noise) counts as that one."""
    times = [max(times[: i + 1]) for i in range(len(times))]
    i = next((i for i in range(len(depths) - 1) if context <= depths[i + 1]), len(depths) - 2)
    x = min((max(context, 0) - depths[i]) / (depths[i + 1] - depths[i]), DEPTH_REACH)
    return times[i] + x * (times[i + 1] - times[i])


def memory_bound_curve(draft_cost: float = 0.1, slope: float = 0.02, n: int = K_MAX + 1) -> CostCurve:
    """A GPU / unified-memory machine: verifying n tokens costs barely more than one (V(n) ≈ 1 + slope·(n-1))."""
    return CostCurve(tuple(1.0 + slope * i for i in range(n)), draft_cost, 0.0, 0.0, {"kind": "memory-bound (model)"})


def expected_tokens(a: float, k: int) -> float:
    """Expected tokens per main pass with k drafted tokens accepted i.i.d. with probability a."""
    if k <= 0:
        return 1.0
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def predicted_speedup(a: float, k: int, c: DraftCost | float, curve: CostCurve) -> float:
    if k <= 0:
        return 1.0
    return expected_tokens(a, k) / (_cost(c).of(k) + curve.V(k + 1))


def predicted_run_speedup(a: float, drafts: list[int], c: DraftCost | float, curve: CostCurve) -> float:
    """Predicted speedup of a run whose steps drafted these many tokens each (0 = a plain step):
    expected tokens over cost, summed step by step (lookup proposes fewer than k where it finds less)."""
    c = _cost(c)
    tokens = sum(expected_tokens(a, d) for d in drafts)
    cost = sum(c.of(d) + curve.V(d + 1) for d in drafts)
    return tokens / cost if cost else 1.0


LENGTH_CLASSES = (1, 4, 8)  # draft lengths 1-3, 4-7 and 8 or more: `predicted_steps_speedup` fits a rate per class


def predicted_steps_speedup(steps: list[tuple[int, int, int, float]], c: DraftCost | float,
                            curve: CostCurve) -> float | None:
    """Predicted speedup of a run from its own steps (tokens, drafted, accepted, t): each step's expected tokens
    at the i.i.d. rate fitted (`acceptance_mle`) to the steps in its class of draft length (`LENGTH_CLASSES`),
    over its cost. A drafter that picks its own length, as the suffix drafter does, drafts long where it is sure:
    one rate for all its steps reads its long copies as cut short. The pass that produced the end of the answer
    (no token) is left out of the fit and gives none. None where no step drafted."""
    def cls(d: int) -> int:
        return max(x for x in LENGTH_CLASSES if x <= d)

    drafting = [s for s in steps if s[1] > 0 and s[0] > 0]
    if not drafting:
        return None
    rate = {k: acceptance_mle([s for s in drafting if cls(s[1]) == k]) for k in {cls(s[1]) for s in drafting}}

    def tokens(step: tuple) -> float:
        if not step[0]:  # the pass that ended the answer
            return 0.0
        return expected_tokens(rate[cls(step[1])], step[1]) if step[1] else 1.0

    c = _cost(c)
    return sum(map(tokens, steps)) / sum(c.of(s[1]) + curve.V(s[1] + 1) for s in steps)


def best_k(a: float, c: DraftCost | float, curve: CostCurve, k_cap: int | None = None) -> tuple[int, float]:
    """The draft length with the highest predicted speedup, and that speedup; k = 0 means plain."""
    cap = curve.k_max if k_cap is None else min(k_cap, curve.k_max)
    best = (0, 1.0)
    for k in range(1, cap + 1):
        s = predicted_speedup(a, k, c, curve)
        if s > best[1]:
            best = (k, s)
    return best


def best_prefix(q: list[float], c: DraftCost | float, curve: CostCurve, k_cap: int | None = None) -> tuple[int, float]:
    """The draft length with the highest predicted speedup for a proposal whose first i tokens are all accepted
    with probability q[i-1] (non-increasing: the suffix drafter's calibrated cumulative probabilities), and that
    speedup: E = 1 + q[0] + ... + q[k-1] tokens per pass, cost D(k) + V(k+1); k = 0 means plain."""
    cap = min(len(q), curve.k_max if k_cap is None else min(k_cap, curve.k_max))
    c = _cost(c)
    best, e = (0, 1.0), 1.0
    for k in range(1, cap + 1):
        e += q[k - 1]
        s = e / (c.of(k) + curve.V(k + 1))
        if s > best[1]:
            best = (k, s)
    return best


def prefix_speedup(q: list[float], k: int, c: DraftCost | float, curve: CostCurve) -> float:
    """`best_prefix`'s predicted speedup at draft length k (k = 0: plain, 1.0)."""
    if k <= 0:
        return 1.0
    return (1.0 + sum(q[:k])) / (_cost(c).of(k) + curve.V(k + 1))


def best_tree(q: list[float], at: int, q_alt: list[float], c: DraftCost | float, curve: CostCurve,
              k_cap: int | None = None) -> tuple[int, int, float]:
    """Like `best_prefix`, with a second candidate verified in the same pass: it leaves the proposal at index
    `at` (so it counts only where the first k > at tokens are drafted) and its first i tokens are accepted
    with probability q_alt[i-1]; the two are disjoint events, so E = 1 + q[0] + ... + q[k-1] + q_alt[0] +
    ... + q_alt[m-1], cost D(k + m) + V(k + m + 1). Returns (k, m, speedup); m = 0: no second candidate."""
    cap = curve.k_max if k_cap is None else min(k_cap, curve.k_max)
    c = _cost(c)
    k0, s0 = best_prefix(q, c, curve, cap)
    best = (k0, 0, s0)
    e = 1.0 + sum(q[:at])
    for k in range(at + 1, min(len(q), cap) + 1):
        e += q[k - 1]
        f = e
        for m in range(1, min(len(q_alt), cap - k) + 1):
            f += q_alt[m - 1]
            s = f / (c.of(k + m) + curve.V(k + m + 1))
            if s > best[2]:
                best = (k, m, s)
    return best


def break_even_acceptance(k: int, c: DraftCost | float, curve: CostCurve) -> float | None:
    """The acceptance rate at which drafting k tokens starts to pay (S = 1); None if it never does."""
    if predicted_speedup(1.0, k, c, curve) <= 1.0:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if predicted_speedup(mid, k, c, curve) > 1.0:
            hi = mid
        else:
            lo = mid
    return hi


PLAUSIBLE_ACCEPTANCE = 0.95  # above this, measured acceptance is rare even for a same-family draft on code


def can_pay(c: DraftCost | float, curve: CostCurve, a: float = PLAUSIBLE_ACCEPTANCE) -> bool:
    """Whether some k wins at acceptance a. If not even at a plausible best case, auto never runs that source."""
    return best_k(a, c, curve)[0] > 0


def acceptance_mle(steps: list[tuple[int, int, int, float]]) -> float | None:
    """The i.i.d. acceptance rate that best explains a run's steps (tokens, drafted, accepted, t):
    accepted / (accepted + rejections), a rejection being a step that did not accept all it drafted."""
    accepted = sum(s[2] for s in steps if s[1] > 0)
    rejections = sum(1 for s in steps if s[1] > 0 and s[2] < s[1])
    if accepted + rejections == 0:
        return None
    return accepted / (accepted + rejections)


def what_if(acceptance: dict[str, float], curve: CostCurve, source: str = "model",
            k_cap: int | None = None) -> dict[str, dict]:
    """Best draft length and predicted speedup per task type on another machine's curve."""
    c = curve.cost_of(source)
    out = {}
    for task, a in acceptance.items():
        k, s = best_k(a, c, curve, k_cap)
        out[task] = {"acceptance": a, "k": k, "predicted_speedup": s}
    return out
