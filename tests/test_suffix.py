"""The suffix drafter and its store, pure: token ids are ints, no model is loaded."""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from speclocal.drafts import Source
from speclocal.engine.drafting.base import DraftParams, continues
from speclocal.engine.drafting.context import ContextIndex
from speclocal.engine.drafting.copy import CopyPointer
from speclocal.engine.drafting.suffix import DEFAULT_P_MIN, SuffixDrafter
from speclocal.engine.store.store import tokenizer_fingerprint
from speclocal.engine.store import file_format, suffix_array
from speclocal.engine.store import store as store_module
from speclocal.engine.store.store import SuffixStore
from speclocal.engine.store.suffix_array import build_suffix_array, SuffixArray

APP = str(Path(__file__).resolve().parent.parent / "app")


def drafted(seq, k=16, **kw):
    """The suffix drafter's proposal for `seq` given whole, and its tokens (the copy pointer off unless asked)."""
    params = kw.pop("params", DraftParams(max=k))
    kw.setdefault("copy", False)
    d = SuffixDrafter(params, **kw)
    d.prepare(list(seq))
    p = d.draft(list(seq), k)
    return p, p.tokens


# ---- matching and scoring ---------------------------------------------------------------------
def test_an_index_goes_on_only_from_what_it_holds():
    """Both model-free drafters take just the new tokens of a history that extends what they indexed, and start
    over on one that is shorter or differs in the last tokens indexed."""
    indexed = list(range(20))
    assert continues(indexed, indexed + [7, 8]) and continues(indexed, indexed) and continues([], [1, 2])
    assert not continues(indexed, indexed[:-1])  # shorter: a rollback or another conversation
    assert not continues(indexed, indexed[:-1] + [99, 5])  # the last indexed token differs
    assert continues(indexed, [99] + indexed[1:] + [5])  # older than the checked tail: taken as the same


def test_longest_match_in_the_live_context():
    seq = [10, 11, 12, 13, 14, 15, 90, 91, 20, 12, 13, 14, 77, 95, 11, 12, 13, 14]
    idx = ContextIndex()
    idx.extend(seq)
    m = idx.match()
    # 11 12 13 14 (then 15) and 12 13 14 (then 77), most recent first
    assert m.rows.tolist() == [11, 4] and m.ml.tolist() == [3, 4]
    p, toks = drafted(seq, k=4)
    assert toks == [15, 90, 91, 20]  # the longest match's continuation, not 77
    assert p.match_len == 4 and p.source == Source.SUFFIX and p.scores == [1.0] * 4


FREQ = [1, 5, 6, 7, 8, 2, 5, 6, 7, 8, 3, 5, 6, 7, 9, 4, 5, 6, 7, 8, 0, 5, 6, 7]  # 5 6 7 -> 8, 8, 9, 8


def test_frequency_scoring_gives_cumulative_empirical_probabilities():
    p, toks = drafted(FREQ, k=3)
    # 8 followed 3 of 4 times; after 8: 2, 3, 0 once each (the latest, 0, wins the tie); then 5
    assert toks == [8, 0, 5]
    assert p.scores == pytest.approx([0.75, 0.25, 0.25])
    assert p.expected == pytest.approx(1.25) and p.match_len == 3


def test_threshold_is_on_the_cumulative_probability():
    p, toks = drafted(FREQ, k=3, params=DraftParams(max=3, p_min=0.3))
    assert toks == [8] and p.scores == [0.75]
    # 12 occurrences of "5 6 7": half continue 8 then six different tokens, half 9 ...: after 8 each
    # next token has 1/6 (>= 0.1 on its own) but the cumulative 0.5 * 1/6 = 0.083 is below 0.1
    seq = []
    for i in range(12):
        seq += [100 + i, 5, 6, 7, 8 if i % 2 else 9, 200 + i]  # the latest: 8
    seq += [99, 5, 6, 7]
    p, toks = drafted(seq, k=3)
    assert SuffixDrafter(DraftParams()).p_min == DEFAULT_P_MIN == 0.1  # --draft-p-min 0 means the paper's 0.1
    assert toks == [8] and p.scores == pytest.approx([0.5])
    p, toks = drafted(seq, k=3, params=DraftParams(max=3, p_min=0.05))
    assert toks == [8, 211, 99] and p.scores == pytest.approx([0.5, 0.5 / 6, 0.5 / 6])  # 211: one row left


