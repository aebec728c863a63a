"""Suffix arrays of a reversed token text: the ranges of earlier places where the last 1, 2, 3, ... tokens occurred
are nested, so one descent finds them all. Sorting, merging without a re-sort, and matching."""

from __future__ import annotations

import numpy as np

from speclocal.engine.matching import Match, match_lengths, sample_range

SA_DEPTH = 32  # suffix arrays are sorted by the first 32 tokens of each (reversed) suffix; deeper: compared
SEPARATOR = -1  # between generations in a store's text; never equals a token id, so no match crosses it


def build_suffix_array(text: np.ndarray, depth: int = SA_DEPTH) -> np.ndarray:
    """Positions e with text[e] >= 0, sorted by (text[e], text[e-1], ..., text[e-depth+1]) (prefix
    doubling: log2(depth) argsorts; before the start sorts first, then separators, then tokens; ties
    by position). Returns int32."""
    n = len(text)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    r = text.astype(np.int64) + 2
    rmax = int(r.max())
    order = np.argsort(r, kind="stable")  # depth 1 (kept if depth is 1)
    h = 1
    while h < depth:
        key = r * (rmax + 1)
        key[h:] += r[:-h]
        order = np.argsort(key, kind="stable")
        sk = key[order]
        del key
        flags = np.empty(n, dtype=np.int64)
        flags[0] = 1
        np.not_equal(sk[1:], sk[:-1], out=flags[1:], casting="unsafe")
        del sk
        ranks = np.cumsum(flags, out=flags)
        r = np.empty(n, dtype=np.int64)
        r[order] = ranks
        rmax = int(ranks[-1])
        del ranks
        h *= 2
        if rmax == n:  # all distinct: deeper tokens cannot change the order
            break
    keep = text[order] >= 0
    return order[keep].astype(np.int32)


