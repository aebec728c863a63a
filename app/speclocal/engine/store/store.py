"""The store of earlier generations the `suffix` drafter draws on: per tokenizer, bounded, crash-safe.

On disk, in a directory of its own (0700; files 0600: it holds the user's prompts and outputs), one
tokenizer's store is two files named after a hash of its fingerprint:

* `suffix-<fp>.base`: most generations, with the text's suffix array (so loading is a memory map,
  not a sort);
* `suffix-<fp>.tail`: the generations added since, with their own (small) suffix array, rewritten
  at each `add`. When it outgrows `tail_max_tokens`, or the store outgrows `max_bytes`, the two are
  merged into a new base and the tail emptied: the oldest generations are evicted to 90 % of the cap
  (a filter of the base's suffix array) and the tail's sorted entries are merged in by binary search,
  so no merge re-sorts the store.

Both files have the same format (`file_format`). Every write goes to a temp file in the directory, is fsynced, renamed over the old one
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
import logging
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np

from speclocal.engine.store.file_format import (Records, StoreCorrupt, file_bytes, full_hash, read_store_file,
                                                write_store_file)
from speclocal.engine.store.suffix_array import SEPARATOR, SuffixArray
from speclocal.files import fsync_dir, set_aside

log = logging.getLogger("speclocal.suffix_store")

DEFAULT_MAX_BYTES = 50 * 2**20
DEFAULT_TAIL_MAX_TOKENS = 131_072
EVICT_TO = 0.9  # past the cap, evict down to this share of it (so eviction does not happen every add)
DEDUPE_LOOKBACK = 8  # how many of the latest generations a new prompt is checked against


def tokenizer_fingerprint(n_vocab: int, pieces: Iterable[bytes | str]) -> str:
    """A short stable id for a vocabulary: hash of its size and the given token texts (e.g. a few
    hundred spread over the id range). Stores are keyed by it so they never draft for another one."""
    h = hashlib.sha256(str(int(n_vocab)).encode())
    for p in pieces:
        b = p.encode("utf-8") if isinstance(p, str) else bytes(p)
        h.update(len(b).to_bytes(4, "little"))
        h.update(b)
    return h.hexdigest()[:32]



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
        self._base = Records.empty()
        self._tail = Records.empty()
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

    def _read(self, path: Path, kind: str) -> Records:
        try:
            rec, header = read_store_file(path, self.fingerprint, self.verify)
        except FileNotFoundError:
            return Records.empty()
        except (StoreCorrupt, OSError) as e:
            set_aside(path, str(e))
            return Records.empty()
        if header.get("kind") != kind:
            set_aside(path, f"a {header.get('kind')!r} file where a {kind!r} one belongs")
            return Records.empty()
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
            one = Records(np.concatenate([[SEPARATOR], new, [SEPARATOR]]).astype(np.int32),
                           np.asarray([seq], dtype=np.int64), np.asarray([1], dtype=np.int64),
                           np.asarray([len(new)], dtype=np.int64), np.asarray([time.time()]),
                           np.asarray([len(full)], dtype=np.int64),
                           np.asarray([full_hash(full)], dtype=np.uint64))
            tail = Records.merged(self._tail, one.index())  # sorts only the new generation
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
            self._base, self._tail = Records.empty(), Records.empty()
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
                if best < n <= n_prompt and full_hash(full[:n]) == int(rec.gen_full_hash[i]):
                    best = n
        return best

    def _compact(self, tail: Records) -> None:
        """Merge the (indexed) tail into the base, evicting the oldest generations past the cap."""
        base = self._base
        empty = Records.empty()
        room = self.max_bytes - empty.size_on_disk()  # the base's share: the cap less an empty tail
        both = Records.concat([base, tail])
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
            merged = Records.merged(base.drop_oldest(drop), tail)  # no re-sort
        else:  # eviction reaches into the tail (a cap smaller than one tail): select and sort
            merged = self._evict(both, int(self.max_bytes * EVICT_TO) - empty.size_on_disk()).index()
        write_store_file(self.base_path, "base", self.fingerprint, merged)
        write_store_file(self.tail_path, "tail", self.fingerprint, empty)
        self._base, self._tail = merged, empty
        self._ids = (self._file_id(self.base_path), self._file_id(self.tail_path))
        self.compactions += 1
        self._publish()

    @staticmethod
    def _projected(rec: Records) -> np.ndarray:
        """Upper bounds of the base file's size keeping the newest 1, 2, ... generations (the number of
        distinct tokens of all of them bounds any subset's first-token table)."""
        lens = rec.gen_len[::-1]
        toks = np.cumsum(lens)
        distinct = int(np.count_nonzero(np.bincount(rec.text[rec.text >= 0]))) if len(rec.text) else 0
        return np.array([file_bytes(int(t), g + 1, min(distinct, int(t))) for g, t in enumerate(toks)])

    def _evict(self, rec: Records, target: int) -> Records:
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
