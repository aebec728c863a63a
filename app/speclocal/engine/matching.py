"""Matches: where the recent tokens occurred before in one text, and with what weight. The live context's
index (`engine.drafting.context`) and the store's suffix arrays (`engine.store.suffix_array`) both find them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Match:
    """Occurrences of the recent tokens in one text.

    `rows` are positions in `text` of the last token of each occurrence (most recent first), `ml` the
    length of each one's match with the recent tokens (capped at max_match), each standing for
    `row_weight` occurrences. Every row matches at least `m_rows` tokens. For shorter match lengths,
    `ranges[m - 1]` is the suffix-array range (lo, hi) of all occurrences of the last m tokens (only for
    suffix arrays; empty for the live context)."""

    text: np.ndarray
    rows: np.ndarray
    ml: np.ndarray
    row_weight: float = 1.0
    m_rows: int = 1
    ranges: list[tuple[int, int]] = field(default_factory=list)
    sa: np.ndarray | None = None

    @property
    def longest(self) -> int:
        return int(self.ml.max()) if len(self.ml) else 0

    def occurrences(self, m: int, cap: int) -> tuple[np.ndarray, float]:
        """Positions (most recent first) of occurrences matching >= m tokens, and each one's weight."""
        if m >= self.m_rows or not self.ranges:
            sel = self.rows[self.ml >= m]
            return sel, self.row_weight
        lo, hi = self.ranges[m - 1]
        return sample_range(self.sa, lo, hi, cap)


def sample_range(sa: np.ndarray, lo: int, hi: int, cap: int) -> tuple[np.ndarray, float]:
    n = hi - lo
    if n <= cap:
        pos = sa[lo:hi].astype(np.int64)
        w = 1.0
    else:
        pos = sa[lo + (np.arange(cap, dtype=np.int64) * n) // cap].astype(np.int64)
        w = n / cap
    return np.sort(pos)[::-1], w


def match_lengths(text: np.ndarray, rows: np.ndarray, ctx_rev: np.ndarray) -> np.ndarray:
    """For each position in `rows`, how many tokens before and at it equal ctx_rev (read backwards)."""
    if len(rows) == 0:
        return np.zeros(0, dtype=np.int64)
    m = len(ctx_rev)
    idx = rows[:, None] - np.arange(m, dtype=np.int64)[None, :]
    vals = text[np.maximum(idx, 0)]
    eq = (vals == ctx_rev[None, :]) & (idx >= 0)
    return np.cumprod(eq, axis=1, dtype=np.int8).sum(axis=1, dtype=np.int64)


def continuations(text: np.ndarray, end: int, rows: np.ndarray, length: int) -> np.ndarray:
    """The `length` tokens after each row (rows x length), -1 past the text's end or a separator."""
    idx = rows[:, None] + 1 + np.arange(length, dtype=np.int64)[None, :]
    out = text[np.minimum(idx, end - 1)].astype(np.int64)
    out[idx >= end] = -1
    if len(out):
        out[np.cumprod(out >= 0, axis=1, dtype=np.int8) == 0] = -1
    return out
