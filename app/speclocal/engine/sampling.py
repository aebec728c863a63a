"""Sampling: the logits -> probabilities transform and the lossless speculative acceptance rule.

All pure functions over numpy arrays; the same transform is applied to the main model's p and the
draft's q, which is what makes speculative sampling lossless (Leviathan et al. 2023, Chen et al. 2023).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace

import numpy as np

from speclocal import options


@dataclass(frozen=True)
class Sampling:
    """llama.cpp's meanings; defaults and allowed values are the settings' (speclocal.options). temp 0 is greedy."""

    temp: float = options.default("temperature")
    top_k: int = options.default("top_k")
    top_p: float = options.default("top_p")
    min_p: float = options.default("min_p")
    seed: int = options.default("seed")

    def __post_init__(self) -> None:
        for name, value in (("temperature", self.temp), ("top_k", self.top_k), ("top_p", self.top_p),
                            ("min_p", self.min_p), ("seed", self.seed)):
            options.check(name, value)

    @property
    def greedy(self) -> bool:
        return self.temp <= 0

    def seeded(self) -> "Sampling":
        """These settings with a fixed seed: the given one, or a new random one for seed -1 (llama.cpp's
        default: random unless a seed is given)."""
        return self if self.seed >= 0 else replace(self, seed=secrets.randbits(32))


def probabilities(logits: np.ndarray, s: Sampling) -> np.ndarray:
    """Dense next-token distribution after top-k, top-p, min-p, then temperature (llama.cpp's order)."""
    n = logits.shape[0]
    out = np.zeros(n, dtype=np.float64)
    if s.greedy:
        out[int(np.argmax(logits))] = 1.0
        return out
    k = s.top_k if 0 < s.top_k < n else n
    ids = np.argpartition(-logits, k - 1)[:k] if k < n else np.arange(n)
    ids = ids[np.argsort(-logits[ids], kind="stable")]
    kept = logits[ids].astype(np.float64)
    p1 = np.exp(kept - kept[0])
    p1 /= p1.sum()
    keep = int(np.searchsorted(np.cumsum(p1), s.top_p) + 1) if s.top_p < 1 else len(ids)
    keep = max(1, min(keep, int(np.count_nonzero(p1 >= s.min_p * p1[0]))))
    ids, kept = ids[:keep], kept[:keep]
    pt = np.exp((kept - kept[0]) / s.temp)
    out[ids] = pt / pt.sum()
    return out


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a (possibly unnormalised) non-negative vector."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(p) - 1))


def accept_or_resample(p: np.ndarray, q: np.ndarray, x: int, rng: np.random.Generator) -> tuple[bool, int]:
    """Speculative sampling for one drafted token x ~ q, given the target distribution p.

    Accept x with probability min(1, p(x)/q(x)); otherwise return a token drawn from
    normalize(max(0, p - q)). The emitted token is then distributed exactly as p.
    """
    px, qx = p[x], q[x]
    if qx > 0 and rng.random() * qx < px:
        return True, x
    residual = np.maximum(p - q, 0.0)
    if residual.sum() <= 0:  # p == q: rejection has probability 0; guard against rounding
        return False, sample(p, rng)
    return False, sample(residual, rng)