@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
def test_draft_length_grows_with_the_match_length_and_is_capped_by_k(m):
    a = list(range(1000, 1020))
    seq = a + [7, 7, 7] + a[:m]
    _, toks = drafted(seq, k=16)
    assert toks == a[m : 2 * m]  # alpha = 1: as many tokens as matched
    _, toks = drafted(seq, k=4)
    assert toks == a[m : m + min(m, 4)]
    _, toks = drafted(seq, k=16, alpha=2.0)
    assert toks == seq[m : 3 * m]  # twice as many (past a's end: what followed it)


def test_draft_min_and_vocab_bound():
    seq = list(range(1000, 1010)) + [7] + list(range(1000, 1003))
    _, toks = drafted(seq, k=16, params=DraftParams(max=16, min=4))
    assert toks == []  # 3 tokens < --draft-min 4
    _, toks = drafted(seq, k=16, params=DraftParams(max=16, min=3))
    assert toks == [1003, 1004, 1005]
    _, toks = drafted(seq, k=16, n_vocab=1005)
    assert toks == [1003, 1004]  # never a token the model does not have


def test_no_match_no_draft_and_history_sync():
    d = SuffixDrafter(DraftParams())
    d.prepare([1, 2, 3])
    p = d.draft([1, 2, 3], 4)
    assert p.tokens == [] and p.scores == [] and p.source is None
    h = [1, 2, 3, 4, 1, 2]
    assert d.draft(h, 4).tokens == [3, 4] and len(d.index) == 6  # extended, not rebuilt
    assert d.draft([9, 8, 9], 4).tokens == [8] and len(d.index) == 3  # not an extension: rebuilt


def test_prepare_keeps_the_index_for_the_next_chat_turn():
    d = SuffixDrafter(DraftParams())
    turn1 = list(range(100, 400))
    d.prepare(turn1)
    d.draft(turn1 + [5, 6], 4)
    indexed = d.index.tokens.copy()
    d.prepare(turn1 + [5, 6, 7, 8])  # the next prompt starts with everything indexed
    assert np.array_equal(d.index.tokens[: len(indexed)], indexed) and len(d.index) == 304


def test_candidates_are_distinct_branches_best_first():
    occ = {1: [8, 20, 21], 2: [8, 20, 21], 3: [8, 20, 21], 4: [9, 30, 31], 40: [9, 30, 31], 41: [8, 20, 22]}
    seq = []
    for pre, cont in occ.items():
        seq += [pre, 5, 6, 7] + cont
    seq += [0, 5, 6, 7]
    d = SuffixDrafter(DraftParams(max=3), copy=False)
    d.prepare(seq)
    c = d.candidates(seq, 3, n=3)
    assert [x.tokens for x in c] == [[8, 20, 21], [9, 30, 31], [8, 20, 22]]
    assert c[0].scores == pytest.approx([4 / 6, 4 / 6, 3 / 6])
    assert c[1].scores == pytest.approx([2 / 6] * 3)
    assert c[2].scores == pytest.approx([4 / 6, 4 / 6, 1 / 6])
    assert [x.expected for x in c] == pytest.approx([sum(x.scores) for x in c])
    assert d.draft(seq, 3).tokens == c[0].tokens
    assert len(d.candidates(seq, 3, n=2)) == 2


# ---- the copy pointer --------------------------------------------------------------------------
SRC = list(range(1000, 1060))  # a "file" of distinct tokens


def stepped(prompt, output, k=16, **kw):
    """Draft at every position of `output` in turn (the pointer learns as the engine's steps let it); the
    drafter and its last proposal."""
    d = SuffixDrafter(kw.pop("params", DraftParams(max=k, lookup_max=k)), **kw)
    d.prepare(list(prompt))
    for i in range(len(output) + 1):
        p = d.draft(list(prompt) + list(output[:i]), k)
    return d, p


