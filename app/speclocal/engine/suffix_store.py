"""The store of earlier generations the `suffix` drafter draws on: per tokenizer, bounded, crash-safe.

On disk, in a directory of its own (0700; files 0600: it holds the user's prompts and outputs), one
tokenizer's store is two files named after a hash of its fingerprint:

* `suffix-<fp>.base`: most generations, with the text's suffix array (so loading is a memory map,
  not a sort);
* `suffix-<fp>.tail`: the generations added since, with their own (small) suffix array, rewritten
  at each `add`. When it outgrows `tail_max_tokens`, or the store outgrows `max_bytes`, the two are
  merged into a new base and the tail emptied: the oldest generations are evicted to 90 % of the cap
  (a filter of the base's suffix array) and the tail's sorted entries are merged in by binary search,
  so no merge re-sorts the store (0.35 s against 6.5 s for a full sort at 6.4M tokens here).

Both files have the same format: 8-byte magic, header length and CRC-32, a JSON header (padded to 4 KiB:
format version, the full fingerprint, each array's offset, dtype, length and CRC-32) and the arrays,
64-byte aligned. Every write goes to a temp file in the directory, is fsynced, renamed over the old one
and the directory fsynced, so a kill at any point leaves the old or the new file. Generations carry
increasing sequence numbers, so a kill between writing a merged base and emptying the tail (both hold
the same generations then) loads each generation once. Writers take an advisory lock (`.lock`, flock)
and first reload what another process may have written. A file that fails any check (magic, CRC,
fingerprint, structure) is renamed `<name>.corrupt-<time>` with a logged warning and the store goes on
without it, empty if need be.

A generation is stored as prompt + output, minus the part of the prompt that repeats an earlier stored
generation exactly (a chat's next turn re-sends the whole conversation): each one keeps the length and
a hash of its full token sequence for that check.
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import struct
import threading
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from speclocal.files import atomic_write, fsync_dir, set_aside


log = logging.getLogger("speclocal.suffix_store")

SA_DEPTH = 32  # suffix arrays are sorted by the first 32 tokens of each (reversed) suffix; deeper: compared
SEPARATOR = -1  # between generations in a store's text; never equals a token id, so no match crosses it

DEFAULT_MAX_BYTES = 50 * 2**20
DEFAULT_TAIL_MAX_TOKENS = 131_072
MAGIC = b"SPLSUFX\x00"
FORMAT_VERSION = 1
HEADER_BYTES = 4096  # magic + lengths + JSON, zero-padded: file sizes are exact sums of array sizes
ALIGN = 64
EVICT_TO = 0.9  # past the cap, evict down to this share of it (so eviction does not happen every add)
DEDUPE_LOOKBACK = 8  # how many of the latest generations a new prompt is checked against
_ARRAYS = (("text", "<i4"), ("sa", "<i4"), ("first_tokens", "<i4"), ("first_starts", "<i8"),
           ("gen_seq", "<i8"), ("gen_start", "<i8"), ("gen_len", "<i8"), ("gen_time", "<f8"),
           ("gen_full_len", "<i8"), ("gen_full_hash", "<u8"))


def tokenizer_fingerprint(n_vocab: int, pieces: Iterable[bytes | str]) -> str:
    """A short stable id for a vocabulary: hash of its size and the given token texts (e.g. a few
    hundred spread over the id range). Stores are keyed by it so they never draft for another one."""
    h = hashlib.sha256(str(int(n_vocab)).encode())
    for p in pieces:
        b = p.encode("utf-8") if isinstance(p, str) else bytes(p)
        h.update(len(b).to_bytes(4, "little"))
        h.update(b)
    return h.hexdigest()[:32]


class StoreCorrupt(Exception):
    pass


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def file_bytes(n_tokens: int, n_gens: int, n_first: int) -> int:
    """The exact size of a store file holding n_tokens tokens in n_gens generations, n_first of them
    distinct (text: tokens + separators; suffix array: tokens; first-token table; per generation)."""
    n_text = n_tokens + n_gens + 1 if n_gens else 0
    return (HEADER_BYTES + _align(4 * n_text) + _align(4 * n_tokens) + _align(4 * n_first)
            + _align(8 * (n_first + 1)) + 6 * _align(8 * n_gens))


def _full_hash(tokens: Sequence[int] | np.ndarray) -> int:
    b = np.asarray(tokens, dtype="<i4").tobytes()
    return int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little")


# ---------------------------------------------------------------------------------------------
# Matches: where the recent tokens occurred before, and with what weight
# ---------------------------------------------------------------------------------------------
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
        return _sample_range(self.sa, lo, hi, cap)


def _sample_range(sa: np.ndarray, lo: int, hi: int, cap: int) -> tuple[np.ndarray, float]:
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


# ---------------------------------------------------------------------------------------------
# Earlier generations: a suffix array of the reversed text
# ---------------------------------------------------------------------------------------------
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
        rows, w = _sample_range(self.sa, lo, hi, small)
        ml = match_lengths(self.text, rows, ctx_rev)
        keep = ml >= min_match
        if not keep.any():
            return None
        return Match(self.text, rows[keep], ml[keep], w, j, ranges[: j - 1], self.sa)


@dataclass
class _Records:
    """Generations as one text: [SEP, g1..., SEP, g2..., SEP]; gen_start[i] indexes g_i's first token."""

    text: np.ndarray
    gen_seq: np.ndarray
    gen_start: np.ndarray
    gen_len: np.ndarray
    gen_time: np.ndarray
    gen_full_len: np.ndarray
    gen_full_hash: np.ndarray
    sa: np.ndarray | None = None
    first_tokens: np.ndarray | None = None
    first_starts: np.ndarray | None = None

    @staticmethod
    def empty() -> "_Records":
        z = np.zeros(0, dtype=np.int64)
        return _Records(np.zeros(0, dtype=np.int32), z, z, z, np.zeros(0), z, np.zeros(0, dtype=np.uint64),
                        np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64))

    @property
    def n_gens(self) -> int:
        return len(self.gen_seq)

    @property
    def n_tokens(self) -> int:
        return int(self.gen_len.sum()) if len(self.gen_len) else 0

    @property
    def last_seq(self) -> int:
        return int(self.gen_seq[-1]) if len(self.gen_seq) else 0

    def tokens_of(self, i: int) -> np.ndarray:
        s = int(self.gen_start[i])
        return self.text[s : s + int(self.gen_len[i])]

    def select(self, keep: np.ndarray) -> "_Records":
        """The generations at indices `keep` (in order), as a new text (no suffix array yet)."""
        if len(keep) == 0:
            return _Records.empty()
        pieces = [np.asarray([SEPARATOR], dtype=np.int32)]
        starts = []
        pos = 1
        for i in keep:
            t = self.tokens_of(int(i))
            starts.append(pos)
            pieces.append(np.asarray(t, dtype=np.int32))
            pieces.append(np.asarray([SEPARATOR], dtype=np.int32))
            pos += len(t) + 1
        k = np.asarray(keep, dtype=np.int64)
        return _Records(np.concatenate(pieces), self.gen_seq[k].copy(), np.asarray(starts, dtype=np.int64),
                        self.gen_len[k].copy(), self.gen_time[k].copy(), self.gen_full_len[k].copy(),
                        self.gen_full_hash[k].copy())

    @staticmethod
    def concat(parts: list["_Records"]) -> "_Records":
        """The generations of all parts, in order, as one text (one copy; no suffix array yet)."""
        parts = [p for p in parts if p.n_gens]
        if not parts:
            return _Records.empty()
        if len(parts) == 1:
            p = parts[0]
            return _Records(p.text, p.gen_seq, p.gen_start, p.gen_len, p.gen_time, p.gen_full_len, p.gen_full_hash)
        texts, starts, shift = [parts[0].text[:1]], [], 0
        for p in parts:
            texts.append(p.text[1:])  # each part's leading separator: the previous part's last one serves
            starts.append(p.gen_start + shift)
            shift += len(p.text) - 1
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
        return _Records(np.concatenate(texts), cat("gen_seq"), np.concatenate(starts), cat("gen_len"),
                        cat("gen_time"), cat("gen_full_len"), cat("gen_full_hash"))

    @staticmethod
    def of(generations: list[Sequence[int]], first_seq: int = 1, when: float | None = None) -> "_Records":
        """Records for token lists (tests, benchmarks, imports): consecutive sequence numbers."""
        gens = [np.asarray(g, dtype=np.int32) for g in generations if len(g)]
        if not gens:
            return _Records.empty()
        lens = np.asarray([len(g) for g in gens], dtype=np.int64)
        sep = np.asarray([SEPARATOR], dtype=np.int32)
        text = np.concatenate([sep] + [x for g in gens for x in (g, sep)])
        starts = 1 + np.concatenate([[0], np.cumsum(lens + 1)[:-1]])
        n = len(gens)
        return _Records(text, np.arange(first_seq, first_seq + n, dtype=np.int64), starts.astype(np.int64), lens,
                        np.full(n, time.time() if when is None else when), lens.copy(),
                        np.asarray([_full_hash(g) for g in gens], dtype=np.uint64))

    def index(self) -> "_Records":
        """Build the suffix array and first-token table (in place); returns self."""
        self.sa = build_suffix_array(self.text, SA_DEPTH)
        self.first_tokens, self.first_starts = first_token_table(self.text, self.sa)
        return self

    def drop_oldest(self, n: int) -> "_Records":
        """Without its n oldest generations, suffix array included: a filter and a shift, no sort (the
        remaining entries keep their order; what they saw past the cut lies beyond a separator)."""
        if n >= self.n_gens:
            return _Records.empty()
        if n == 0:
            return self
        cut = int(self.gen_start[n]) - 1  # the separator before the first kept generation
        sa = self.sa[self.sa > cut] - cut
        out = _Records(self.text[cut:], self.gen_seq[n:], self.gen_start[n:] - cut, self.gen_len[n:],
                       self.gen_time[n:], self.gen_full_len[n:], self.gen_full_hash[n:], sa.astype(np.int32))
        out.first_tokens, out.first_starts = first_token_table_from_text(out.text)
        return out

    @staticmethod
    def merged(old: "_Records", new: "_Records") -> "_Records":
        """Both (indexed) as one indexed text, new after old, by merging their suffix arrays."""
        if new.n_gens == 0:
            return old
        if old.n_gens == 0:
            return new
        out = _Records.concat([old, new])
        out.sa = merge_suffix_arrays(old.text, old.sa, new.text, new.sa)
        out.first_tokens, out.first_starts = first_token_table_from_text(out.text)
        return out

    def size_on_disk(self) -> int:
        return file_bytes(self.n_tokens, self.n_gens, len(self.first_tokens) if self.first_tokens is not None else 0)

    def segment(self) -> SuffixArray | None:
        if self.n_gens == 0:
            return None
        return SuffixArray(self.text, self.sa, SA_DEPTH, first=(self.first_tokens, self.first_starts))


