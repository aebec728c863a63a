"""GGUF header facts (no weights loaded), llama.cpp's draft/main compatibility rules, memory estimate.

The header is parsed here with the `gguf` package's type tables rather than by `gguf.GGUFReader`, which
builds a numpy view per array element and so takes seconds over a large vocabulary; results are cached by
(path, size, mtime).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import asdict, dataclass, field, fields
from functools import lru_cache
from pathlib import Path

import gguf
import psutil

from speclocal.errors import SpeclocalError

# common/speculative.cpp (llama.cpp in llama-cpp-python 0.3.36)
SPEC_VOCAB_MAX_SIZE_DIFFERENCE = 128
SPEC_VOCAB_CHECK_START_TOKEN_ID = 5

KV_BYTES_PER_ELEMENT = 2  # f16 K and V caches, llama.cpp's default
LLAMA_CTX_PAD = 256  # llama.cpp rounds n_ctx up to a multiple of this
DEFAULT_UBATCH = 512  # llama.cpp's default n_ubatch
COMPUTE_FORMULA = "n_ubatch x (n_vocab + 2 x n_embd) x 4 B per model (f32 logits of one micro-batch; llama.cpp CPU, measured)"
WEIGHTS_NOTE = ("tensor bytes, memory-mapped; llama.cpp on x86/ARM CPUs may also keep re-laid-out copies of some "
                "quantized tensors (CPU_REPACK) while the mapped originals stay in page cache until memory is short")
FITS_SHARE_OF_AVAILABLE = 0.80
TIGHT_SHARE_OF_TOTAL = 0.90
VERDICT_RULE = (f"fits: need <= {FITS_SHARE_OF_AVAILABLE:.0%} of available RAM; "
                f"tight: need <= {TIGHT_SHARE_OF_TOTAL:.0%} of total RAM; otherwise does not fit")

_V = gguf.GGUFValueType
_SCALARS = {
    _V.UINT8: struct.Struct("<B"), _V.INT8: struct.Struct("<b"), _V.UINT16: struct.Struct("<H"),
    _V.INT16: struct.Struct("<h"), _V.UINT32: struct.Struct("<I"), _V.INT32: struct.Struct("<i"),
    _V.FLOAT32: struct.Struct("<f"), _V.BOOL: struct.Struct("<?"), _V.UINT64: struct.Struct("<Q"),
    _V.INT64: struct.Struct("<q"), _V.FLOAT64: struct.Struct("<d"),
}
_U32, _U64 = _SCALARS[_V.UINT32], _SCALARS[_V.UINT64]
MAX_STRING = 16 * 2**20  # longest string value read (chat templates are ~10 KB); guards against copying GBs
MAX_TOKEN = 2**16
MAX_VOCAB = 2**20  # the largest real vocabularies have ~260k entries
MAX_KV, MAX_TENSORS, MAX_ARRAY = 2**16, 2**20, 2**21  # real files: ~40 keys, ≤ 50k tensors, ≤ 300k merges
MAX_COPIED = 64 * 2**20  # all strings kept from one header (a 150k vocabulary is ~1.5 MB)
MAX_LAYERS, MAX_DIM = 4096, 2**20  # far beyond any real model; a hostile header must not size our lists
_KEEP_ARRAY = 4096  # longer non-token arrays (merges, token types) are skipped, only their length kept

# llama-vocab.cpp: tokenizer.ggml.model -> (vocab type, default BOS, default EOS, default add_bos, add_eos)
_VOCABS = {
    "no_vocab": ("NONE", None, None, False, False), "none": ("NONE", None, None, False, False),
    "llama": ("SPM", 1, 2, True, False), "bert": ("WPM", 101, None, True, False),
    "gpt2": ("BPE", 11, 11, False, False), "hybriddna": ("BPE", 11, 11, False, False),
    "whitespace": ("BPE", 11, 11, False, False), "gemma4": ("BPE", None, None, True, False),
    "t5": ("UGM", None, 1, False, True), "rwkv": ("RWKV", None, None, False, False),
    "plamo2": ("PLAMO2", 1, 2, False, False), "test": ("TEST", None, None, False, False),
}
_PRE_ADD_BOS = {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                "jina-v5-nano", "tekken", "chameleon"}
_PRE_NO_BOS = {"chatglm-bpe", "glm4", "glm5"}


class _Truncated(Exception):
    pass


@dataclass(frozen=True)
class GGUFInfo:
    """What llama.cpp would know about a model before loading its weights."""

    path: Path
    file_size: int
    architecture: str
    name: str
    n_params: int
    quantization: str  # e.g. Q4_K_M, from general.file_type (else the largest tensor type)
    tensor_types: dict[str, int]  # ggml type -> bytes, largest first
    tensor_bytes: int
    context_length: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_embd: int
    head_dim_k: int
    head_dim_v: int
    kv_bytes_per_token: int  # sum over layers of n_head_kv x (head_dim_k + head_dim_v) x 2 B
    tokenizer_model: str
    tokenizer_pre: str
    vocab_type: str  # llama.cpp's llama_vocab_type: SPM, BPE, WPM, UGM, ...
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    chat_template: str | None = field(repr=False, compare=False)
    tokens: tuple[bytes, ...] = field(repr=False, compare=False)
    matrices: tuple[tuple[str, str, int], ...] = field(default=(), repr=False, compare=False)  # 2-D tensors:
    # (name, ggml type, rows), what llama.cpp's CPU repacking works on

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    def token_text(self, token_id: int | None) -> str:
        if token_id is None or not 0 <= token_id < len(self.tokens):
            return ""
        return self.tokens[token_id].decode("utf-8", "replace")

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("tokens", "chat_template", "matrices")}
        d["has_chat_template"] = self.has_chat_template
        d["path"], d["tensor_types"] = str(self.path), dict(self.tensor_types)
        d["bos_text"], d["eos_text"] = self.token_text(self.bos_id), self.token_text(self.eos_id)
        return d


@dataclass(frozen=True)
class Compat:
    ok: bool
    rule: str | None  # the llama.cpp rule that failed: vocab_type, bos, eos, n_vocab, token_text
    detail: str  # the failed rule with its values, or what was checked
    notes: tuple[str, ...] = ()  # differences llama.cpp tolerates


@dataclass(frozen=True)
class ModelMemory:
    role: str
    path: str
    weights: int
    kv_cache: int
    compute: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute


@dataclass(frozen=True)
class MemoryEstimate:
    n_ctx: int  # as llama.cpp allocates it (padded to 256)
    n_ubatch: int
    models: tuple[ModelMemory, ...]
    total: int
    ram_total: int
    ram_available: int
    verdict: str  # fits / tight / does not fit
    rule: str = VERDICT_RULE
    compute_formula: str = COMPUTE_FORMULA
    weights_note: str = WEIGHTS_NOTE

    def to_dict(self) -> dict:
        d = asdict(self)
        for m, src in zip(d["models"], self.models):
            m["total"] = src.total
        return d


def read_gguf(path: str | os.PathLike) -> GGUFInfo:
    """Header facts of a GGUF file; raises SpeclocalError (one line naming the file) on any failure."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError:
        raise SpeclocalError(f"model file not found: {p}") from None
    except OSError as e:
        raise SpeclocalError(f"cannot read {p}: {e.strerror}") from None
    if not p.is_file():
        raise SpeclocalError(f"not a file: {p}")
    return _read_cached(str(p.resolve()), st.st_size, st.st_mtime_ns)