def test_the_copy_resumes_after_an_insertion_at_full_length():
    prompt = [1, 2] + SRC + [3, 4]
    out = SRC[:20] + [7, 8] + SRC[20:22]  # an inserted pair, then the copy goes on: a match of 2 tokens
    _, p = stepped(prompt, out)
    assert p.tokens == SRC[22:38] and p.source == "copy"
    assert p.scores == sorted(p.scores, reverse=True) and 0.1 <= p.scores[-1] < p.scores[0] < 1
    _, p = stepped(prompt, out, copy=False)
    assert p.tokens == SRC[22:24]  # the suffix drafter alone: as long as its match


def test_the_copy_resumes_after_a_renamed_token_on_one_token():
    src = SRC[:10] + [50, 51] + SRC[10:30]
    prompt = [1, 2] + src + [3, 4] + [51, 7]  # 51 also occurs elsewhere, followed by something else
    _, p = stepped(prompt, SRC[:10] + [60, 51])  # 50 renamed 60
    toks = p.tokens
    # the 51 next to the pointer, not the latest one; longer than the suffix drafter's one-token match, for as long as
    # the cumulative probability (a rejoin on one token's, then the run's) stays above p_min
    assert len(toks) > 2 and toks == SRC[10 : 10 + len(toks)] and p.source == "copy"
    assert p.scores[0] == pytest.approx(CopyPointer.PRIORS["rejoin-1"]) and p.scores[-1] >= DEFAULT_P_MIN


def test_the_copy_counts_how_often_it_is_followed():
    prompt = [1, 2] + SRC + [3, 4]
    d, p = stepped(prompt, SRC[:40])
    followed = [r for name, r in d.pointer.rates.items() if name.startswith("run-")]
    assert sum(r.hits for r in followed) >= 35 and sum(r.trials - r.hits for r in followed) == 0
    on_track = p.scores[0]
    # an output that replaces every fourth token: the copy's first few tokens after a rejoin fail often
    out = []
    for i in range(0, 36, 4):
        out += SRC[i : i + 3] + [900 + i]
    d, p = stepped(prompt, out + SRC[36:38])
    early = d.pointer.rates["run-0"]
    assert early.trials - early.hits >= 8 and early.value < CopyPointer.PRIORS["run-0"]
    assert p.source == "copy" and p.scores[0] < on_track


def test_the_copy_drafts_only_above_p_min_and_forgets_a_cut_history():
    prompt = [1, 2] + SRC + [3, 4]
    out = SRC[:20] + [7, 8] + SRC[20:21]  # rejoined on one token: first token at the rejoin-1 prior
    d, p = stepped(prompt, out, params=DraftParams(max=16, lookup_max=16, p_min=0.5))
    assert CopyPointer.PRIORS["rejoin-1"] < 0.5 and p.source != "copy"
    d.draft([1, 2, 3], 16)  # another history: rebuilt index, the pointer starts again
    assert d.pointer.src is None and d.pointer.left_at is None


def test_a_proposal_keeps_what_it_predicts():
    p, toks = drafted(FREQ, k=3)
    assert {"drafted": len(toks), "expected": p.expected} == {"drafted": 3, "expected": pytest.approx(1.25)}


# ---- the suffix array over earlier generations --------------------------------------------------
def _text(gens):
    return file_format.Records.of(gens).text


def _backward(text, e, depth):
    return [int(text[e - j]) if e - j >= 0 else -2 for j in range(depth)]


