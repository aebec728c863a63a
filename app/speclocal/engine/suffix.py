"""The `suffix` drafter: SuffixDecoding (Oliaro et al., arXiv 2411.04975) in Python + numpy.

Model-free like prompt lookup, but it knows how far a copy will go. It finds the longest suffix of the
recent tokens (up to `max_match`, 64) that occurred before, in two sources:

* the live context, i.e. the prompt (which holds the whole conversation) and the output so far, in a
  `ContextIndex` updated with each new token (O(new tokens) per step);
* a store of earlier generations (`suffix_store.SuffixStore`, possibly millions of tokens) through
  its `SuffixArray`s:
  a suffix array of the *reversed* text, so the ranges of earlier places where the last 1, 2, 3, ...
  tokens occurred are nested and one descent finds them all.

Scoring, as in the paper and ArcticInference's `SuffixTree::speculate`: for a match length m, the
occurrences of the matched m tokens vote on what came next; the draft walks the most frequent
continuation while the *cumulative* empirical probability (the product of count(child) / count(node)
along the path; occurrences whose text ends count in the node, not in a child) stays >= `p_min`, for at
most `min(k, int(alpha * m + offset))` tokens. The draft's score is the sum of its cumulative
probabilities, i.e. the expected number of accepted tokens if the estimates are calibrated. Among the
match lengths tried the best score wins (ties: the longer match); between the live context and the
store the higher score wins, ties to the live context (ArcticInference: `draft1.score >= draft2.score`,
local tree first).

A third candidate comes from the `CopyPointer`, which follows the place in the live context that the output
is copying and finds it again after each edit, so an edited copy keeps drafting where the suffix match has
just shrunk to a token or two. Its probabilities are counted from the generation's own record. Where its
proposal starts as a suffix candidate does, it stands for that candidate; otherwise the higher score wins.

Bounded work per step, whatever the history length: at most `max_occurrences` occurrences are
examined per match length (the latest ones in the live context; an evenly spaced sample of a large
suffix-array range, each standing for range/sample occurrences), at most `max_lengths` match lengths
are scored, and a match length is skipped once its best possible score (its length cap) cannot beat
the best found so far.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

import numpy as np

from speclocal.drafts import Source
from speclocal.engine.drafters import Drafter, DraftParams, Proposal
from speclocal.engine.suffix_store import Match, continuations, match_lengths, tokenizer_fingerprint

__all__ = ["DEFAULT_P_MIN", "ContextIndex", "SuffixDrafter", "tokenizer_fingerprint"]

DEFAULT_P_MIN = 0.1  # the paper's and ArcticInference's min_token_prob; used when --draft-p-min is 0
DEFAULT_MAX_MATCH = 64  # ArcticInference's suffix_cache_max_depth
DEFAULT_ALPHA = 1.0  # ArcticInference's suffix_max_spec_factor (the paper's alpha in MAX_SPEC = alpha * p)

_tiebreak = itertools.count()
_MOD = (1 << 61) - 1  # rolling hash modulus (a Mersenne prime)
_BASE = 1_000_003


# ---------------------------------------------------------------------------------------------
# The live context: prompt + output, hash chains over n-grams of a few lengths
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# Scoring: the most frequent continuation, its cumulative probabilities, runner-up branches
# ---------------------------------------------------------------------------------------------
class _Table:
    """Distinct continuations (tuples, most recent first) of a set of occurrences, with weights."""

    def __init__(self, parts: list[tuple[np.ndarray, int, np.ndarray, float]], length: int):
        mats, ws = [], []
        for text, end, rows, w in parts:
            if len(rows):
                mats.append(continuations(text, end, rows, length))
                ws.append(float(w))
        self.rows: list[tuple[int, ...]] = []
        self.weights: list[float] = []
        if not mats:
            return
        merged: dict[tuple[int, ...], float] = {}  # insertion order: the most recent occurrence first
        for mat, w in zip(mats, ws):
            for row in mat.tolist():
                key = tuple(row)
                merged[key] = merged.get(key, 0.0) + w
        for key, w in merged.items():
            if key and key[-1] == -1:
                key = key[: key.index(-1)]
            self.rows.append(key)
            self.weights.append(w)


def _walk(rows, weights, alive, t, prob, tokens, probs, limit, p_min, alts):
    """Greedy descent from depth t with the rows in `alive`, which share `tokens` (cumulative
    probabilities `probs`, the last one `prob`): extends copies of both and returns them. Each step's
    runners-up at or above p_min go onto `alts`, a heap by probability, for further branches."""
    tokens, probs = list(tokens), list(probs)
    while t < limit:
        if len(alive) == 1:  # one continuation left: its remaining tokens, at the same probability
            rest = rows[alive[0]][t:limit]
            tokens.extend(rest)
            probs.extend([prob] * len(rest))
            break
        total = 0.0
        groups: dict[int, list] = {}
        for i in alive:
            w = weights[i]
            total += w
            row = rows[i]
            if len(row) > t:
                g = groups.get(row[t])
                if g is None:
                    groups[row[t]] = [w, [i]]
                else:
                    g[0] += w
                    g[1].append(i)
        if not groups:
            break
        best = max(groups, key=lambda v: groups[v][0])  # the first maximum: the most recent on a tie
        p = prob * groups[best][0] / total
        if p < p_min:
            break
        if alts is not None:
            for v, (w, idx) in groups.items():
                q = prob * w / total
                if v != best and q >= p_min:
                    heapq.heappush(alts, (-q, next(_tiebreak), t, tokens + [v], probs + [q], idx))
        tokens.append(best)
        probs.append(p)
        prob = p
        alive = groups[best][1]
        t += 1
    return tokens, probs


def _branches(table: _Table, limit: int, p_min: float, n: int) -> list[tuple[list[int], list[float]]]:
    """Up to n distinct branches: the greedy path, then, best first, the most probable runner-up
    continuation at any point of the branches so far, extended greedily (ArcticInference's tree
    speculation, taken as whole branches)."""
    rows, weights = table.rows, table.weights
    alive = [i for i, w in enumerate(weights) if w > 0]
    if not alive or limit <= 0:
        return []
    alts: list | None = [] if n > 1 else None
    toks, probs = _walk(rows, weights, alive, 0, 1.0, [], [], limit, p_min, alts)
    if not toks:
        return []
    out = [(toks, probs)]
    while alts and len(out) < n:
        negq, _, t, prefix, prefix_p, idx = heapq.heappop(alts)
        out.append(_walk(rows, weights, idx, t + 1, -negq, prefix, prefix_p, limit, p_min, alts))
    return out


# ---------------------------------------------------------------------------------------------
# The copy pointer: where in the context the output is copying from, found again after each edit
# ---------------------------------------------------------------------------------------------
@dataclass
class Rate:
    """A probability counted from outcomes, starting from a prior worth `weight` trials."""

    prior: float
    weight: float = 4.0
    hits: float = 0.0
    trials: float = 0.0

    @property
    def value(self) -> float:
        return (self.hits + self.weight * self.prior) / (self.trials + self.weight)

    def add(self, hits: float, trials: float) -> None:
        self.hits += hits
        self.trials += trials


class CopyPointer:
    """Follows the place in the live context that the output is copying (a file being returned with edits, an
    earlier answer being revised). Suffix matching loses such a copy at every edit: after a renamed word or an
    inserted type hint the last few tokens occur nowhere, or in many places, and a match of one or two tokens
    drafts at most that many. The pointer remembers where the copy was and, after the output left it, looks
    for the last tokens only in the next `WINDOW` tokens of the source (the nearest place wins a tie): that
    is where an edited copy resumes. Where it has no position (or an edit ran past `GAP` tokens), a match of
    `ANCHOR` tokens or more anywhere in the context places it (the longest, then the latest).

    How likely each proposed token is comes from this generation's own record, counted like the suffix
    drafter's occurrences (`rates`): a copy that has gone on for longer is likelier to go on, so the chance
    that the next token follows is counted per class of the copy's length since the output last left it
    (`run-0` … `run-64`); the first token after the pointer was placed (`rejoin-1`, `rejoin-2`, `rejoin-3`:
    on that many tokens after an edit; `anchor`) has counts of its own. Every proposal is scored against
    what the main model then produced, drafted or not. The priors (`priors`, each worth `Rate.weight`
    outcomes) default to `PRIORS`, the rates at every position of the tiny pair's greedy answers to the
    whole built-in suite (`scripts/lookup_ceiling.py --calibration`); auto gives its task type's."""

    WINDOW = 64
    GAP = 32
    ANCHOR = 3
    RMAX = 16  # tokens compared when rejoining
    RUN_CLASSES = (0, 4, 16, 64)  # lower bounds of the run-length classes
    PRIORS = {"run-0": 0.59, "run-4": 0.86, "run-16": 0.97, "run-64": 0.98, "rejoin-1": 0.29,
              "rejoin-2": 0.35, "rejoin-3": 0.53, "anchor": 0.67}

    def __init__(self) -> None:
        self.clear(self.PRIORS)

    def clear(self, priors: dict[str, float] | None = None) -> None:
        """Forget the copy and the counts; count again from `priors` (over `PRIORS`; None: the same as before)."""
        if priors is not None:
            self.priors = self.PRIORS | priors
        self.src: int | None = None  # the source position of the next token, as of history length `at`
        self.at = 0
        self.run = 0
        self.left_at: int | None = None  # where the output left the copy, until it is back on it
        self.pending: tuple | None = None  # the last proposal: (history length, start, how placed, tokens)
        self.rates = {name: Rate(p) for name, p in self.priors.items()}

    def _rate(self, j: int, placed: str | None, run: int) -> Rate:
        """The count behind proposed token j: the first token's after the pointer was placed, else the run's."""
        if j == 0 and placed is not None:
            return self.rates[placed]
        return self.rates[f"run-{max(b for b in self.RUN_CLASSES if b <= run)}"]

    def propose(self, index: ContextIndex, live: Match | None, k: int, p_min: float) -> Proposal | None:
        """The source's continuation from where the output is copying, with its cumulative probabilities, or
        None when the output is not copying anything it can place."""
        n = len(index)
        buf = index.tokens
        self._score_pending(buf, n)
        if n < 2 or k <= 0:
            return None
        if self.at > n:  # the history was cut back: a new generation
            self.src, self.left_at = None, None
        start, matched, placed = None, 0, None
        if self.src is not None and self.at == n:  # the output followed the last proposal to its end
            start, matched = self.src, self.RMAX
        elif self.src is not None and n - self.at <= self.GAP:
            lo, hi = max(self.src - 1, 0), min(self.src + (n - self.at) + self.WINDOW, n - 1)
            js = np.flatnonzero(buf[lo:hi] == buf[n - 1]) + lo if hi > lo else ()
            if len(js):
                ml = match_lengths(buf, js.astype(np.int64), index.recent(self.RMAX))
                i = int(np.argmax(ml))  # the first of the longest: the nearest after the pointer
                start, matched = int(js[i]) + 1, int(ml[i])
                if self.left_at is not None:  # back on the source after an edit (else it outran a proposal)
                    placed = f"rejoin-{min(matched, 3)}"
                    self.run = min(matched, n - self.left_at)
        if start is None and live is not None and live.longest >= self.ANCHOR:
            i = int(np.argmax(live.ml))  # rows are most recent first
            start, matched, placed = int(live.rows[i]) + 1, live.longest, "anchor"
            self.run, self.left_at = matched, None  # the matched tokens were copied already
        if start is None or start >= n:
            return None
        self.src, self.at = start, n
        tokens = buf[start : start + k].tolist()
        self.pending = (n, start, placed, tokens)
        scores, p = [], 1.0
        for j in range(len(tokens)):
            p *= self._rate(j, placed, self.run + j).value
            if p < p_min:
                break
            scores.append(p)
        if not scores:
            return None
        return Proposal(tokens[: len(scores)], source=Source.COPY, scores=scores, match_len=matched)

    def _score_pending(self, buf: np.ndarray, n: int) -> None:
        """Count how the last proposal fared against the tokens produced since (once some were) and follow it:
        the pointer moves past what the output copied, or notes where the output left the source."""
        if self.pending is None:
            return
        n0, start, placed, tokens = self.pending
        if n < n0:
            self.pending = None
            return
        seen = min(n - n0, len(tokens))
        if seen == 0:
            return
        self.pending = None
        m = 0
        while m < seen and buf[n0 + m] == tokens[m]:
            m += 1
        for j in range(min(m + 1, seen)):  # outcomes seen: m tokens followed, then (if seen) one did not
            self._rate(j, placed, self.run).add(1.0 if j < m else 0.0, 1.0)
            self.run += j < m
        self.src, self.at = start + m, n0 + m
        if m < seen:
            self.run, self.left_at = 0, self.at
        elif m:
            self.left_at = None