@lru_cache(maxsize=8)
def _read_cached(path: str, size: int, mtime_ns: int) -> GGUFInfo:
    if size < 24:
        raise SpeclocalError(f"not a GGUF file ({size} bytes): {path}")
    return _mapped(Path(path), _parse)


def read_metadata(path: str | os.PathLike, prefix: str = "") -> dict[str, tuple]:
    """The header's keys that start with `prefix`, every array in full, as `gguf.GGUFWriter.add_key_value`
    takes them: {key: (value, type, array element type or None)}; raises SpeclocalError like read_gguf."""
    def keys(path: Path, buf: mmap.mmap) -> dict[str, tuple]:
        c = _Cursor(buf)
        out = {}
        for _ in range(_header(c, path)[1]):
            key = c.string().decode("utf-8", "replace")
            vtype = _V(c.scalar(_U32))
            sub = _V(_U32.unpack_from(buf, c.pos)[0]) if vtype == _V.ARRAY else None
            value = c.value(vtype, key, keep=None)
            if key.startswith(prefix):
                out[key] = ([t.decode("utf-8", "replace") for t in value] if isinstance(value, tuple) else value,
                            vtype, sub)
        return out

    return _mapped(Path(path).expanduser(), keys)


def _mapped(path: Path, parse):
    """parse(path, the file memory-mapped), with any failure as one SpeclocalError line."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return parse(path, buf)
    except _Truncated:
        raise SpeclocalError(f"truncated or corrupt GGUF header: {path}") from None
    except SpeclocalError:
        raise
    except OSError as e:
        raise SpeclocalError(f"cannot read {path}: {e.strerror or e}") from None
    except Exception as e:  # noqa: BLE001 - garbage input can fail anywhere; never show a traceback
        raise SpeclocalError(f"corrupt GGUF file ({type(e).__name__}: {e}): {path}") from None


class _Cursor:
    def __init__(self, buf: mmap.mmap):
        self.buf, self.pos, self.size = buf, 0, len(buf)
        self.copied = 0  # bytes of strings copied out of the file so far

    def _copy(self, n: int) -> None:
        self.copied += n
        if self.copied > MAX_COPIED:
            raise ValueError(f"over {MAX_COPIED >> 20} MiB of header strings")

    def scalar(self, s: struct.Struct):
        if self.pos + s.size > self.size:
            raise _Truncated
        (v,) = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return v

    def string(self) -> bytes:
        n = self.scalar(_U64)
        if n > MAX_STRING:
            raise ValueError(f"a string of {n:,} bytes")
        self._copy(n)
        end = self.pos + n
        if end > self.size:
            raise _Truncated
        v = self.buf[self.pos:end]
        self.pos = end
        return v

    def skip_strings(self, count: int) -> None:
        unpack, buf, pos, size = _U64.unpack_from, self.buf, self.pos, self.size
        for _ in range(count):
            if pos + 8 > size:
                raise _Truncated
            pos += 8 + unpack(buf, pos)[0]
        if pos > size:
            raise _Truncated
        self.pos = pos

    def strings(self, count: int) -> tuple[bytes, ...]:
        unpack, buf, pos, size, out = _U64.unpack_from, self.buf, self.pos, self.size, []
        for _ in range(count):
            if pos + 8 > size:
                raise _Truncated
            n = unpack(buf, pos)[0]
            if n > MAX_TOKEN:
                raise ValueError(f"a vocabulary entry of {n:,} bytes")
            self._copy(n)
            end = pos + 8 + n
            if end > size:
                raise _Truncated
            out.append(buf[pos + 8:end])
            pos = end
        self.pos = pos
        return tuple(out)

    def value(self, vtype: int, key: str, keep: int | None = _KEEP_ARRAY):
        """One value; arrays longer than `keep` (not the vocabulary) are skipped and give their length."""
        vtype = _V(vtype)
        if vtype == _V.STRING:
            return self.string().decode("utf-8", "replace")
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        if vtype != _V.ARRAY:
            raise ValueError(f"unknown value type {vtype}")
        itype, count = _V(self.scalar(_U32)), self.scalar(_U64)
        if count > MAX_ARRAY:
            raise ValueError(f"an array of {count:,} elements in {key}")
        if count > self.size - self.pos:
            raise _Truncated
        if itype == _V.STRING:
            if key == "tokenizer.ggml.tokens":
                if count > MAX_VOCAB:
                    raise ValueError(f"a vocabulary of {count:,} tokens")
                return self.strings(count)
            if keep is not None and count > keep:
                self.skip_strings(count)
                return count
            return [s.decode("utf-8", "replace") for s in self.strings(count)]
        if itype not in _SCALARS:
            raise ValueError(f"unsupported array element type {itype} in {key}")
        s = _SCALARS[itype]
        end = self.pos + s.size * count
        if end > self.size:
            raise _Truncated
        values = [v for (v,) in s.iter_unpack(self.buf[self.pos:end])] if keep is None or count <= keep else count
        self.pos = end
        return values


def _parse(path: Path, buf: mmap.mmap) -> GGUFInfo:
    c = _Cursor(buf)
    meta, n_tensors = _metadata(c, path)
    tensor_types, matrices, n_params, data_end = _tensors(c, n_tensors, path)
    align = meta.get("general.alignment", gguf.GGUF_DEFAULT_ALIGNMENT)
    data_start = -(-c.pos // align) * align
    if data_start + data_end > c.size:
        raise SpeclocalError(f"truncated GGUF file: tensor data needs {data_start + data_end:,} bytes, "
                             f"file has {c.size:,}: {path}")

    arch = meta.get("general.architecture", "")
    tokens = meta.get("tokenizer.ggml.tokens", ())
    if not arch or not isinstance(tokens, tuple):
        raise SpeclocalError(f"GGUF file without architecture or vocabulary: {path}")
    n_layer, n_embd, n_head, kv_layers, hd_k, hd_v = _attention(meta, arch, path)
    types_sorted = dict(sorted(tensor_types.items(), key=lambda kv_: -kv_[1]))
    tok_model, tok_pre = meta.get("tokenizer.ggml.model", ""), meta.get("tokenizer.ggml.pre", "")
    vocab_type, bos, eos, add_bos, add_eos = _vocab_rules(meta, tok_model, tok_pre, len(tokens), path)
    return GGUFInfo(
        path=path, file_size=c.size, architecture=arch, name=meta.get("general.name", path.stem),
        n_params=n_params, quantization=_quant_name(meta.get("general.file_type"), types_sorted),
        tensor_types=types_sorted, tensor_bytes=sum(tensor_types.values()),
        context_length=meta.get(f"{arch}.context_length", 0), n_layer=n_layer, n_head=n_head,
        n_head_kv=max(kv_layers, default=0), n_embd=n_embd, head_dim_k=hd_k, head_dim_v=hd_v,
        kv_bytes_per_token=sum(kv_layers) * (hd_k + hd_v) * KV_BYTES_PER_ELEMENT,
        tokenizer_model=tok_model, tokenizer_pre=tok_pre, vocab_type=vocab_type, vocab_size=len(tokens),
        bos_id=bos, eos_id=eos, add_bos=add_bos, add_eos=add_eos,
        chat_template=_text_or_none(meta.get("tokenizer.chat_template")), tokens=tokens, matrices=tuple(matrices),
    )


def _header(c: _Cursor, path: Path) -> tuple[int, int]:
    """Magic and version checked; the tensor and metadata key counts."""
    magic = c.scalar(_U32)
    if magic != gguf.GGUF_MAGIC:
        raise SpeclocalError(f"not a GGUF file (starts with {bytes(c.buf[:4])!r}): {path}")
    version = c.scalar(_U32)
    if version not in (2, 3):
        raise SpeclocalError(f"unsupported GGUF version {version} (big-endian or newer file?): {path}")
    n_tensors, n_kv = c.scalar(_U64), c.scalar(_U64)
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV:
        raise SpeclocalError(f"implausible GGUF header ({n_kv:,} metadata keys, {n_tensors:,} tensors): {path}")
    return n_tensors, n_kv


def _metadata(c: _Cursor, path: Path) -> tuple[dict, int]:
    """The header's key-value metadata, and how many tensors follow it."""
    n_tensors, n_kv = _header(c, path)
    meta: dict = {}
    for _ in range(n_kv):
        key = c.string().decode("utf-8", "replace")
        meta[key] = c.value(c.scalar(_U32), key)
    return meta, n_tensors


