"""Sampling: the logits -> distribution transform and the lossless speculative acceptance rule.

Distributions are sparse (`Dist`: the ids that keep any probability after top-k, top-p and min-p, and their
probabilities), so a verified row costs a few passes over the vocabulary, never a sort of all of it; a row
sampled on the device (`Candidates`: its top-k, selected by llama.cpp) costs none. The same transform is applied
to the main model's p and the draft's q, which is what makes speculative sampling lossless (Leviathan et al.
2023, Chen et al. 2023).
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, replace

import numpy as np

from speclocal import options

P_MIN_TOP = 10  # llama.cpp's --draft-p-min test: the best token's probability among the top 10
DEVICE_TOP_K_MAX = 256  # a larger top-k is sampled on the host: so many candidates per row save nothing


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


class Candidates:
    """One output row as llama.cpp's backend sampler hands it back: the ids of the row's k highest logits and
    those logits (in no particular order), instead of the whole vocabulary's."""

    __slots__ = ("ids", "logits")

    def __init__(self, ids: np.ndarray, logits: np.ndarray):
        self.ids, self.logits = ids, logits

    def argmax(self) -> int:
        """The id of the highest logit, the lowest such id on a tie (what `row.argmax()` is for a full row)."""
        return int(self.ids[self.logits == self.logits.max()].min())


@dataclass(frozen=True)
class Dist:
    """A sparse distribution over token ids: `ids` ascending, `probs` summing to 1 (every other id: 0)."""

    ids: np.ndarray
    probs: np.ndarray

    @classmethod
    def point(cls, token: int) -> "Dist":
        """All mass on one token (a model-free drafter's proposal)."""
        return cls(np.array([token], dtype=np.int64), np.array([1.0]))

    @classmethod
    def from_dense(cls, p: np.ndarray) -> "Dist":
        ids = np.flatnonzero(p > 0)
        return cls(ids, np.asarray(p, dtype=np.float64)[ids] / p[ids].sum())

    def prob(self, token: int) -> float:
        i = int(np.searchsorted(self.ids, token))
        return float(self.probs[i]) if i < len(self.ids) and self.ids[i] == token else 0.0

    def dense(self, n: int) -> np.ndarray:
        out = np.zeros(n, dtype=np.float64)
        out[self.ids] = self.probs
        return out

    def below(self, n_vocab: int) -> "Dist":
        """Only the ids below `n_vocab` (a draft vocabulary larger than the main one), renormalised."""
        keep = self.ids < n_vocab
        if keep.all() or not keep.any():
            return self
        return Dist(self.ids[keep], self.probs[keep] / self.probs[keep].sum())


def device_top_k(s: Sampling) -> int | None:
    """How many candidates per row a device-side top-k must hand back for `distribution` (and the draft model's
    --draft-p-min test) to be exact under `s`: its top-k, at least P_MIN_TOP; None where every id may keep
    probability (top-k off at temperature > 0) or the top-k is too large to pay: full rows are needed."""
    if s.top_k <= 0:
        return P_MIN_TOP if s.greedy else None
    return max(s.top_k, P_MIN_TOP) if s.top_k <= DEVICE_TOP_K_MAX else None


def top_probability(row: np.ndarray | Candidates) -> float:
    """Probability of the best token among the top P_MIN_TOP (llama.cpp's --draft-p-min test)."""
    logits = row.logits if isinstance(row, Candidates) else row
    top = logits[np.argpartition(-logits, P_MIN_TOP - 1)[:P_MIN_TOP]].astype(np.float64)
    e = np.exp(top - top.max())
    return float(e.max() / e.sum())


def distribution(logits: np.ndarray | Candidates, s: Sampling) -> Dist:
    """The next-token distribution after top-k, top-p, min-p, then temperature (llama.cpp's order), over the
    ids that keep any probability; from a full logits row or a device-sampled row's candidates (which must hold
    the top-k: `device_top_k`). Greedy: a point mass on the argmax."""
    if s.greedy:
        return Dist.point(int(logits.argmax()))
    ids, kept, log_z = _candidates(logits, s)  # by logit, descending; log_z normalises the softmax before top-p
    p1 = np.exp(kept - log_z)
    keep = int(np.searchsorted(np.cumsum(p1), s.top_p) + 1) if s.top_p < 1 else len(ids)
    if s.min_p > 0:
        keep = min(keep, int(np.count_nonzero(kept >= kept[0] + math.log(s.min_p))))
    ids, kept = ids[:max(1, keep)], kept[:max(1, keep)]
    pt = np.exp((kept.astype(np.float64) - kept[0]) / s.temp)
    order = np.argsort(ids)
    return Dist(ids[order].astype(np.int64), (pt / pt.sum())[order])


