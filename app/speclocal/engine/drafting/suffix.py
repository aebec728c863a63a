"""The `suffix` drafter: SuffixDecoding (Oliaro et al., arXiv 2411.04975) in Python + numpy.

Model-free like prompt lookup, but it knows how far a copy will go. It finds the longest suffix of the
recent tokens (up to `max_match`, 64) that occurred before, in two sources:

* the live context, i.e. the prompt (which holds the whole conversation) and the output so far, in a
  `ContextIndex` updated with each new token (O(new tokens) per step);
* a store of earlier generations (`engine.store.store.SuffixStore`, possibly millions of tokens) through
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
from dataclasses import replace
from typing import Sequence

import numpy as np

from speclocal.drafts import Source
from speclocal.engine.drafting.base import Drafter, DraftParams, Proposal, continues
from speclocal.engine.drafting.context import DEFAULT_MAX_MATCH, ContextIndex
from speclocal.engine.drafting.copy import CopyPointer
from speclocal.engine.matching import Match, continuations

DEFAULT_P_MIN = 0.1  # the paper's and ArcticInference's min_token_prob; used when --draft-p-min is 0
DEFAULT_ALPHA = 1.0  # ArcticInference's suffix_max_spec_factor (the paper's alpha in MAX_SPEC = alpha * p)

_tiebreak = itertools.count()


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

    def cap(self, params: DraftParams) -> int:
        return params.lookup_max

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
        if len(idx) > 0 and continues(idx.tokens, history):
            idx.extend(history[len(idx):])
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
