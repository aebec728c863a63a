"""The live context's index: prompt + output, hash chains over n-grams of a few lengths, for the suffix drafter."""

from __future__ import annotations

from array import array
from typing import Iterable

import numpy as np

from speclocal.engine.matching import Match, match_lengths

DEFAULT_MAX_MATCH = 64  # ArcticInference's suffix_cache_max_depth
_MOD = (1 << 61) - 1  # rolling hash modulus (a Mersenne prime)
_BASE = 1_000_003


class ContextIndex:
    """Incremental index over one growing token sequence (prompt + output so far).

    For each rung length r in `RUNGS` a hash chain (as in LZ77 compressors): `head[r][h]` is the latest
    position whose last r tokens hash to h, `prev[r][i]` the previous position with the same hash as
    position i. Appending a token costs one hash and two array writes per rung; a query walks the
    chains from the longest rung that has an earlier occurrence down, collecting at most `cap`
    positions (the latest ones), and measures each one's exact match length with numpy. Hash
    collisions only cost a wasted candidate (its measured match is shorter than its rung), never a
    wrong draft."""

    RUNGS = (32, 16, 8, 4, 2, 1)

    def __init__(self, max_match: int = DEFAULT_MAX_MATCH, table_bits: int = 18):
        self.max_match = max_match
        self._mask = (1 << table_bits) - 1
        self._table_bits = table_bits
        self._pow = {r: pow(_BASE, r, _MOD) for r in self.RUNGS}
        self.clear()

    def clear(self) -> None:
        self.n = 0
        self._buf = np.full(1024, -1, dtype=np.int32)
        self._hash = array("q", [0])  # prefix hashes: _hash[i] covers tokens[:i]
        self._head = {r: array("i", [-1]) * (1 << self._table_bits) for r in self.RUNGS}
        self._prev = {r: array("i") for r in self.RUNGS}
        self.steps = 0  # chain steps walked by queries: a work counter for the cost tests

    @property
    def tokens(self) -> np.ndarray:
        return self._buf[: self.n]

    def __len__(self) -> int:
        return self.n

    def extend(self, tokens: Iterable[int]) -> None:
        toks = [int(t) for t in tokens]
        if not toks:
            return
        need = self.n + len(toks) + 1
        if need > len(self._buf):
            cap = max(need, 2 * len(self._buf))
            buf = np.full(cap, -1, dtype=np.int32)
            buf[: self.n] = self._buf[: self.n]
            self._buf = buf
        self._buf[self.n : self.n + len(toks)] = toks
        H, mask = self._hash, self._mask
        heads, prevs, pows = self._head, self._prev, self._pow
        rungs = self.RUNGS
        for t in toks:
            i = self.n
            h = (H[i] * _BASE + t + 1) % _MOD
            H.append(h)
            for r in rungs:
                if i + 1 >= r:
                    slot = ((h - H[i + 1 - r] * pows[r]) % _MOD) & mask
                    head = heads[r]
                    prevs[r].append(head[slot])
                    head[slot] = i
                else:
                    prevs[r].append(-1)
            self.n = i + 1

    def recent(self, m: int) -> np.ndarray:
        """The last m tokens, most recent first (int64)."""
        m = min(m, self.n)
        return self._buf[self.n - m : self.n][::-1].astype(np.int64)

    def match(self, cap: int = 64, min_match: int = 1) -> Match | None:
        """Earlier occurrences of the sequence's own end: the latest ones of the longest rung first."""
        n = self.n
        if n < 2:
            return None
        last = n - 1
        buf = self._buf
        tok = int(buf[last])
        seen: dict[int, None] = {}
        for r in self.RUNGS:
            if r > last or len(seen) >= cap:
                continue
            prev = self._prev[r]
            e = prev[last]
            budget = 4 * cap  # chain steps per rung: true occurrences, ones seen at a longer rung, collisions
            while e >= 0 and budget > 0 and len(seen) < cap:
                budget -= 1
                if e not in seen and buf[e] == tok:
                    seen[e] = None
                e = prev[e]
            self.steps += 4 * cap - budget
        if not seen:
            return None
        rows = np.fromiter(seen, dtype=np.int64, count=len(seen))
        rows = np.sort(rows)[::-1]
        ml = match_lengths(self._buf, rows, self.recent(self.max_match))
        keep = ml >= min_match
        return Match(self._buf, rows[keep], ml[keep]) if keep.any() else None