def _candidates(logits: np.ndarray, s: Sampling) -> tuple[np.ndarray, np.ndarray, float]:
    """The ids that top-k and min-p can keep, sorted by logit (descending), their logits (float64), and the
    log normaliser top-p measures mass against (over the top-k, or over the whole vocabulary). Only these ids
    are sorted: the vocabulary itself is scanned, never sorted."""
    if isinstance(logits, Candidates):
        if not 0 < s.top_k <= len(logits.ids):
            raise ValueError(f"top-k {s.top_k} needs full rows, not {len(logits.ids)} candidates")
        order = np.lexsort((logits.ids, -logits.logits))[: s.top_k]  # by logit, then id: as from a full row
        kept = logits.logits[order].astype(np.float64)
        return logits.ids[order], kept, float(kept[0] + math.log(np.exp(kept - kept[0]).sum()))
    n = logits.shape[0]
    top = float(logits.max())
    if 0 < s.top_k < n:
        ids = _top_k(logits, s.top_k, top, math.log(s.min_p) if s.min_p > 0 else -8.0)
        kept = logits[ids].astype(np.float64)
        log_z = top + math.log(np.exp(kept - top).sum())
    else:
        log_z = top + math.log(float(np.exp(logits.astype(np.float64) - top).sum()))
        if s.min_p > 0:
            ids = np.flatnonzero(logits >= top + math.log(s.min_p))  # min-p keeps nothing below this
        else:
            ids = _top_mass(logits, s.top_p, top, log_z) if s.top_p < 1 else np.arange(n)
        kept = logits[ids].astype(np.float64)
    order = np.lexsort((ids, -kept))  # by logit, then id: the same order whichever way the ids were found
    return ids[order], kept[order], log_z


def _top_k(logits: np.ndarray, k: int, top: float, below: float) -> np.ndarray:
    """The ids of the k highest logits: selected among those within `below` (< 0) of the top, a window widened
    until it holds k of them, which is a cheap comparison over the vocabulary instead of a full partition."""
    n = logits.shape[0]
    while below > -1e4:
        near = np.flatnonzero(logits >= top + below)
        if len(near) >= k:
            return near if len(near) == k else near[np.argpartition(-logits[near], k - 1)[:k]]
        below *= 2
    return np.argpartition(-logits, k - 1)[:k] if k < n else np.arange(n)


def _top_mass(logits: np.ndarray, mass: float, top: float, log_z: float) -> np.ndarray:
    """The fewest highest-logit ids whose probability reaches `mass` (a superset is fine: top-p cuts it),
    found by widening an argpartition, not by sorting everything."""
    n, m = logits.shape[0], 64
    while m < n:
        ids = np.argpartition(-logits, m - 1)[:m]
        if np.exp(logits[ids].astype(np.float64) - log_z).sum() >= mass:
            return ids
        m *= 4
    return np.arange(n)


def probabilities(logits: np.ndarray, s: Sampling) -> np.ndarray:
    """`distribution` as a dense vector over the vocabulary."""
    return distribution(logits, s).dense(logits.shape[0])


def _dist(p: Dist | np.ndarray) -> Dist:
    return p if isinstance(p, Dist) else Dist.from_dense(np.asarray(p, dtype=np.float64))


def sample(p: Dist | np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a distribution (a `Dist`, or a non-negative vector over the vocabulary)."""
    d = _dist(p)
    c = np.cumsum(d.probs)
    return int(d.ids[min(int(np.searchsorted(c, rng.random() * c[-1], side="right")), len(d.ids) - 1)])


def accept_or_resample(p: Dist | np.ndarray, q: Dist | np.ndarray, x: int,
                       rng: np.random.Generator) -> tuple[bool, int]:
    """Speculative sampling for one drafted token x ~ q, given the target distribution p.

    Accept x with probability min(1, p(x)/q(x)); otherwise return a token drawn from
    normalize(max(0, p - q)). The emitted token is then distributed exactly as p.
    """
    p, q = _dist(p), _dist(q)
    px, qx = p.prob(x), q.prob(x)
    if qx > 0 and rng.random() * qx < px:
        return True, x
    q_at_p = np.zeros(len(p.ids))  # q on p's support (the residual is 0 wherever p is)
    i = np.searchsorted(q.ids, p.ids)
    found = (i < len(q.ids)) & (q.ids[np.minimum(i, len(q.ids) - 1)] == p.ids)
    q_at_p[found] = q.probs[i[found]]
    residual = np.maximum(p.probs - q_at_p, 0.0)
    if residual.sum() <= 0:  # p == q: rejection has probability 0; guard against rounding
        return False, sample(p, rng)
    return False, sample(Dist(p.ids, residual / residual.sum()), rng)
