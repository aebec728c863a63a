"""How far a speculative output agrees with plain greedy output, stated honestly.

Batched verification rounds floats differently from one-token decoding, so greedy outputs can part
where plain's top two logits nearly tie. We report the first differing position and plain's top-2
logit margin there. How near is near depends on the model and the machine's kernels: which kernel a pass takes,
and so its rounding, depends on how many tokens it holds, and the keys and values of earlier positions carry that
rounding on (Gemma 3 270M's gap between two candidates moved by ~1 logit with the batch shapes of the 13
positions before it, weights as stored on an AVX-512 Xeon; a Qwen2.5's by hundredths). So at a divergence the
two candidates' logit gap is computed again in several legitimate ways: the whole prefix in one batch; its last
TAIL tokens one at a time, as plain decoded them; and in passes of random sizes, each followed by rejected
tokens rolled back, as speculative steps do. Their spread is this machine's rounding there (`noise`). A
divergence at a margin above both NEAR_TIE and twice that noise is not rounding: it is a bug.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

NEAR_TIE = 0.5  # logits: a margin below this is a near tie whatever the noise measured
TAIL = 16  # tokens before the divergence evaluated again in other shapes, for the noise
SHAPES = 4  # random verify-like shapes of the tail


@dataclass
class Equivalence:
    tokens_match_until: int  # number of leading tokens that agree
    compared: int  # min(len(plain), len(other))
    identical: bool
    margin: float | None  # plain's top-2 logit margin at the first difference (None if identical)
    near_tie: bool | None  # margin < max(NEAR_TIE, 2 x noise)
    noise: float | None = None  # spread of the two candidates' logit gap over three ways to compute it


def compare_outputs(engine, prompt_tokens: list[int], plain: list[int], other: list[int]) -> Equivalence:
    """Compare two greedy outputs for the same prompt; re-evaluates plain's prefix if they differ."""
    n = min(len(plain), len(other))
    i = next((j for j in range(n) if plain[j] != other[j]), n)
    if i == n:
        return Equivalence(i, n, True, None, None)
    main, prefix = engine.main, prompt_tokens + plain[:i]
    with main.full_rows():  # any id's logit is read, not only the candidates a device-side top-k keeps
        return _divergence(engine, main, prefix, i, n, plain[i], other[i])


def _divergence(engine, main, prefix: list[int], i: int, n: int, a: int, b: int) -> Equivalence:
    """Plain's top-2 margin after `prefix`, and the spread of the gap between a and b over several ways to
    compute it (this machine's rounding there)."""
    engine.reset()
    row = main.eval(prefix, outputs="last")[-1]
    top2 = np.partition(row, -2)[-2:]
    margin = float(abs(top2[1] - top2[0]))
    gaps = [float(row[a] - row[b])]
    split = max(1, len(prefix) - TAIL)
    engine.reset()
    main.eval(prefix[:split], outputs="none")
    rng = random.Random(len(prefix))
    for shape in range(SHAPES + 1):
        main.truncate(split)
        pos = split
        while pos < len(prefix):
            size = 1 if shape == 0 else min(len(prefix) - pos, rng.randint(1, 8))
            junk = [] if shape == 0 else [rng.randrange(main.n_vocab) for _ in range(rng.randint(0, 8))]
            row = main.eval(prefix[pos:pos + size] + junk, outputs="all")[size - 1]
            main.truncate(pos + size)
            pos += size
        gaps.append(float(row[a] - row[b]))
    engine.reset()
    noise = max(gaps) - min(gaps)
    return Equivalence(i, n, False, margin, margin < max(NEAR_TIE, 2 * noise), noise)