# ---------------------------------------------------------------------------------------------
# File format
# ---------------------------------------------------------------------------------------------
def _encode_header(kind: str, fingerprint: str, rec: _Records) -> tuple[bytes, list[np.ndarray]]:
    arrays, meta, off = [], {}, HEADER_BYTES
    for name, dtype in _ARRAYS:
        a = np.ascontiguousarray(getattr(rec, name), dtype=dtype)
        meta[name] = {"offset": off, "dtype": dtype, "count": int(a.size), "crc32": zlib.crc32(a.data)}
        arrays.append(a)
        off += _align(a.nbytes)
    header = {"format": "speclocal-suffix-store", "version": FORMAT_VERSION, "kind": kind,
              "fingerprint": fingerprint, "sa_depth": SA_DEPTH, "written": time.time(),
              "n_generations": rec.n_gens, "n_tokens": rec.n_tokens, "last_seq": rec.last_seq,
              "file_bytes": off, "arrays": meta}
    body = json.dumps(header, separators=(",", ":")).encode()
    if 16 + len(body) > HEADER_BYTES:
        raise ValueError("store header too long")
    head = MAGIC + struct.pack("<II", len(body), zlib.crc32(body)) + body
    return head + b"\0" * (HEADER_BYTES - len(head)), arrays