@pytest.mark.parametrize("seed", range(6))
def test_suffix_array_sorts_backward_strings_and_counts_match_brute_force(seed):
    rng = np.random.default_rng(seed)
    big = 150_000 if seed % 2 else 0  # ids far above the text's length (a real vocabulary, a short store)
    gens = [(big + rng.integers(0, 4, int(rng.integers(1, 60)))).tolist() for _ in range(int(rng.integers(1, 8)))]
    text = _text(gens)
    sa = build_suffix_array(text, depth=8)
    keys = [_backward(text, int(e), 8) for e in sa]
    assert sorted(sa.tolist()) == [i for i in range(len(text)) if text[i] >= 0]
    assert keys == sorted(keys)
    arr = SuffixArray(text, build_suffix_array(text), first=None)
    for _ in range(10):
        ctx = big + np.asarray(rng.integers(0, 4, int(rng.integers(1, 12))), dtype=np.int64)
        positions = [i for i in range(len(text)) if text[i] >= 0]

        def count(m):
            return sum(_backward(text, e, m) == ctx[:m].tolist() for e in positions)

        longest = max((m for m in range(1, len(ctx) + 1) if count(m)), default=0)
        mt = arr.match(ctx, small=3)
        if longest == 0:
            assert mt is None
            continue
        assert mt.longest == longest
        for m in range(1, longest + 1):
            rows, w = mt.occurrences(m, cap=1000)
            assert round(len(rows) * w) == count(m)


def _counts(arr, ctx):
    mt = arr.match(ctx, small=2)
    if mt is None:
        return None
    return mt.longest, [round(len(r) * w) for r, w in (mt.occurrences(m, 10**6) for m in range(1, mt.longest + 1))]


@pytest.mark.parametrize("seed", range(6))
def test_merged_suffix_arrays_and_eviction_by_filter_match_a_fresh_sort(seed):
    rng = np.random.default_rng(100 + seed)
    big = 150_000 if seed % 2 else 0
    gens = [(big + rng.integers(0, 3, int(rng.integers(1, 40)))).tolist() for _ in range(int(rng.integers(2, 10)))]
    split = int(rng.integers(1, len(gens)))
    old, new = file_format.Records.of(gens[:split]).index(), file_format.Records.of(gens[split:]).index()
    merged = file_format.Records.merged(old, new)
    fresh = file_format.Records.of(gens).index()
    assert np.array_equal(merged.text, fresh.text)
    assert sorted(merged.sa.tolist()) == sorted(fresh.sa.tolist())
    sa = merged.sa.astype(np.int64)  # sorted under the comparison a lookup relies on
    assert (suffix_array.compare_backward(merged.text, sa[:-1], merged.text, sa[1:]) <= 0).all()
    assert np.array_equal(merged.first_tokens, fresh.first_tokens) and np.array_equal(merged.first_starts,
                                                                                        fresh.first_starts)
    drop = int(rng.integers(0, len(gens)))
    kept = merged.drop_oldest(drop)
    kept_fresh = file_format.Records.of(gens[drop:]).index()
    assert np.array_equal(kept.text, kept_fresh.text) and np.array_equal(kept.gen_start, kept_fresh.gen_start)
    a, b = SuffixArray(kept.text, kept.sa, first=(kept.first_tokens, kept.first_starts)), SuffixArray(kept_fresh.text)
    m1, m2 = SuffixArray(merged.text, merged.sa, first=(merged.first_tokens, merged.first_starts)), \
        SuffixArray(fresh.text)
    for _ in range(30):
        ctx = big + np.asarray(rng.integers(0, 3, int(rng.integers(1, 10))), dtype=np.int64)
        assert _counts(m1, ctx) == _counts(m2, ctx)
        assert _counts(a, ctx) == _counts(b, ctx)


def test_adds_and_compactions_merge_without_re_sorting_the_store(tmp_path, monkeypatch):
    s = SuffixStore(tmp_path / "s", "fp", tail_max_tokens=2000)
    for i in range(8):
        s.add([], gen(i))  # compactions at 2100 and 4200 tokens
    sorted_sizes = []
    real = suffix_array.build_suffix_array

    def counted(text, depth=suffix_array.SA_DEPTH):
        sorted_sizes.append(len(text))
        return real(text, depth)

    for module in (suffix_array, file_format):
        monkeypatch.setattr(module, "build_suffix_array", counted)
    before = s.compactions
    for i in range(8, 20):
        s.add([], gen(i))
    assert s.compactions > before
    assert max(sorted_sizes) == 302  # only each new generation (300 tokens, 2 separators) is sorted
    assert s.generations() == [gen(i) for i in range(20)]
    d = SuffixDrafter(DraftParams(max=4), store=s)
    probe = gen(3)[100:110]
    d.prepare([1] + probe)
    assert d.draft([1] + probe, 4).tokens == gen(3)[110:114]  # the merged base still finds an old one