def first_token_table(text: np.ndarray, sa: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct first tokens of the sorted suffixes (ascending) and where each one's range starts
    (with the array's length appended)."""
    first = text[sa] if len(sa) else np.zeros(0, dtype=np.int32)
    if len(first) == 0:
        return np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64)
    flags = np.empty(len(first), dtype=bool)
    flags[0] = True
    np.not_equal(first[1:], first[:-1], out=flags[1:])
    starts = np.flatnonzero(flags)
    return first[starts].astype(np.int32), np.append(starts, len(first)).astype(np.int64)


def compare_backward(ta: np.ndarray, pa: np.ndarray, tb: np.ndarray, pb: np.ndarray,
                     depth: int = SA_DEPTH) -> np.ndarray:
    """sign(a - b) for the backward strings at positions pa of ta and pb of tb, compared up to `depth`
    tokens and up to (including) the first separator or the text's start: strings that agree that
    far are equal. A suffix array sorted by `build_suffix_array` is sorted under this comparison too
    (it only refines it), and any order sorted under it keeps every separator-free prefix's
    occurrences contiguous: all a lookup needs. Column by column on the rows still tied."""
    res = np.zeros(len(pa), dtype=np.int8)
    open_ = np.arange(len(pa))
    for j in range(depth):
        if len(open_) == 0:
            break
        qa, qb = pa[open_] - j, pb[open_] - j
        a = np.where(qa >= 0, ta[np.maximum(qa, 0)], -2)
        b = np.where(qb >= 0, tb[np.maximum(qb, 0)], -2)
        ne = a != b
        res[open_[ne]] = np.where(a[ne] > b[ne], 1, -1)
        open_ = open_[~ne & (a >= 0)]
    return res


def merge_suffix_arrays(ta: np.ndarray, sa_a: np.ndarray, tb: np.ndarray, sa_b: np.ndarray,
                        depth: int = SA_DEPTH) -> np.ndarray:
    """The suffix array of ta + tb[1:] (tb's leading separator dropped: ta's last one serves) from the
    two sorted ones, without re-sorting: each entry of the (small) b finds its place in a by a
    vectorized binary search (O(len(b) log len(a)) comparisons), then one insert (O(len(a)))."""
    pb = sa_b.astype(np.int64)
    lo = np.zeros(len(pb), dtype=np.int64)
    hi = np.full(len(pb), len(sa_a), dtype=np.int64)
    idx = np.arange(len(pb))
    while len(idx):
        mid = (lo[idx] + hi[idx]) >> 1
        le = compare_backward(tb, pb[idx], ta, sa_a[mid].astype(np.int64), depth) >= 0  # a[mid] <= b
        lo[idx[le]] = mid[le] + 1
        hi[idx[~le]] = mid[~le]
        idx = idx[lo[idx] < hi[idx]]
    return np.insert(np.asarray(sa_a, dtype=np.int32), lo, (pb + len(ta) - 1).astype(np.int32))


def first_token_table_from_text(text: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`first_token_table` from token counts (a sequential pass, no gather through the suffix array)."""
    toks = text[text >= 0]
    if len(toks) == 0:
        return np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64)
    if int(toks.max()) > 1 << 24:  # ids far beyond any vocabulary: do not allocate a count per id
        ids, counts = np.unique(toks, return_counts=True)
    else:
        counts = np.bincount(toks)
        ids = np.flatnonzero(counts)
        counts = counts[ids]
    return ids.astype(np.int32), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


class SuffixArray:
    """A read-only text (int32 tokens, generations separated by SEPARATOR) and its reversed suffix
    array; `first` maps each distinct token to its range in the array (the first, widest step)."""

    def __init__(self, text: np.ndarray, sa: np.ndarray | None = None, depth: int = SA_DEPTH,
                 first: tuple[np.ndarray, np.ndarray] | None = None):
        self.text = np.asarray(text, dtype=np.int32)
        self.depth = depth
        self.sa = build_suffix_array(self.text, depth) if sa is None else np.asarray(sa, dtype=np.int32)
        if len(self.sa) and self.text[-1] != SEPARATOR:
            raise ValueError("a suffix-array text must end with a separator")
        if first is None:
            first = first_token_table(self.text, self.sa)
        self.first_tokens, self.first_starts = first
        self._sa_mv = memoryview(self.sa)
        self._text_mv = memoryview(self.text)
        self.ops = 0

    def __len__(self) -> int:
        return len(self.sa)

    def match(self, ctx_rev: np.ndarray, small: int = 64, min_match: int = 1) -> Match | None:
        """Occurrences of the longest suffix of the context (given most recent first). Narrows the
        range one token at a time by binary search while it has more than `small` entries; then
        measures the match length of its entries (all of them, or `small` evenly spaced ones) directly."""
        if len(self.sa) == 0 or len(ctx_rev) == 0:
            return None
        c0 = int(ctx_rev[0])
        i = int(np.searchsorted(self.first_tokens, c0))
        if i >= len(self.first_tokens) or int(self.first_tokens[i]) != c0:
            return None
        lo, hi = int(self.first_starts[i]), int(self.first_starts[i + 1])
        ranges = [(lo, hi)]
        sa, text = self._sa_mv, self._text_mv
        limit = min(self.depth, len(ctx_rev))
        j = 1
        steps = 0
        while j < limit and hi - lo > small:
            v = int(ctx_rev[j])
            a, b = lo, hi
            while a < b:  # first entry whose j-th token back is >= v
                mid = (a + b) >> 1
                p = sa[mid] - j
                if (text[p] if p >= 0 else -2) < v:
                    a = mid + 1
                else:
                    b = mid
                steps += 1
            lo2 = a
            b = hi
            while a < b:  # first entry whose j-th token back is > v
                mid = (a + b) >> 1
                p = sa[mid] - j
                if (text[p] if p >= 0 else -2) <= v:
                    a = mid + 1
                else:
                    b = mid
                steps += 1
            if lo2 == a:
                break
            lo, hi = lo2, a
            j += 1
            ranges.append((lo, hi))
        self.ops += steps + len(ranges)
        rows, w = sample_range(self.sa, lo, hi, small)
        ml = match_lengths(self.text, rows, ctx_rev)
        keep = ml >= min_match
        if not keep.any():
            return None
        return Match(self.text, rows[keep], ml[keep], w, j, ranges[: j - 1], self.sa)