def _tensors(c: _Cursor, n_tensors: int, path: Path) -> tuple[dict[str, int], list[tuple[str, str, int]], int, int]:
    """The tensor infos: (bytes per ggml type, 2-D tensors as (name, type, rows), parameters, end of the data)."""
    tensor_types: dict[str, int] = {}
    matrices: list[tuple[str, str, int]] = []
    n_params = data_end = 0
    for _ in range(n_tensors):
        name = c.string()
        n_dims = c.scalar(_U32)
        if n_dims > 8:
            raise ValueError(f"tensor with {n_dims} dimensions")
        dims = [c.scalar(_U64) for _ in range(n_dims)]
        n_el = 1
        for d in dims:
            n_el *= d
        raw_type, offset = c.scalar(_U32), c.scalar(_U64)
        try:
            qtype = gguf.GGMLQuantizationType(raw_type)
        except ValueError:
            raise SpeclocalError(f"unknown tensor type {raw_type} (newer than the gguf package?): {path}") from None
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        n_bytes = n_el * type_size // block
        tensor_types[qtype.name] = tensor_types.get(qtype.name, 0) + n_bytes
        if n_dims == 2:
            matrices.append((name.decode("utf-8", "replace"), qtype.name, dims[1]))
        n_params += n_el
        data_end = max(data_end, offset + n_bytes)
    return tensor_types, matrices, n_params, data_end


