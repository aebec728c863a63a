"""How far a speculative output agrees with plain greedy output, stated honestly.

Batched verification rounds floats differently from one-token decoding, so greedy outputs can part
where plain's top two logits nearly tie. We report the first differing position and plain's top-2
logit margin there; a divergence at a margin above NEAR_TIE is a real bug.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NEAR_TIE = 0.5  # logits; flips from batched rounding happen far below this (docs/benchmarks.md)


@dataclass
class Equivalence:
    tokens_match_until: int  # number of leading tokens that agree
    compared: int  # min(len(plain), len(other))
    identical: bool
    margin: float | None  # plain's top-2 logit margin at the first difference (None if identical)
    near_tie: bool | None  # margin < NEAR_TIE


def compare_outputs(engine, prompt_tokens: list[int], plain: list[int], other: list[int]) -> Equivalence:
    """Compare two greedy outputs for the same prompt; re-evaluates plain's prefix once if they differ."""
    n = min(len(plain), len(other))
    i = next((j for j in range(n) if plain[j] != other[j]), n)
    if i == n:
        return Equivalence(i, n, True, None, None)
    engine.reset()
    rows = engine.main.eval(prompt_tokens + plain[:i], outputs="last")
    top2 = np.partition(rows[-1], -2)[-2:]
    margin = float(abs(top2[1] - top2[0]))
    engine.reset()
    return Equivalence(i, n, False, margin, margin < NEAR_TIE)
