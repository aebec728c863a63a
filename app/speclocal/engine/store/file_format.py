"""The store's on-disk form: generations as one text with per-generation tables (`Records`), and the file that
holds them: 8-byte magic, header length and CRC-32, a JSON header (padded to 4 KiB: format version, the full
fingerprint, each array's offset, dtype, length and CRC-32) and the arrays, 64-byte aligned."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from speclocal.engine.store.suffix_array import (SA_DEPTH, SEPARATOR, SuffixArray, build_suffix_array,
                                                 first_token_table, first_token_table_from_text,
                                                 merge_suffix_arrays)
from speclocal.files import atomic_write

MAGIC = b"SPLSUFX\x00"
FORMAT_VERSION = 1
HEADER_BYTES = 4096  # magic + lengths + JSON, zero-padded: file sizes are exact sums of array sizes
ALIGN = 64
_ARRAYS = (("text", "<i4"), ("sa", "<i4"), ("first_tokens", "<i4"), ("first_starts", "<i8"),
           ("gen_seq", "<i8"), ("gen_start", "<i8"), ("gen_len", "<i8"), ("gen_time", "<f8"),
           ("gen_full_len", "<i8"), ("gen_full_hash", "<u8"))


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


def full_hash(tokens: Sequence[int] | np.ndarray) -> int:
    b = np.asarray(tokens, dtype="<i4").tobytes()
    return int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little")


@dataclass
class Records:
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
    def empty() -> "Records":
        z = np.zeros(0, dtype=np.int64)
        return Records(np.zeros(0, dtype=np.int32), z, z, z, np.zeros(0), z, np.zeros(0, dtype=np.uint64),
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

    def select(self, keep: np.ndarray) -> "Records":
        """The generations at indices `keep` (in order), as a new text (no suffix array yet)."""
        if len(keep) == 0:
            return Records.empty()
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
        return Records(np.concatenate(pieces), self.gen_seq[k].copy(), np.asarray(starts, dtype=np.int64),
                        self.gen_len[k].copy(), self.gen_time[k].copy(), self.gen_full_len[k].copy(),
                        self.gen_full_hash[k].copy())

    @staticmethod
    def concat(parts: list["Records"]) -> "Records":
        """The generations of all parts, in order, as one text (one copy; no suffix array yet)."""
        parts = [p for p in parts if p.n_gens]
        if not parts:
            return Records.empty()
        if len(parts) == 1:
            p = parts[0]
            return Records(p.text, p.gen_seq, p.gen_start, p.gen_len, p.gen_time, p.gen_full_len, p.gen_full_hash)
        texts, starts, shift = [parts[0].text[:1]], [], 0
        for p in parts:
            texts.append(p.text[1:])  # each part's leading separator: the previous part's last one serves
            starts.append(p.gen_start + shift)
            shift += len(p.text) - 1
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
        return Records(np.concatenate(texts), cat("gen_seq"), np.concatenate(starts), cat("gen_len"),
                        cat("gen_time"), cat("gen_full_len"), cat("gen_full_hash"))

    @staticmethod
    def of(generations: list[Sequence[int]], first_seq: int = 1, when: float | None = None) -> "Records":
        """Records for token lists (tests, benchmarks, imports): consecutive sequence numbers."""
        gens = [np.asarray(g, dtype=np.int32) for g in generations if len(g)]
        if not gens:
            return Records.empty()
        lens = np.asarray([len(g) for g in gens], dtype=np.int64)
        sep = np.asarray([SEPARATOR], dtype=np.int32)
        text = np.concatenate([sep] + [x for g in gens for x in (g, sep)])
        starts = 1 + np.concatenate([[0], np.cumsum(lens + 1)[:-1]])
        n = len(gens)
        return Records(text, np.arange(first_seq, first_seq + n, dtype=np.int64), starts.astype(np.int64), lens,
                        np.full(n, time.time() if when is None else when), lens.copy(),
                        np.asarray([full_hash(g) for g in gens], dtype=np.uint64))

    def index(self) -> "Records":
        """Build the suffix array and first-token table (in place); returns self."""
        self.sa = build_suffix_array(self.text, SA_DEPTH)
        self.first_tokens, self.first_starts = first_token_table(self.text, self.sa)
        return self

    def drop_oldest(self, n: int) -> "Records":
        """Without its n oldest generations, suffix array included: a filter and a shift, no sort (the
        remaining entries keep their order; what they saw past the cut lies beyond a separator)."""
        if n >= self.n_gens:
            return Records.empty()
        if n == 0:
            return self
        cut = int(self.gen_start[n]) - 1  # the separator before the first kept generation
        sa = self.sa[self.sa > cut] - cut
        out = Records(self.text[cut:], self.gen_seq[n:], self.gen_start[n:] - cut, self.gen_len[n:],
                       self.gen_time[n:], self.gen_full_len[n:], self.gen_full_hash[n:], sa.astype(np.int32))
        out.first_tokens, out.first_starts = first_token_table_from_text(out.text)
        return out

    @staticmethod
    def merged(old: "Records", new: "Records") -> "Records":
        """Both (indexed) as one indexed text, new after old, by merging their suffix arrays."""
        if new.n_gens == 0:
            return old
        if old.n_gens == 0:
            return new
        out = Records.concat([old, new])
        out.sa = merge_suffix_arrays(old.text, old.sa, new.text, new.sa)
        out.first_tokens, out.first_starts = first_token_table_from_text(out.text)
        return out

    def size_on_disk(self) -> int:
        return file_bytes(self.n_tokens, self.n_gens, len(self.first_tokens) if self.first_tokens is not None else 0)

    def segment(self) -> SuffixArray | None:
        if self.n_gens == 0:
            return None
        return SuffixArray(self.text, self.sa, SA_DEPTH, first=(self.first_tokens, self.first_starts))



def _encode_header(kind: str, fingerprint: str, rec: Records) -> tuple[bytes, list[np.ndarray]]:
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


def write_store_file(path: Path, kind: str, fingerprint: str, rec: Records) -> int:
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


def read_store_file(path: Path, fingerprint: str, verify: bool = True) -> tuple[Records, dict]:
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
    rec = Records(**arrays)
    _check_structure(rec, header)
    return rec, header


def _check_structure(rec: Records, header: dict) -> None:
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