def _attention(meta: dict, arch: str, path: Path) -> tuple[int, int, int, list[int], int, int]:
    """(layers, embedding width, heads, KV heads per layer, key and value head dims), checked for plausibility."""
    def hp(name: str, default=0):
        return meta.get(f"{arch}.{name}", default)

    n_layer, n_embd, n_head = hp("block_count"), hp("embedding_length"), hp("attention.head_count")
    n_head = max(n_head, default=0) if isinstance(n_head, list) else n_head
    for name, value, limit in (("block_count", n_layer, MAX_LAYERS), ("embedding_length", n_embd, MAX_DIM),
                               ("attention.head_count", n_head, MAX_DIM)):
        if not isinstance(value, int) or not 0 <= value <= limit:
            raise SpeclocalError(f"implausible {arch}.{name} = {value!r} in the GGUF header: {path}")
    kv = hp("attention.head_count_kv", n_head)
    kv_layers = kv if isinstance(kv, list) else [kv] * n_layer
    hd_k = hp("attention.key_length", n_embd // n_head if n_head else 0)
    hd_v = hp("attention.value_length", hd_k)
    return n_layer, n_embd, n_head, kv_layers, hd_k, hd_v


def _text_or_none(value) -> str | None:
    return value if isinstance(value, str) and value else None


def _quant_name(file_type, types_by_bytes: dict[str, int]) -> str:
    if isinstance(file_type, int):
        try:
            return gguf.LlamaFileType(file_type & ~gguf.LlamaFileType.GUESSED).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    return next(iter(types_by_bytes), "?")


def _vocab_rules(meta: dict, model: str, pre: str, n_vocab: int, path: Path):
    """(vocab type, BOS id, EOS id, add_bos, add_eos) resolved as llama-vocab.cpp does."""
    if model not in _VOCABS:
        raise SpeclocalError(f"unknown tokenizer model {model[:40]!r}: {path}")
    vtype, bos, eos, add_bos, add_eos = _VOCABS[model]
    if vtype == "BPE" and pre in _PRE_ADD_BOS:
        add_bos = True
    if vtype == "BPE" and pre in _PRE_NO_BOS:
        bos = None
    bos = bos if bos is not None and bos < n_vocab else None
    eos = eos if eos is not None and eos < n_vocab else None
    key_bos, key_eos = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    bos = key_bos if isinstance(key_bos, int) and 0 <= key_bos < n_vocab else bos
    eos = key_eos if isinstance(key_eos, int) and 0 <= key_eos < n_vocab else eos
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos)) or model == "gemma4"
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", add_eos))
    return vtype, bos, eos, add_bos, add_eos


