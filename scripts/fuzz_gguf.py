#!/usr/bin/env python3
"""Fuzz speclocal's GGUF header reader with mutated headers derived from the real model files.

Every case must end as "ok" or as one clean SpeclocalError line, within a time and memory bound.
Usage: scripts/fuzz_gguf.py [--cases 100000] [--seed 0]   (records a summary; see docs/hardening.md)
The seeds are the real headers with every array cut short; the mutations target what a hostile header
can lie about (counts, types, lengths, version). tests/test_gguf_fuzz.py runs a few thousand cases of
the same mutations.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import re
import resource
import struct
import sys
import tempfile
import time
from pathlib import Path

from speclocal.errors import SpeclocalError
from speclocal.locations import models_dir
from speclocal.models import gguf_info
from speclocal.models.catalogue import load_catalogue

U32, U64 = struct.Struct("<I"), struct.Struct("<Q")
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
KEEP = 32  # array elements kept in a seed
EXTREMES = [0, 1, 7, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63, 2**64 - 1]


def _string(buf: bytes, pos: int) -> int:
    (n,) = U64.unpack_from(buf, pos)
    return pos + 8 + n


def _value_end(buf: bytes, pos: int, vtype: int) -> int:
    if vtype == STRING:
        return _string(buf, pos)
    if vtype in SCALAR_SIZES:
        return pos + SCALAR_SIZES[vtype]
    (itype,), (count,) = U32.unpack_from(buf, pos), U64.unpack_from(buf, pos + 4)
    pos += 12
    for _ in range(count) if itype == STRING else ():
        pos = _string(buf, pos)
    return pos if itype == STRING else pos + SCALAR_SIZES[itype] * count


def _shrunk_array(buf: bytes, pos: int) -> bytes:
    """An array value with only its first KEEP elements."""
    (itype,), (count,) = U32.unpack_from(buf, pos), U64.unpack_from(buf, pos + 4)
    keep = min(count, KEEP)
    body_start = pos + 12
    end = body_start
    for _ in range(keep):
        end = _string(buf, end) if itype == STRING else end + SCALAR_SIZES[itype]
    return U32.pack(itype) + U64.pack(keep) + buf[body_start:end]


def mini_seed(path: Path) -> bytes:
    """The real file's header with every array cut to its first 32 elements, and its tensor infos."""
    with open(path, "rb") as f:
        buf = f.read(16 * 2**20)
    (version,) = U32.unpack_from(buf, 4)
    (n_tensors,), (n_kv,) = U64.unpack_from(buf, 8), U64.unpack_from(buf, 16)
    pos, kvs = 24, []
    for _ in range(n_kv):
        key_end = _string(buf, pos)
        (vtype,) = U32.unpack_from(buf, key_end)
        vstart = key_end + 4
        vend = _value_end(buf, vstart, vtype)
        value = _shrunk_array(buf, vstart) if vtype == ARRAY else buf[vstart:vend]
        kvs.append(buf[pos:key_end] + U32.pack(vtype) + value)
        pos = vend
    tinfo_start = pos
    for _ in range(n_tensors):
        pos = _string(buf, pos)
        (n_dims,) = U32.unpack_from(buf, pos)
        pos += 4 + 8 * n_dims + 4 + 8
    return buf[:4] + U32.pack(version) + U64.pack(n_tensors) + U64.pack(n_kv) + b"".join(kvs) + buf[tinfo_start:pos]


OPS = ("flip", "extreme32", "extreme64", "truncate", "splice", "zero")

def mutate(seed: bytes, ops) -> bytes:
    data = bytearray(seed)
    for op, where, extreme, byte in ops:
        if not data:
            break
        i = where % len(data)
        if op == "flip":
            data[i] ^= byte or 1
        elif op == "extreme32":
            data[i : i + 4] = U32.pack(extreme & 0xFFFFFFFF)
        elif op == "extreme64":
            data[i : i + 8] = U64.pack(extreme)
        elif op == "truncate":
            del data[i:]
        elif op == "splice":  # duplicate a stretch: repeated keys, shifted fields
            j = (where // 7) % len(data)
            data[i:i] = data[j : j + byte]
        elif op == "zero":
            data[i : i + byte] = bytes(min(byte, len(data) - i))
    return bytes(data)


def check_one(path: Path, data: bytes, size: int = 0) -> str:
    """Write `data` to `path` (sparse-extended to `size`, the real file's, so that tensor data "fits")
    and read it; returns "ok" or the error line. Raises on anything unclean."""
    path.write_bytes(data)
    if size > len(data):
        os.truncate(path, size)
    st_ = path.stat()
    try:
        gguf_info._read_cached.__wrapped__(str(path), st_.st_size, st_.st_mtime_ns)
        return "ok"
    except SpeclocalError as e:
        msg = str(e)
        if "\n" in msg or not msg:
            raise AssertionError(f"error is not one clean line: {msg!r}") from None
        return msg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cat = load_catalogue()
    reals = [models_dir() / cat.model(m).file for m in ("qwen2.5-coder-0.5b-q4km", "smollm2-135m")]
    seeds = [(mini_seed(p), p.stat().st_size) for p in reals]
    outcomes: collections.Counter = collections.Counter()
    slowest = 0.0
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.gguf"
        for i in range(args.cases):
            seed, size = seeds[i % len(seeds)]
            ops = [(rng.choice(OPS), rng.randrange(2**31), rng.choice(EXTREMES), rng.randrange(256))
                   for _ in range(rng.randint(1, 6))]
            t0 = time.perf_counter()
            msg = check_one(path, mutate(seed, ops), size)
            slowest = max(slowest, time.perf_counter() - t0)
            outcomes[re.sub(r"[\d,]+", "N", msg.split(":")[0])[:70]] += 1
            if (i + 1) % 10_000 == 0:
                print(f"{i + 1:,} cases, {time.perf_counter() - t_start:.0f} s", file=sys.stderr)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(f"{args.cases:,} mutated headers from {', '.join(p.name for p in reals)} (random seed {args.seed})")
    print(f"time {time.perf_counter() - t_start:.0f} s, slowest case {slowest * 1000:.0f} ms, peak RSS growth {grown:.0f} MiB")
    print("outcomes (all clean; the first words of each error line, digits as N):")
    for what, n in outcomes.most_common():
        print(f"  {n:7,}  {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
