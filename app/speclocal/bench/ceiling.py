"""The hindsight ceiling of model-free drafting for one answer, on one machine's cost curve: a replay, not a timing.

At every step the draft is whichever is accepted longest of the continuation of every earlier occurrence of
the current token and the suffix drafter's candidate branches (`SuffixDrafter.candidates`), cut to the length
that pays best on the curve; greedy verification accepts a draft's longest prefix equal to the answer, so this
is the best any policy that copies from the context or follows the suffix drafter's candidates can do. The bench
records it per prompt turn (auto's speedup as a share of it), `scripts/lookup_ceiling.py` replays policies
against it."""

from __future__ import annotations

from speclocal.engine.drafting.base import DraftParams
from speclocal.engine.drafting.suffix import SuffixDrafter
from speclocal.policy.costmodel import CostCurve

K_MAX = 16  # the longest draft considered (the model-free drafters' default cap)
CANDIDATES = 4  # suffix-drafter branches considered per step


def hindsight_speedup(prompt: list[int], answer: list[int], curve: CostCurve, k_max: int = K_MAX,
                      suffix: SuffixDrafter | None = None, n_candidates: int = CANDIDATES) -> float:
    """Predicted speedup of the best copy-from-context drafting of `answer` (see the module docstring); with
    `suffix` None a fresh SuffixDrafter (no store) is used."""
    suffix = suffix if suffix is not None else SuffixDrafter(DraftParams(max=k_max, lookup_max=k_max))
    history, i, cost, plain = list(prompt), 0, 0.0, 0.0  # seconds (a curve without them: single decodes)
    suffix.prepare(prompt)
    while i < len(answer):
        rest, best = answer[i:], 0
        room = min(k_max, len(rest) - 1)
        if room > 0:
            for c in suffix.candidates(history, room, n_candidates):
                m = 0
                while m < len(c.tokens) and c.tokens[m] == rest[m]:
                    m += 1
                best = max(best, m)
        last = history[-1]
        for j in range(len(history) - 1):
            if history[j] != last:
                continue
            m = 0
            while m < room and j + 1 + m < len(history) and history[j + 1 + m] == rest[m]:
                m += 1
            best = max(best, m)
        deep = curve.at(len(history))  # each step at its depth
        d = max(range(best + 1), key=lambda n: (n + 1) / deep.V(n + 1))
        step = min(d + 1, len(rest))
        cost += (deep.V(d + 1) + (deep.lookup_cost if d else 0.0)) * (deep.t_single or 1.0)
        plain += step * (deep.t_single or 1.0)
        history += rest[:step]
        i += step
    return plain / cost if cost else 1.0