def check_compat(main: GGUFInfo, draft: GGUFInfo) -> Compat:
    """llama.cpp's common_speculative_are_compatible, rule by rule, in its order."""
    if main.vocab_type != draft.vocab_type:
        return Compat(False, "vocab_type", f"vocab type differs: main {main.vocab_type} ({main.tokenizer_model}), "
                                           f"draft {draft.vocab_type} ({draft.tokenizer_model})")
    for rule, add_m, add_d, id_m, id_d in (("bos", main.add_bos, draft.add_bos, main.bos_id, draft.bos_id),
                                            ("eos", main.add_eos, draft.add_eos, main.eos_id, draft.eos_id)):
        if add_m != add_d or (add_m and id_m != id_d):
            return Compat(False, rule, f"{rule.upper()} differs: add_{rule} main {add_m} / draft {add_d}, "
                                       f"id main {id_m} / draft {id_d}")
    diff = abs(main.vocab_size - draft.vocab_size)
    if diff > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
        return Compat(False, "n_vocab", f"n_vocab difference {diff} > {SPEC_VOCAB_MAX_SIZE_DIFFERENCE}: "
                                        f"main {main.vocab_size}, draft {draft.vocab_size}")
    n = min(main.vocab_size, draft.vocab_size)
    bad = next((i for i in range(SPEC_VOCAB_CHECK_START_TOKEN_ID, n) if main.tokens[i] != draft.tokens[i]), None)
    if bad is not None:
        return Compat(False, "token_text", f"token {bad} differs: main {main.token_text(bad)!r}, "
                                           f"draft {draft.token_text(bad)!r}")
    notes = []
    if diff:
        notes.append(f"vocab sizes differ by {diff} (allowed up to {SPEC_VOCAB_MAX_SIZE_DIFFERENCE})")
    for what, a, b in (("BOS", main.bos_id, draft.bos_id), ("EOS", main.eos_id, draft.eos_id)):
        if a != b:
            notes.append(f"{what} ids differ ({a} / {b}) but are not added to prompts")
    return Compat(True, None, f"same {main.vocab_type} vocab, BOS/EOS, n_vocab {main.vocab_size}/{draft.vocab_size}, "
                              f"token texts {SPEC_VOCAB_CHECK_START_TOKEN_ID}..{n - 1} equal", tuple(notes))