# ---------------------------------------------------------------------------------------------
# The drafter
# ---------------------------------------------------------------------------------------------
class SuffixDrafter(Drafter):
    """Model-free drafter over the live context and, optionally, a store of earlier generations.

    `params.p_min` is the threshold on the *cumulative* empirical probability (0 means the paper's
    0.1); `params.min`: a draft shorter than that is dropped (llama.cpp's --draft-min). `k` (from the
    engine: --draft-max, or auto's cap) caps each draft, as does `alpha * match_len + offset`.
    `copy`: also propose the `CopyPointer`'s continuation of an edited copy. A proposal's candidates are
    `Proposal`s with their cumulative probabilities (`scores`), source (SUFFIX: the live context, STORE or COPY)
    and the match length they were drafted from (for a copy: the tokens it was placed on)."""

    def __init__(self, params: DraftParams | None = None, store=None, *, max_match: int = DEFAULT_MAX_MATCH,
                 alpha: float = DEFAULT_ALPHA, offset: float = 0.0, min_match: int = 1,
                 max_occurrences: int = 64, max_lengths: int = 6, n_vocab: int | None = None, copy: bool = True):
        self.params = params or DraftParams()
        self.store = store
        self.max_match = max_match
        self.alpha = alpha
        self.offset = offset
        self.min_match = max(1, min_match)
        self.max_occurrences = max_occurrences
        self.max_lengths = max_lengths
        self.n_vocab = n_vocab
        self.p_min = self.params.p_min if self.params.p_min > 0 else DEFAULT_P_MIN
        self.index = ContextIndex(max_match)
        self.pointer = CopyPointer() if copy else None
        self._segments: tuple = tuple(store.segments) if store is not None else ()

    # ---- Drafter interface --------------------------------------------------------------------
    def reset(self) -> None:
        self.index.clear()
        self._clear_pointer()
        self._segments = tuple(self.store.segments) if self.store is not None else ()

    def prepare(self, prompt: list[int], copy_priors: dict[str, float] | None = None) -> None:
        """Index the prompt (keeping the index when the prompt extends what it holds: a chat's next
        turn), and take the store's current contents for this generation; the copy pointer starts again from
        `copy_priors` (auto gives its task type's) or its defaults."""
        idx = self.index
        if len(prompt) >= len(idx) and np.array_equal(idx.tokens, np.asarray(prompt[: len(idx)], dtype=np.int32)):
            idx.extend(prompt[len(idx):])
        else:
            idx.clear()
            idx.extend(prompt)
        if self.pointer is not None:
            self.pointer.clear(copy_priors or {})
        self._segments = tuple(self.store.segments) if self.store is not None else ()

    def draft(self, history: list[int], k: int, sampling=None, rng=None, runner_up: bool = False) -> Proposal:
        """The best continuation; with `runner_up`, also the most probable other branch from where it leaves the
        best (`Proposal.runner_up`), for a caller that may verify both in one pass (auto, where the cost curve says
        the extra rows pay)."""
        best = self._best(history, k, 2 if runner_up else 1)
        if not best or len(best[0].tokens) < max(1, self.params.min):
            return Proposal()
        first = best[0]
        if len(best) > 1:
            alt = best[1]
            at = next((i for i, (a, b) in enumerate(zip(alt.tokens, first.tokens)) if a != b), None)
            if at is not None:
                first.runner_up = replace(alt, tokens=alt.tokens[at:], scores=alt.scores[at:], at=at)
        return first

    def candidates(self, history: list[int], k: int, n: int = 2) -> list[Proposal]:
        """Up to n distinct continuation branches of the best (source, match length) and the copy pointer's
        proposal, best first; the first is what `draft` proposes. Branches may share a prefix (a token tree)."""
        return self._best(history, k, n)

    # ---- internals ----------------------------------------------------------------------------
    def _clear_pointer(self) -> None:
        if self.pointer is not None:
            self.pointer.clear()

    def _sync(self, history: Sequence[int]) -> None:
        """Bring the index up to `history`: append what is new. Within a generation the engine only
        appends; anything else (shorter, or a different recent token) rebuilds the index."""
        idx = self.index
        n = len(idx)
        if len(history) >= n and n > 0:
            lo = max(0, n - 8)
            if list(idx.tokens[lo:n]) == list(history[lo:n]):
                idx.extend(history[n:])
                return
        idx.clear()
        idx.extend(history)
        self._clear_pointer()

    def _limit(self, m: int, k: int) -> int:
        return max(0, min(k, int(m * self.alpha + self.offset + 1e-6)))

    def _best(self, history: Sequence[int], k: int, n: int) -> list[Proposal]:
        self._sync(history)
        if k <= 0 or len(self.index) < 2:
            return []
        cap = self.max_occurrences
        best: list[Proposal] = []
        best_score = 0.0
        live = self.index.match(cap, self.min_match)
        if live is not None:
            best, best_score = self._score([(live, len(self.index))], Source.SUFFIX, k, n, 0.0)
        if self.pointer is not None:
            copy = self.pointer.propose(self.index, live, k, self.p_min)
            if copy is not None:
                # a candidate that starts as the copy does copies the same place: the copy stands for it (its
                # probabilities are counted from this generation, not from one or two occurrences, and it knows
                # the edits made so far); candidates that start otherwise compete by score (the suffix's on a tie)
                best = [c for c in best if c.tokens[0] != copy.tokens[0]]
                best = sorted(best + [copy], key=lambda c: -c.expected)[:n]
                best_score = best[0].expected
        if self._segments and best_score < self._limit(self.max_match, k):
            ctx = self.index.recent(self.max_match)
            found = []
            for seg in self._segments:
                mt = seg.match(ctx, cap, self.min_match)
                if mt is not None:
                    found.append((mt, len(seg.text)))
            if found:
                cand, score = self._score(found, Source.STORE, k, n, best_score)
                if score > best_score:
                    best, best_score = cand, score
        if self.n_vocab is not None:
            for c in best:
                bad = next((i for i, t in enumerate(c.tokens) if not 0 <= t < self.n_vocab), None)
                if bad is not None:
                    c.tokens, c.scores = c.tokens[:bad], c.scores[:bad]
            best = [c for c in best if c.tokens]
        return best

    def _score(self, matches: list[tuple[Match, int]], source: Source, k: int, n: int,
               floor: float) -> tuple[list[Proposal], float]:
        """The best draft over a bounded set of match lengths (longest first): the distinct exact
        match lengths of the occurrences found, then powers of two below them."""
        exact = sorted({int(x) for mt, _ in matches for x in np.unique(mt.ml)}, reverse=True)
        lengths = exact[: self.max_lengths]
        ranged = max((mt.m_rows for mt, _ in matches if mt.ranges), default=0)  # shorter: SA ranges
        p2 = 1 << (max(lengths[-1], 1).bit_length() - 1)
        while len(lengths) < self.max_lengths and p2 >= self.min_match:
            if p2 < lengths[-1] and p2 < ranged:
                lengths.append(p2)
            p2 >>= 1
        best: list[Proposal] = []
        best_score = floor
        for m in lengths:
            limit = self._limit(m, k)
            if limit <= best_score or limit == 0:
                break  # its best possible score (every token certain) cannot beat what we have
            parts = []
            for mt, end in matches:
                if m <= mt.longest:
                    rows, w = mt.occurrences(m, self.max_occurrences)
                    parts.append((mt.text, end, rows, w))
            table = _Table(parts, limit)
            branches = _branches(table, limit, self.p_min, n)
            if not branches:
                continue
            score = sum(branches[0][1])
            if score > best_score:
                best_score = score
                best = [Proposal(list(t), source=source, scores=list(p), match_len=m) for t, p in branches]
        return best, (best_score if best else 0.0)