def test_large_ranges_are_sampled_with_weights_that_keep_counts():
    rng = np.random.default_rng(0)
    # 2000 occurrences of "7 8" after distinct tokens, followed by 1 (75 %) or 2 (25 %)
    nxt = rng.permutation([1] * 1500 + [2] * 500)
    gens = [[10_000 + i, 7, 8, int(nxt[i])] for i in range(2000)]
    arr = SuffixArray(_text(gens))
    d = SuffixDrafter(DraftParams(max=2), store=SimpleNamespace(segments=(arr,)))  # anything with .segments
    d.prepare([9, 7, 8])
    p = d.draft([9, 7, 8], 2)
    assert p.tokens[:1] == [1]
    assert abs(p.scores[0] - 0.75) < 0.1 and p.source == "store"
    # with a tail where "7 8" was followed by 3 sixty times (all examined, weight 1): 60 of 2060, not
    # 60 of the 124 rows examined
    tail = SuffixArray(_text([[20_000 + i, 7, 8, 3] for i in range(60)]))
    d = SuffixDrafter(DraftParams(max=2, p_min=0.01), store=SimpleNamespace(segments=(tail, arr)))
    d.prepare([9, 7, 8])
    c = d.candidates([9, 7, 8], 2, n=3)
    assert [x.tokens[0] for x in c] == [1, 2, 3]
    assert abs(c[0].scores[0] - 1500 / 2060) < 0.1 and abs(c[2].scores[0] - 60 / 2060) < 0.01
    mt = arr.match(np.asarray([8, 7, 9]), small=64)
    rows, w = mt.occurrences(2, cap=64)
    assert len(rows) == 64 and w == pytest.approx(2000 / 64)


# ---- live context against the store -------------------------------------------------------------
@pytest.fixture
def store(tmp_path):
    return SuffixStore(tmp_path / "store", "fp-qwen", max_bytes=4 * 2**20, tail_max_tokens=4096)


G = list(range(100, 140))


def test_store_drafts_when_the_live_context_has_no_match(store):
    store.add([], G)
    p, toks = drafted([500, 501] + G[:5], k=8, store=store)
    assert toks == G[5:10] and p.source == "store" and p.match_len == 5
    _, toks = drafted([500, 501] + G[:5], k=8)  # no store: nothing to copy from
    assert toks == []


def test_live_context_wins_a_tie_and_the_store_a_better_score(store):
    store.add([], G)
    live = [500, 501] + G[:5] + [600, 601, 602] + [777] + G[:5]
    p, toks = drafted(live, k=3, store=store)
    assert toks == [600, 601, 602] and p.source == Source.SUFFIX  # both certain for 3: the live one
    # live: the last 2 tokens matched, with two different continuations; store: 5 matched, certain
    live = [1, G[3], G[4], 600, 2, G[3], G[4], 601, 3, G[2], G[3], G[4]]
    p, toks = drafted(live, k=3, store=store)
    assert toks == G[5:8] and p.source == "store" and p.scores == [1.0] * 3


def test_a_new_generation_is_seen_by_the_next_one(store):
    d = SuffixDrafter(DraftParams(max=4), store=store)
    d.prepare([1, 2] + G[:4])
    assert d.draft([1, 2] + G[:4], 4).tokens == []
    store.add([7, 7], G)
    d.prepare([1, 2] + G[:4])
    assert d.draft([1, 2] + G[:4], 4).tokens == G[4:8]


def test_a_store_never_drafts_for_another_tokenizer(tmp_path):
    a = SuffixStore(tmp_path / "s", "qwen-151936")
    a.add([], G)
    b = SuffixStore(tmp_path / "s", "smollm-49152")
    assert b.n_generations == 0 and b.segments == ()
    _, toks = drafted([500] + G[:6], k=4, store=b)
    assert toks == []
    # a's file under b's name (copied by hand): its header names a's tokenizer, so b sets it aside
    os.replace(a.base_path if a.base_path.exists() else a.tail_path, b.tail_path)
    b2 = SuffixStore(tmp_path / "s", "smollm-49152")
    assert b2.n_generations == 0 and list((tmp_path / "s").glob("*.corrupt-*"))
    assert tokenizer_fingerprint(151936, ["a", "b"]) == tokenizer_fingerprint(151936, [b"a", b"b"])
    assert tokenizer_fingerprint(151936, ["a", "b"]) != tokenizer_fingerprint(151935, ["a", "b"])
    assert tokenizer_fingerprint(151936, ["ab", ""]) != tokenizer_fingerprint(151936, ["a", "b"])