def estimate_memory(main: GGUFInfo, draft: GGUFInfo | None, n_ctx: int, n_ubatch: int = DEFAULT_UBATCH) -> MemoryEstimate:
    """Weights + f16 KV cache + compute allowance per model at context n_ctx, against this machine's RAM."""
    if n_ctx <= 0 or n_ubatch <= 0:
        raise SpeclocalError(f"context size and n_ubatch must be positive (got {n_ctx}, {n_ubatch})")
    ctx = -(-n_ctx // LLAMA_CTX_PAD) * LLAMA_CTX_PAD
    models = tuple(
        ModelMemory(role, str(m.path), m.tensor_bytes, m.kv_bytes_per_token * ctx,
                    n_ubatch * (m.vocab_size + 2 * m.n_embd) * 4)
        for role, m in (("main", main), ("draft", draft)) if m is not None
    )
    need = sum(m.total for m in models)
    vm = psutil.virtual_memory()
    return MemoryEstimate(ctx, n_ubatch, models, need, vm.total, vm.available,
                          ram_verdict(need, vm.total, vm.available))


def ram_verdict(need: int, total: int, available: int) -> str:
    if need <= FITS_SHARE_OF_AVAILABLE * available:
        return "fits"
    if need <= TIGHT_SHARE_OF_TOTAL * total:
        return "tight"
    return "does not fit"