def write_store_file(path: Path, kind: str, fingerprint: str, rec: _Records) -> int:
    """Atomically replace `path` with `rec` (temp file in the same directory, fsync, rename, fsync the
    directory). Returns the file's size. The temp file is removed if anything fails."""
    head, arrays = _encode_header(kind, fingerprint, rec)

    def chunks():
        yield head
        for a in arrays:
            yield a.data
            pad = _align(a.nbytes) - a.nbytes
            if pad:
                yield b"\0" * pad

    return atomic_write(path, chunks(), mode=0o600)


def read_store_file(path: Path, fingerprint: str, verify: bool = True) -> tuple[_Records, dict]:
    """Map `path` and check it; raises FileNotFoundError or StoreCorrupt (with the reason)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < HEADER_BYTES:
            raise StoreCorrupt(f"{size} bytes, shorter than a header")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if mm[:8] != MAGIC:
        raise StoreCorrupt("not a speclocal suffix store (bad magic)")
    n, crc = struct.unpack("<II", mm[8:16])
    if n > HEADER_BYTES - 16:
        raise StoreCorrupt("header length out of range")
    body = mm[16 : 16 + n]
    if zlib.crc32(body) != crc:
        raise StoreCorrupt("header checksum mismatch")
    try:
        header = json.loads(body)
        if header.get("format") != "speclocal-suffix-store" or header.get("version") != FORMAT_VERSION:
            raise StoreCorrupt(f"unknown format/version {header.get('format')!r} {header.get('version')!r}")
        if header.get("fingerprint") != fingerprint:
            raise StoreCorrupt("written for another tokenizer (fingerprint mismatch)")
        if header.get("file_bytes") != size:
            raise StoreCorrupt(f"size {size} != recorded {header.get('file_bytes')}")
        arrays = {}
        for name, dtype in _ARRAYS:
            m = header["arrays"][name]
            if m["dtype"] != dtype:
                raise StoreCorrupt(f"{name}: dtype {m['dtype']!r}")
            count, off = int(m["count"]), int(m["offset"])
            nbytes = count * np.dtype(dtype).itemsize
            if off < HEADER_BYTES or off + nbytes > size or count < 0:
                raise StoreCorrupt(f"{name}: out of bounds")
            a = np.frombuffer(mm, dtype=dtype, count=count, offset=off)
            if verify and zlib.crc32(a.data) != m["crc32"]:
                raise StoreCorrupt(f"{name}: checksum mismatch")
            arrays[name] = a
    except (KeyError, TypeError, ValueError) as e:
        raise StoreCorrupt(f"bad header: {e}") from None
    rec = _Records(**arrays)
    _check_structure(rec, header)
    return rec, header


def _check_structure(rec: _Records, header: dict) -> None:
    g = rec.n_gens
    if not (len(rec.gen_start) == len(rec.gen_len) == len(rec.gen_time) == len(rec.gen_full_len)
            == len(rec.gen_full_hash) == g):
        raise StoreCorrupt("generation tables differ in length")
    if g == 0:
        if len(rec.text) or len(rec.sa):
            raise StoreCorrupt("text without generations")
        return
    n_tok = rec.n_tokens
    if len(rec.text) != n_tok + g + 1 or len(rec.sa) != n_tok:
        raise StoreCorrupt("text or suffix array length does not match the generations")
    if np.any(np.diff(rec.gen_seq) <= 0) or np.any(rec.gen_len <= 0):
        raise StoreCorrupt("generation sequence numbers or lengths out of order")
    ends = rec.gen_start + rec.gen_len
    if rec.gen_start[0] != 1 or np.any(rec.gen_start[1:] != ends[:-1] + 1) or ends[-1] != len(rec.text) - 1:
        raise StoreCorrupt("generation offsets inconsistent")
    if np.any(rec.text[rec.gen_start - 1] != SEPARATOR) or rec.text[-1] != SEPARATOR:
        raise StoreCorrupt("separators missing")
    if int(rec.sa.min()) < 0 or int(rec.sa.max()) >= len(rec.text):
        raise StoreCorrupt("suffix array entry out of range")
    if header.get("sa_depth") != SA_DEPTH:
        rec.index()  # a store sorted to another depth: re-sort it (not damage)
    if len(rec.first_starts) != len(rec.first_tokens) + 1 or int(rec.first_starts[-1]) != len(rec.sa):
        raise StoreCorrupt("first-token table inconsistent")


# ---------------------------------------------------------------------------------------------
# The store
# ---------------------------------------------------------------------------------------------
class SuffixStore:
    """Earlier generations for one tokenizer, in `directory` (created 0700; pass a directory of its
    own). `fingerprint` identifies the tokenizer (e.g. `tokenizer_fingerprint`): a store is
    only ever read back by the same fingerprint. `max_bytes` caps the files on disk (the oldest
    generations go first). Thread-safe; several processes may share a directory."""

    def __init__(self, directory: Path, fingerprint: str, max_bytes: int = DEFAULT_MAX_BYTES, *,
                 tail_max_tokens: int = DEFAULT_TAIL_MAX_TOKENS, verify: bool = True):
        if not fingerprint:
            raise ValueError("a store needs the tokenizer's fingerprint")
        if max_bytes < 64 * 1024:
            raise ValueError(f"max_bytes {max_bytes} is too small for a store")
        self.directory = Path(directory)
        self.fingerprint = fingerprint
        self.max_bytes = int(max_bytes)
        self.tail_max_tokens = int(tail_max_tokens)
        self.verify = verify
        stem = "suffix-" + hashlib.sha256(fingerprint.encode()).hexdigest()[:16]
        self.base_path = self.directory / f"{stem}.base"
        self.tail_path = self.directory / f"{stem}.tail"
        self.lock_path = self.directory / f"{stem}.lock"
        self._stem = stem
        self._mutex = threading.Lock()
        self._ensure_dir()
        self._base = _Records.empty()
        self._tail = _Records.empty()
        self._ids: tuple = (None, None)  # (base, tail) file identities as last read or written
        self._segments: tuple[SuffixArray, ...] = ()
        self.last_add_s = 0.0  # wall time of the last add (compaction included): for reports
        self.compactions = 0
        self._load()

    # ---- reading ---------------------------------------------------------------------------
    @property
    def segments(self) -> tuple[SuffixArray, ...]:
        """The searchable texts, newest first (tail, base); a snapshot: adds swap in new ones."""
        return self._segments

    @property
    def n_generations(self) -> int:
        return self._base.n_gens + self._tail.n_gens

    @property
    def n_tokens(self) -> int:
        return self._base.n_tokens + self._tail.n_tokens

    @property
    def bytes_on_disk(self) -> int:
        total = 0
        for p in (self.base_path, self.tail_path):
            try:
                total += p.stat().st_size
            except FileNotFoundError:
                pass
        return total

    def generations(self) -> list[list[int]]:
        """Every stored generation's tokens, oldest first (for inspection and tests)."""
        out = []
        for rec in (self._base, self._tail):
            out.extend(rec.tokens_of(i).tolist() for i in range(rec.n_gens))
        return out

    def _ensure_dir(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(self.directory, 0o700)

    def _file_id(self, path: Path):
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _read(self, path: Path, kind: str) -> _Records:
        try:
            rec, header = read_store_file(path, self.fingerprint, self.verify)
        except FileNotFoundError:
            return _Records.empty()
        except (StoreCorrupt, OSError) as e:
            set_aside(path, str(e))
            return _Records.empty()
        if header.get("kind") != kind:
            set_aside(path, f"a {header.get('kind')!r} file where a {kind!r} one belongs")
            return _Records.empty()
        return rec

    def _load(self) -> None:
        """Read base and tail (again if the base changed meanwhile: another process merged them)."""
        for _ in range(3):
            base_id = self._file_id(self.base_path)
            base = self._read(self.base_path, "base")
            tail_id = self._file_id(self.tail_path)
            tail = self._read(self.tail_path, "tail")
            if self._file_id(self.base_path) == base_id:
                break
        if tail.n_gens and base.n_gens and tail.gen_seq[0] <= base.last_seq:
            keep = np.flatnonzero(tail.gen_seq > base.last_seq)  # merged into the base already
            tail = tail.select(keep).index()
        self._base, self._tail = base, tail
        self._ids = (base_id, tail_id)
        self._publish()

    def _publish(self) -> None:
        segs = [s for s in (self._tail.segment(), self._base.segment()) if s is not None]
        self._segments = tuple(segs)

    def reload_if_changed(self) -> bool:
        """Pick up what another process wrote; True if anything changed."""
        with self._mutex:
            if (self._file_id(self.base_path), self._file_id(self.tail_path)) == self._ids:
                return False
            self._load()
            return True

    # ---- writing ---------------------------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        with self._mutex:
            self._ensure_dir()
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                try:
                    import fcntl

                    fcntl.flock(fd, fcntl.LOCK_EX)
                except ImportError:  # no flock (Windows): one process at a time is the caller's job
                    pass
                for stale in self.directory.glob(f"{self._stem}.*.tmp"):  # a killed writer's temp files
                    try:
                        stale.unlink()
                    except OSError:
                        pass
                if (self._file_id(self.base_path), self._file_id(self.tail_path)) != self._ids:
                    self._load()
                yield
            finally:
                os.close(fd)  # releases the flock

    @property
    def needs_compaction(self) -> bool:
        """The tail has outgrown `tail_max_tokens` (adds made with compact=False)."""
        return self._tail.n_tokens > self.tail_max_tokens

    def add(self, prompt: Sequence[int], output: Sequence[int], compact: bool = True) -> int:
        """Append a finished generation (prompt + output; the prompt's part that repeats one of the
        latest stored generations is left out). Visible to the next `segments`. Returns the number of
        tokens stored. When the tail outgrows `tail_max_tokens` the add merges it into the base (a sort
        of the whole store: seconds for millions of tokens); `compact=False` defers that to a later
        `compact()` (the cap on disk is still kept: past it, the add compacts anyway)."""
        t0 = time.perf_counter()
        full = np.asarray(list(prompt) + list(output), dtype=np.int64)
        if len(full) == 0:
            return 0
        if full.min() < 0 or full.max() >= 2**31 - 1:
            raise ValueError("token ids must be in [0, 2**31 - 1)")
        full = full.astype(np.int32)
        with self._locked():
            skip = self._repeated_prefix(full, len(prompt))
            new = full[skip:]
            if len(new) == 0:
                return 0
            seq = max(self._base.last_seq, self._tail.last_seq) + 1
            one = _Records(np.concatenate([[SEPARATOR], new, [SEPARATOR]]).astype(np.int32),
                           np.asarray([seq], dtype=np.int64), np.asarray([1], dtype=np.int64),
                           np.asarray([len(new)], dtype=np.int64), np.asarray([time.time()]),
                           np.asarray([len(full)], dtype=np.int64),
                           np.asarray([_full_hash(full)], dtype=np.uint64))
            tail = _Records.merged(self._tail, one.index())  # sorts only the new generation
            if ((compact and tail.n_tokens > self.tail_max_tokens)
                    or self._base_file_size() + tail.size_on_disk() > self.max_bytes):
                self._compact(tail)
            else:
                write_store_file(self.tail_path, "tail", self.fingerprint, tail)
                self._tail = tail
                self._ids = (self._ids[0], self._file_id(self.tail_path))
                self._publish()
        self.last_add_s = time.perf_counter() - t0
        return len(new)

    def compact(self) -> None:
        """Merge the tail into the base now (evicting the oldest generations past the cap)."""
        with self._locked():
            self._compact(self._tail)

    def clear(self) -> None:
        """Forget everything (delete both files)."""
        with self._locked():
            for p in (self.base_path, self.tail_path):
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass
            fsync_dir(self.directory)
            self._base, self._tail = _Records.empty(), _Records.empty()
            self._ids = (None, None)
            self._publish()

    def _base_file_size(self) -> int:
        return self._base.size_on_disk() if self._base.n_gens else 0

    def _repeated_prefix(self, full: np.ndarray, n_prompt: int) -> int:
        """Length of the longest of the latest stored generations' full sequences (prompt + output)
        that the new prompt starts with; 0 if none."""
        best = 0
        seen = 0
        for rec in (self._tail, self._base):
            for i in range(rec.n_gens - 1, -1, -1):
                if seen >= DEDUPE_LOOKBACK:
                    return best
                seen += 1
                n = int(rec.gen_full_len[i])
                if best < n <= n_prompt and _full_hash(full[:n]) == int(rec.gen_full_hash[i]):
                    best = n
        return best

    def _compact(self, tail: _Records) -> None:
        """Merge the (indexed) tail into the base, evicting the oldest generations past the cap."""
        base = self._base
        empty = _Records.empty()
        room = self.max_bytes - empty.size_on_disk()  # the base's share: the cap less an empty tail
        both = _Records.concat([base, tail])
        drop = 0
        if both.n_gens and self._projected(both)[-1] > room:
            fit = int(np.searchsorted(self._projected(both), int(self.max_bytes * EVICT_TO) - empty.size_on_disk(),
                                      side="right"))
            drop = both.n_gens - fit
            log.info("suffix store %s: evicting %d oldest generation(s) to stay under %d bytes",
                     self.base_path.name, drop, self.max_bytes)
        if both.n_gens == 0:
            merged = empty
        elif drop < base.n_gens or (drop == base.n_gens and tail.n_gens):
            merged = _Records.merged(base.drop_oldest(drop), tail)  # no re-sort
        else:  # eviction reaches into the tail (a cap smaller than one tail): select and sort
            merged = self._evict(both, int(self.max_bytes * EVICT_TO) - empty.size_on_disk()).index()
        write_store_file(self.base_path, "base", self.fingerprint, merged)
        write_store_file(self.tail_path, "tail", self.fingerprint, empty)
        self._base, self._tail = merged, empty
        self._ids = (self._file_id(self.base_path), self._file_id(self.tail_path))
        self.compactions += 1
        self._publish()

    @staticmethod
    def _projected(rec: _Records) -> np.ndarray:
        """Upper bounds of the base file's size keeping the newest 1, 2, ... generations (the number of
        distinct tokens of all of them bounds any subset's first-token table)."""
        lens = rec.gen_len[::-1]
        toks = np.cumsum(lens)
        distinct = int(np.count_nonzero(np.bincount(rec.text[rec.text >= 0]))) if len(rec.text) else 0
        return np.array([file_bytes(int(t), g + 1, min(distinct, int(t))) for g, t in enumerate(toks)])

    def _evict(self, rec: _Records, target: int) -> _Records:
        """The newest generations whose file fits in `target` bytes (the newest one cut to its last
        tokens if it alone does not fit)."""
        sizes = self._projected(rec)
        fit = int(np.searchsorted(sizes, target, side="right"))
        if fit == 0:  # the newest alone is too big: keep its end (20 bytes a token at most)
            room = max(1, (target - file_bytes(0, 1, 0)) // 20)
            i = rec.n_gens - 1
            out = rec.select(np.asarray([i]))
            t = out.tokens_of(0)[-room:]
            out.text = np.concatenate([[SEPARATOR], t, [SEPARATOR]]).astype(np.int32)
            out.gen_len = np.asarray([len(t)], dtype=np.int64)
            log.info("suffix store %s: one generation of %d tokens exceeds the cap; keeping its last %d",
                     self.base_path.name, int(rec.gen_len[i]), len(t))
            return out
        return rec.select(np.arange(rec.n_gens - fit, rec.n_gens))