# ---- the store: bounds, dedupe, files -----------------------------------------------------------
def gen(i, n=300):
    return np.random.default_rng(i).integers(0, 50_000, n).tolist()


def test_eviction_keeps_the_newest_generations_within_the_cap(tmp_path, caplog):
    cap = 128 * 1024
    s = SuffixStore(tmp_path / "s", "fp", max_bytes=cap, tail_max_tokens=1500)
    added = []
    with caplog.at_level(logging.INFO, logger="speclocal.suffix_store"):
        for i in range(60):  # 60 x 300 tokens, ~10 bytes a token on disk: about 180 KB without eviction
            s.add([], gen(i))
            added.append(gen(i))
            assert s.bytes_on_disk <= cap
    kept = s.generations()
    assert 0 < len(kept) < 60 and kept == added[-len(kept):]  # the newest, in order
    assert s.base_path.stat().st_size == s._base.size_on_disk()  # the size the cap check reckons with
    assert "evicting" in caplog.text
    assert SuffixStore(tmp_path / "s", "fp", max_bytes=cap).generations() == kept
    big = SuffixStore(tmp_path / "t", "fp", max_bytes=64 * 1024)
    big.add([], gen(99, 20_000))  # one generation over the cap on its own: its end is kept
    assert big.bytes_on_disk <= 64 * 1024 and big.generations()[0] == gen(99, 20_000)[-len(big.generations()[0]):]


def test_a_chat_turn_stores_only_what_is_new(store):
    p1, o1 = [1, 2, 3] + gen(1, 50), gen(2, 40)
    store.add(p1, o1)
    p2 = p1 + o1 + [9, 9] + gen(3, 20)  # the next prompt re-sends the conversation
    assert store.add(p2, gen(4, 30)) == 2 + 20 + 30
    assert store.generations() == [p1 + o1, [9, 9] + gen(3, 20) + gen(4, 30)]
    assert store.add([], []) == 0 and store.n_generations == 2


def test_files_are_user_only(tmp_path):
    old = os.umask(0)
    try:
        s = SuffixStore(tmp_path / "deep" / "store", "fp", tail_max_tokens=100)
        s.add([], gen(1))
        s.add([], gen(2))  # over the tail limit: a base is written too
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "deep" / "store").st_mode) == 0o700
    files = list((tmp_path / "deep" / "store").iterdir())
    assert {p.suffix for p in files} == {".base", ".tail", ".lock"}
    assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o600 for p in files)


def test_a_failed_write_leaves_the_old_store(store, monkeypatch):
    store.add([], gen(1))
    before = store.generations()

    class Boom(Exception):
        pass

    def failing_replace(src, dst):
        raise Boom

    monkeypatch.setattr(store_module.os, "replace", failing_replace)
    with pytest.raises(Boom):
        store.add([], gen(2))
    monkeypatch.undo()
    assert not list(store.directory.glob("*.tmp"))  # the temp file went with the failure
    assert SuffixStore(store.directory, "fp-qwen").generations() == before


def _flip(path: Path, offset: int) -> None:
    b = bytearray(path.read_bytes())
    b[offset] ^= 0x40
    path.write_bytes(bytes(b))


