"""Fuzzing support for the GGUF header reader: small seeds derived from the real model files, and
mutations that target what a hostile header can lie about (counts, types, lengths, version).

Used by tests/test_gguf_fuzz.py (a few thousand cases) and scripts/fuzz_gguf.py (100,000+).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from hypothesis import strategies as st

from speclocal.errors import SpeclocalError
from speclocal.models import gguf_info

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

mutations = st.lists(
    st.tuples(st.sampled_from(OPS), st.integers(0, 2**31), st.sampled_from(EXTREMES), st.integers(0, 255)),
    min_size=1, max_size=6,
)


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