@pytest.mark.parametrize("damage", ["garbage", "empty", "truncated", "magic", "header", "array", "text"])
def test_a_corrupt_store_is_set_aside_and_rebuilt(tmp_path, caplog, damage):
    s = SuffixStore(tmp_path / "s", "fp", tail_max_tokens=100)
    s.add([], gen(1))
    s.add([], gen(2))  # now in the base
    path = s.base_path
    original = path.read_bytes()
    if damage == "garbage":
        path.write_bytes(b"\x00not a store" * 500)
    elif damage == "empty":
        path.write_bytes(b"")
    elif damage == "truncated":
        path.write_bytes(original[: len(original) // 2])
    elif damage == "magic":
        _flip(path, 0)
    elif damage == "header":
        _flip(path, 40)
    elif damage == "array":
        _flip(path, file_format.HEADER_BYTES + 8)  # in the text
    elif damage == "text":  # valid checksums, impossible content: a separator missing
        rec, _ = file_format.read_store_file(path, "fp")
        text = np.array(rec.text)
        text[int(rec.gen_start[1]) - 1] = 5
        bad = file_format.Records(text, *[np.array(getattr(rec, f)) for f in
                                  ("gen_seq", "gen_start", "gen_len", "gen_time", "gen_full_len", "gen_full_hash",
                                   "sa", "first_tokens", "first_starts")])
        file_format.write_store_file(path, "base", "fp", bad)
    damaged = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="speclocal.suffix_store"):
        s2 = SuffixStore(tmp_path / "s", "fp")
    assert s2.n_generations == 0 and "set aside" in caplog.text
    aside = list((tmp_path / "s").glob("*.base.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == damaged  # nothing lost
    s2.add([], gen(3))
    assert SuffixStore(tmp_path / "s", "fp").generations() == [gen(3)]


WRITER = textwrap.dedent("""
    import os, sys, numpy as np
    from pathlib import Path
    from speclocal import files
    from speclocal.engine.store import store as ss
    directory, start, kill_at = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    def gen(i, n=3000):
        return np.random.default_rng(i).integers(0, 50_000, n).tolist()
    s = ss.SuffixStore(directory, "fp", max_bytes=400_000, tail_max_tokens=10_000)
    if kill_at != "none":
        real_write, real_replace, real_fsync = ss.write_store_file, os.replace, os.fsync
        calls = {"write": 0}
        def die(*a, **k):
            os._exit(9)
        if kill_at == "before-fsync":       # temp file partly written
            os.fsync = die
        elif kill_at == "before-rename":    # temp file complete, not yet renamed
            ss.os.replace = lambda a, b: die()
        elif kill_at == "after-rename":     # renamed, directory not yet fsynced
            files.fsync_dir = die
        elif kill_at == "between-base-and-tail":  # compaction wrote the base, not the empty tail
            def write(path, kind, *a):
                if kind == "tail" and calls["write"] == 1:
                    die()
                calls["write"] += kind == "base"
                return real_write(path, kind, *a)
            ss.write_store_file = write
    i = start
    while True:
        s.add([], gen(i))
        print(i, flush=True)
        i += 1
""")


def _run_writer(directory, start, kill_at="none", **kw):
    env = dict(os.environ, PYTHONPATH=APP)
    return subprocess.Popen([sys.executable, "-c", WRITER, str(directory), str(start), kill_at], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _check_readable(directory, added_upto):
    s = SuffixStore(directory, "fp", max_bytes=400_000)
    assert not list(Path(directory).glob("*.corrupt-*"))
    got = s.generations()
    ids = []
    for g in got:  # every stored generation is one that was added, each once, in order
        i = next(i for i in range(added_upto + 1) if np.random.default_rng(i).integers(0, 50_000, 3000).tolist() == g)
        ids.append(i)
    assert ids == sorted(set(ids))
    return ids


@pytest.mark.parametrize("kill_at", ["before-fsync", "before-rename", "after-rename", "between-base-and-tail"])
def test_a_kill_at_each_point_of_a_write_leaves_a_readable_store(tmp_path, kill_at):
    d = tmp_path / "s"
    p = _run_writer(d, 0)
    for line in p.stdout:  # a few generations, including a compaction
        if int(line) >= 4:
            break
    p.kill()
    p.wait()
    before = _check_readable(d, 10)
    assert before
    p = _run_writer(d, 20, kill_at)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 9, err  # it died where it was told to
    left = list(d.glob("*.tmp"))
    assert bool(left) == (kill_at in ("before-fsync", "before-rename"))  # a temp file, never the store
    after = _check_readable(d, 40)
    assert set(before) <= set(after) <= set(before) | set(range(20, 40))  # old, or old + new: never less
    if kill_at == "after-rename":
        assert after[-1] == 20  # the rename happened: the new store
    if kill_at in ("before-fsync", "before-rename"):
        assert after == before
    s = SuffixStore(d, "fp", max_bytes=400_000)
    s.add([], gen(1234))  # and it goes on (the killed writer's temp file is cleaned up)
    assert not list(d.glob("*.tmp")) and s.generations()[-1] == gen(1234)


def test_sigkill_at_random_moments_never_loses_the_store(tmp_path):
    d = tmp_path / "s"
    rng = np.random.default_rng(7)
    start, seen = 0, []
    for _ in range(5):
        p = _run_writer(d, start)
        first = p.stdout.readline()  # it has started and added one
        time.sleep(float(rng.uniform(0, 0.5)))  # then a few more adds and compactions
        p.send_signal(signal.SIGKILL)
        out, _ = p.communicate()
        done = [int(x) for x in (first + out).split()]
        ids = _check_readable(d, start + len(done) + 1)
        assert set(seen) - set(ids) <= set(range(min(ids, default=0)))  # only evictions of the oldest
        assert ids and ids[-1] >= (done[-1] if done else -1)  # what was reported added is there
        seen, start = ids, start + len(done) + 1


def test_two_processes_do_not_lose_each_others_generations(tmp_path):
    a = SuffixStore(tmp_path / "s", "fp")
    b = SuffixStore(tmp_path / "s", "fp")
    a.add([], gen(1))
    b.add([], gen(2))  # b reloads a's write before writing its own
    a.add([], gen(3))
    assert SuffixStore(tmp_path / "s", "fp").generations() == [gen(1), gen(2), gen(3)]
    assert b.reload_if_changed() and b.generations() == [gen(1), gen(2), gen(3)]
    assert not b.reload_if_changed()


def test_compaction_can_be_deferred(tmp_path):
    s = SuffixStore(tmp_path / "s", "fp", tail_max_tokens=500)
    for i in range(4):
        s.add([], gen(i), compact=False)
    assert s.needs_compaction and not s.base_path.exists() and s.compactions == 0
    s.compact()
    assert not s.needs_compaction and s.base_path.exists() and s.compactions == 1
    assert SuffixStore(tmp_path / "s", "fp").generations() == [gen(i) for i in range(4)]


# ---- cost: bounded per step, whatever the history ---------------------------------------------
def _replay(d, history, steps, rng):
    d.prepare(history)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        d.draft(history, 16)
        times.append(time.perf_counter() - t0)
        history.extend(int(x) for x in rng.integers(0, 30, int(rng.integers(1, 4))))
    return float(np.median(times))


def test_per_step_cost_does_not_grow_with_the_history():
    rng = np.random.default_rng(0)
    base = rng.integers(0, 30, 100_000).tolist()  # a tiny vocabulary: long chains for every n-gram
    runs = {}
    for n in (1_000, 10_000, 100_000):
        d = SuffixDrafter(DraftParams())
        t = _replay(d, base[:n], 200, rng)
        runs[n] = (t, d.index.steps)
    budget = 200 * len(ContextIndex.RUNGS) * 4 * 64
    assert all(steps <= budget for _, steps in runs.values())  # the chain budget holds
    assert runs[100_000][1] < 1.3 * runs[10_000][1]  # 10x the history, the same chain work
    assert runs[100_000][0] < 3 * runs[1_000][0], runs  # median time in one run: same order, not 100x


def test_suffix_array_lookup_work_grows_with_log_of_the_store():
    rng = np.random.default_rng(1)
    ctx = np.asarray(rng.integers(0, 50, 40), dtype=np.int64)
    work = []
    for n in (10_000, 1_000_000):
        arr = SuffixArray(_text([rng.integers(0, 50, n).tolist()]))
        arr.match(ctx)
        work.append(arr.ops)
    assert work[1] < 3 * work[0]  # 100x the text: ~1.5x the binary-search steps (log 10^6 / log 10^4)
