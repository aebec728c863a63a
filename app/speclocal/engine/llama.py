"""A thin layer over llama-cpp-python's low-level API: one loaded model with its context and KV cache.

The KV cache is tracked as a token list (`tokens`: what sits at positions 0..n-1), so callers can
reuse the longest common prefix and roll back rejected drafts exactly. Each model knows its memory kind:
a plain KV cache; a sliding-window cache ("swa": kept lean, as llama-server keeps it, so positions older than
the window are pruned and a prefix that needs them is processed again); or a recurrent state ("recurrent",
"hybrid": it cannot roll back, so speculative modes refuse it). Where llama.cpp cannot remove the tail of
the cache, the kept prefix is evaluated again: the cache never silently loses its context.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import threading
from pathlib import Path

import numpy as np
import psutil

import llama_cpp as ll

from speclocal.engine.sampling import Candidates
from speclocal.errors import SpeclocalError
from speclocal.models.devices import HOST, buffer_device, compute_label, devices

log = logging.getLogger("speclocal.llama_cpp")
log.addHandler(logging.NullHandler())  # never Python's last-resort stderr handler (it would draw over the TUI)

# ggml_log_level in the llama.cpp this version vendors: NONE, DEBUG, INFO, WARN, ERROR, CONT
_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_last_level = logging.DEBUG
_loading = threading.local()  # .lines: the log lines of the model this thread is loading, else absent

# llama.cpp's own report of each buffer it allocates (llama-model.cpp, llama-kv-cache.cpp, llama-context.cpp):
# "load_tensors:   CPU_Mapped model buffer size =  1059.54 MiB", "llama_kv_cache: CUDA0 KV buffer size = ..."
_BUFFER_LINE = re.compile(r"^\w+:\s+(\S+)\s+(model|KV|RS|compute|output) buffer size =\s+([\d.]+) MiB")
HELD = ("weights", "kv", "compute", "output")  # what a buffer holds, in the order reports give them
_HOLDS = {"model": "weights", "KV": "kv", "RS": "kv", "compute": "compute", "output": "output"}


@ll.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """Route llama.cpp's log to `logging` (never straight to the terminal); keep a loading model's lines."""
    global _last_level
    lvl = _LEVELS.get(level, _last_level)  # 5 = GGML_LOG_LEVEL_CONT continues the previous line
    _last_level = lvl
    msg = text.decode("utf-8", "replace").rstrip("\n")
    if msg:
        log.log(lvl, "%s", msg)
        lines = getattr(_loading, "lines", None)
        if lines is not None:
            lines.append(msg)


def placed(lines: list[str], found: tuple) -> list[tuple[str, str, int]]:
    """(where: HOST or a device's name, what: weights | kv | compute | output, bytes) of each buffer that
    llama.cpp reports in a load's log lines (to its 0.01 MiB); `found`: the devices (models.devices.devices())."""
    out = []
    for line in lines:
        m = _BUFFER_LINE.match(line)
        if m:
            out.append((buffer_device(m.group(1), found), _HOLDS[m.group(2)], round(float(m.group(3)) * 2**20)))
    return out


def held_per_device(buffers: list[tuple[str, str, int]], output_bytes: int) -> dict[str, dict[str, int]]:
    """The `placed` buffers summed per device and kind; the output buffer at least `output_bytes` (llama.cpp
    grows it, in host memory, without a word when a decode asks for more logits rows than it holds)."""
    out: dict[str, dict[str, int]] = {}
    for where, what, size in buffers:
        out.setdefault(where, dict.fromkeys(HELD, 0))[what] += size
    reported = sum(d["output"] for d in out.values())
    if output_bytes > reported and out:
        out.setdefault(HOST, dict.fromkeys(HELD, 0))["output"] += output_bytes - reported
    return out


_backend_ready = False


def init_backend() -> None:
    """Initialise llama.cpp once per process; (re)take its logging, which other code may have set."""
    global _backend_ready
    ll.llama_log_set(_log_callback, ctypes.c_void_p(0))
    if not _backend_ready:
        ll.llama_backend_init()
        _backend_ready = True


def default_threads() -> int:
    """Physical cores (llama.cpp decodes fastest with one thread per core)."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def common_prefix(a: list[int], b: list[int], n: int) -> int:
    """How many leading tokens `a[:n]` and `b[:n]` share: one comparison in C where they all agree (the usual
    case: a decode step scans its whole context), else a bisection of slices in C (about 2n elements compared),
    never a Python loop over the context."""
    if (a if len(a) == n else a[:n]) == (b if len(b) == n else b[:n]):
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], and a[lo:hi] != b[lo:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class TopRows:
    """The output rows of one decode with sampling on the device, each read from llama.cpp's buffers only when
    asked for (greedy verification never reads the rows after the first miss); valid until the next eval."""

    def __init__(self, ctx, batch_index: list[int]):
        self._ctx, self._index = ctx, batch_index

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> Candidates:
        j = self._index[i]
        k = ll.llama_get_sampled_candidates_count_ith(self._ctx, j)
        n = ll.llama_get_sampled_logits_count_ith(self._ctx, j)
        logits = np.ctypeslib.as_array(ll.llama_get_sampled_logits_ith(self._ctx, j), shape=(n,)).copy()
        if k == 0 and n > 0:  # the device could not run the top-k (llama.cpp then hands back the whole row)
            return Candidates(np.arange(n, dtype=np.int64), logits)
        if k != n or n <= 0:
            raise SpeclocalError(f"llama.cpp's backend sampler handed back {k} candidates, {n} logits for output {j}")
        ids = np.ctypeslib.as_array(ll.llama_get_sampled_candidates_ith(self._ctx, j), shape=(k,))
        return Candidates(ids.astype(np.int64), logits)

    def on_device(self, i: int = -1) -> bool:
        """Whether row i came back as candidates selected on the device, not as the whole row."""
        return ll.llama_get_sampled_candidates_count_ith(self._ctx, self._index[i]) > 0

    def argmax(self, axis: int = 1) -> np.ndarray:
        """Each row's best id, as `ndarray.argmax(axis=1)` gives it for full rows."""
        assert axis == 1
        return np.array([self[i].argmax() for i in range(len(self))], dtype=np.int64)


Rows = np.ndarray | TopRows  # what eval hands back: full logits rows, or candidates sampled on the device


class LoadedModel:
    """A GGUF model, its llama.cpp context and a record of the tokens in its KV cache.

    `backend_sampling`: the context can sample on the device (llama.cpp's backend sampling): after
    `sample_on_device(k)`, each output row comes back as its k best candidates (`TopRows`), so the vocabulary's
    logits neither leave the device nor pass through numpy."""

    def __init__(self, path: Path, n_ctx: int, n_threads: int, n_gpu_layers: int = 0, n_batch: int = 512,
                 n_seq: int = 1, layout: str | None = None, backend_sampling: bool = False,
                 found: tuple | None = None):
        from speclocal.models import layout as layouts

        init_backend()
        self.path = Path(path)
        found = devices() if found is None else found  # the devices, read once (models.devices.devices())
        if layout is None:  # one that survives a test decode on this machine (probed once, cached)
            layout = layouts.choose([self.path], compute_label(n_gpu_layers, found), n_gpu_layers, None).layout
        self.layout = layout  # how the weights are laid out in memory (engine/layout.py)
        mparams = ll.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        mparams.use_mmap = True
        overrides = layouts.apply(mparams, layout, self.path)
        _loading.lines = load_log = []  # llama.cpp's buffer sizes, as it reports them while it loads
        try:
            self._model = ll.llama_model_load_from_file(str(self.path).encode(), mparams)
        finally:
            del _loading.lines
        del overrides  # read while the tensors are placed, not after
        if not self._model:
            raise SpeclocalError(f"llama.cpp could not load {self.path} (run with -v for its log)")
        self.n_swa = ll.llama_model_n_swa(self._model)
        self.memory_kind = ("recurrent" if ll.llama_model_is_recurrent(self._model)
                            else "hybrid" if ll.llama_model_is_hybrid(self._model)
                            else "swa" if self.n_swa > 0 else "kv")
        if self.memory_kind != "kv":
            n_seq = 1  # a second sequence would double a sliding window's cache, or a recurrent state
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = min(n_batch, n_ctx)
        cparams.n_ubatch = min(n_batch, n_ctx)
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        cparams.no_perf = False
        cparams.swa_full = False  # a sliding-window cache of the window's size, not n_ctx (see memory_kind)
        cparams.n_seq_max = n_seq  # 2: a second sequence for a draft's second candidate (eval_branches)
        cparams.kv_unified = True  # ...in the same cells: shared positions are stored once, n_ctx is not split
        if backend_sampling:  # every output row of a verify pass sampled (llama.cpp's default: one per sequence)
            cparams.n_outputs_max_per_seq = 0
        _loading.lines = load_log
        try:
            self._ctx = ll.llama_init_from_model(self._model, cparams)
        finally:
            del _loading.lines
        if not self._ctx:
            ll.llama_model_free(self._model)
            self._model = None
            raise SpeclocalError(f"llama.cpp could not create a context of {n_ctx} tokens for {self.path}")
        self._vocab = ll.llama_model_get_vocab(self._model)
        self._mem = ll.llama_get_memory(self._ctx)
        self.n_ctx = ll.llama_n_ctx(self._ctx)
        self.n_batch = ll.llama_n_batch(self._ctx)  # llama.cpp may round n_ctx up and cap n_batch
        self.n_vocab = ll.llama_vocab_n_tokens(self._vocab)
        self.n_seq = n_seq  # sequences this context holds: 2 where a plain KV cache can verify two candidates
        self._batch = ll.llama_batch_init(n_batch, 0, n_seq)
        self._branch: tuple[int, list[int]] | None = None  # (first position, tokens) of sequence 1's own cells
        self._pieces: dict[int, bytes] = {}
        self.tokens: list[int] = []
        self.rebuilds = 0  # times the kept prefix had to be evaluated again (a removal llama.cpp refused)
        self._held = placed(load_log, found)
        self._max_rows = n_seq  # most logits rows asked of one decode: what llama.cpp's output buffer holds
        self.backend_sampling = backend_sampling
        self.device_k: int | None = None  # candidates per row sampled on the device; None: full logits rows
        self._chains: list = []  # the attached sampler chains, one per sequence

    # ---- vocabulary -------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """`text`'s tokens; what UTF-8 cannot encode (a lone surrogate: an emoji cut in half by a client, or
        bytes of a command line that were not UTF-8) as '?'."""
        data = text.encode("utf-8", "replace")
        cap = len(data) + 16
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, True)
        if n < 0:
            cap = -n
            buf = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self._vocab, data, len(data), buf, cap, add_special, True)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token (special tokens rendered empty)."""
        cached = self._pieces.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = ll.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            cached = self._pieces[token] = buf.raw[:n]
        return cached

    def vocab_fingerprint(self, samples: int = 512) -> str:
        """A stable id of this vocabulary (its size, BOS/EOS and the texts of `samples` tokens spread over the
        id range, special ones included): what keeps a suffix store to one tokenizer."""
        from speclocal.engine.store.store import tokenizer_fingerprint

        n = self.n_vocab
        ids = sorted({int(i) for i in np.linspace(0, n - 1, min(samples, n))})
        return tokenizer_fingerprint(n, [f"bos={self.bos} eos={self.eos}"] + [self.token_text(i) for i in ids])

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self._vocab, token))

    def token_text(self, token: int) -> str:
        """A special token's text (e.g. BOS) for chat templates; empty when there is none."""
        if token < 0:
            return ""
        return (ll.llama_vocab_get_text(self._vocab, token) or b"").decode("utf-8", "replace")

    @property
    def bos(self) -> int:
        return ll.llama_vocab_bos(self._vocab)

    @property
    def eos(self) -> int:
        return ll.llama_vocab_eos(self._vocab)

    @property
    def add_bos(self) -> bool:
        return bool(ll.llama_vocab_get_add_bos(self._vocab))

    def chat_template(self) -> str | None:
        raw = ll.llama_model_chat_template(self._model, None)
        return raw.decode("utf-8", "replace") if raw else None

    # ---- evaluation -------------------------------------------------------------------------
    def sample_on_device(self, k: int | None) -> None:
        """From the next eval on, hand back each output row's k best candidates, selected on the device (a top-k
        chain attached to every sequence); None (or k not below the vocabulary's size): full logits rows. Where
        llama.cpp refuses the chain (it says why in its log) rows stay full; whether the device itself ran the
        top-k shows in the rows (`TopRows.on_device`)."""
        if k is not None and k >= self.n_vocab:
            k = None
        if k == self.device_k:
            return
        self._detach()
        if k is None:
            return
        if not self.backend_sampling:
            raise SpeclocalError(f"{self.path.name} was loaded without backend sampling")
        for seq in range(self.n_seq):  # a chain can be attached once: one each
            chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_top_k(k))
            if not ll.llama_set_sampler(self._ctx, seq, chain):
                ll.llama_sampler_free(chain)
                self._detach()
                return
            self._chains.append(chain)
        self.device_k = k

    def _detach(self) -> None:
        for seq, chain in enumerate(self._chains):
            ll.llama_set_sampler(self._ctx, seq, None)
            ll.llama_sampler_free(chain)
        self._chains, self.device_k = [], None

    @contextlib.contextmanager
    def full_rows(self):
        """Full logits rows inside the block (diagnostics that read any id's logit), whatever was sampled
        on the device before it and after."""
        k = self.device_k
        self.sample_on_device(None)
        try:
            yield self
        finally:
            self.sample_on_device(k)

    def _rows(self, n: int, index: list[int]) -> Rows:
        if self.device_k is not None:
            return TopRows(self._ctx, index)
        return np.ctypeslib.as_array(ll.llama_get_logits(self._ctx), shape=(n, self.n_vocab))

    def eval(self, tokens: list[int], outputs: str = "all") -> Rows | None:
        """Append `tokens` to the KV cache; return the output rows ("all", "last") or None ("none"): logits
        (a view of llama.cpp's buffer), or with `sample_on_device` each row's candidates; valid until the next
        eval."""
        if not tokens:
            return None
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise SpeclocalError(f"context full: {len(self.tokens)} + {len(tokens)} tokens > n_ctx {self.n_ctx}")
        if outputs == "all" and len(tokens) > self.n_batch:
            raise SpeclocalError(f"logits for every position need at most n_batch ({self.n_batch}) tokens")
        batch = self._batch
        n_out = 0
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            last_chunk = start + self.n_batch >= len(tokens)
            pos0 = len(self.tokens)
            for i, tok in enumerate(chunk):
                batch.token[i] = tok
                batch.pos[i] = pos0 + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                want = outputs == "all" or (outputs == "last" and last_chunk and i == len(chunk) - 1)
                batch.logits[i] = want
            batch.n_tokens = len(chunk)
            n_out = len(chunk) if outputs == "all" else int(outputs == "last" and last_chunk)
            if n_out > self._max_rows:
                self._max_rows = n_out
            try:
                rc = ll.llama_decode(self._ctx, batch)
            except BaseException:  # e.g. KeyboardInterrupt right after the call: keep the record true
                self._resync(chunk)
                raise
            if rc != 0:
                self._resync(chunk)
                raise SpeclocalError(f"llama_decode failed with code {rc} on {self.path.name}")
            self.tokens.extend(chunk)
        ll.llama_synchronize(self._ctx)  # decoding is asynchronous on a GPU: done before any clock is read
        if outputs == "none":
            return None
        return self._rows(n_out, list(range(len(chunk))) if outputs == "all" else [len(chunk) - 1])

    def eval_branches(self, tokens: list[int], branch_at: int, branch: list[int]) -> Rows:
        """Verify two candidates in one pass: `tokens` on sequence 0 (as `eval` would), and a second one that
        shares `tokens[:branch_at + 1]` (the pending token and the drafts they agree on) and goes on with
        `branch`, on sequence 1 (a copy of sequence 0's history: the cells are shared, as in llama.cpp's
        examples/speculative). Rows: `tokens`' then `branch`'s. Then `keep_branch` before anything else."""
        if self.n_seq < 2:
            raise SpeclocalError(f"{self.path.name} was loaded with one sequence: it cannot verify two candidates")
        n = len(tokens) + len(branch)
        if not 0 <= branch_at < len(tokens) - 1 or not branch or n > self.n_batch:
            raise SpeclocalError(f"bad candidate pair: {len(tokens)} tokens, a branch of {len(branch)} at {branch_at}")
        if len(self.tokens) + n > self.n_ctx:
            raise SpeclocalError(f"context full: {len(self.tokens)} + {n} tokens > n_ctx {self.n_ctx}")
        pos0 = len(self.tokens)
        ll.llama_memory_seq_rm(self._mem, 1, -1, -1)
        ll.llama_memory_seq_cp(self._mem, 0, 1, -1, -1)
        batch = self._batch
        entries = [(t, pos0 + i, (0, 1) if i <= branch_at else (0,)) for i, t in enumerate(tokens)]
        entries += [(t, pos0 + branch_at + 1 + i, (1,)) for i, t in enumerate(branch)]
        for i, (tok, pos, seqs) in enumerate(entries):
            batch.token[i] = tok
            batch.pos[i] = pos
            batch.n_seq_id[i] = len(seqs)
            for j, sq in enumerate(seqs):
                batch.seq_id[i][j] = sq
            batch.logits[i] = True
        batch.n_tokens = n
        self._max_rows = max(self._max_rows, n)
        self._branch = (pos0 + branch_at + 1, list(branch))
        try:
            rc = ll.llama_decode(self._ctx, batch)
        except BaseException:
            self.keep_branch(False)
            self._resync(tokens)
            raise
        if rc != 0:
            self.keep_branch(False)
            self._resync(tokens)
            raise SpeclocalError(f"llama_decode failed with code {rc} on {self.path.name}")
        self.tokens.extend(tokens)
        ll.llama_synchronize(self._ctx)
        return self._rows(n, list(range(n)))

    def keep_branch(self, on_branch: bool) -> None:
        """After `eval_branches`: make sequence 0 the candidate the accepted tokens followed (`on_branch`: the
        second) and drop sequence 1."""
        if self._branch is None:
            return
        at, branch = self._branch
        self._branch = None
        if on_branch:
            ll.llama_memory_seq_rm(self._mem, 0, at, -1)
            ll.llama_memory_seq_cp(self._mem, 1, 0, at, -1)
            self.tokens = self.tokens[:at] + branch
        ll.llama_memory_seq_rm(self._mem, 1, -1, -1)

    def truncate(self, n: int) -> None:
        """Drop KV entries from position n on. Where llama.cpp cannot remove them (a recurrent state), or a
        sliding window no longer holds what the kept prefix needs, the kept prefix is evaluated again."""
        if n >= len(self.tokens):
            return
        if ll.llama_memory_seq_rm(self._mem, 0, n, -1) and self._holds(n):
            del self.tokens[n:]
            return
        kept = self.tokens[:n]
        self.clear()
        self.rebuilds += 1
        log.info("%s: the cache could not keep its first %d positions alone: evaluating them again",
                 self.path.name, n)
        self.eval(kept, outputs="none")

    def _holds(self, n: int) -> bool:
        """Whether the cache still holds every position that decoding after the first n needs: a pruned sliding
        window has dropped positions older than the window (llama-server's check)."""
        if self.n_swa <= 0 or n == 0:
            return True
        return ll.llama_memory_seq_pos_min(self._mem, 0) <= max(0, n - self.n_swa)

    def clear(self) -> None:
        ll.llama_memory_clear(self._mem, True)
        self.tokens = []

    def _resync(self, chunk: list[int]) -> None:
        """After an interrupted or failed decode of `chunk`, match the record to what the KV cache holds."""
        n = ll.llama_memory_seq_pos_max(self._mem, 0) + 1
        self.tokens = (self.tokens + chunk)[:n]

    def kv_positions(self) -> int:
        """How many positions llama.cpp's KV cache holds for our sequence (a consistency check)."""
        return ll.llama_memory_seq_pos_max(self._mem, 0) + 1

    def held(self, tokens: list[int], keep_last: bool = False) -> int:
        """How many leading tokens of `tokens` the cache holds and can reuse (0 where a sliding window pruned
        what they need); with keep_last, at most all but the last."""
        n = common_prefix(self.tokens, tokens, max(0, min(len(self.tokens), len(tokens) - (1 if keep_last else 0))))
        return n if self._holds(n) else 0

    def reuse_prefix(self, tokens: list[int], keep_last: bool = True) -> int:
        """Keep the longest cached prefix of `tokens` and drop the rest; return how many are kept. A prefix
        whose positions a sliding window has pruned is not reused: all of `tokens` is processed again.

        With keep_last, at least the last token is left to evaluate so that its logits exist.
        """
        n = self.held(tokens, keep_last)
        if n == 0:
            self.clear()
            return 0
        self.truncate(n)
        return len(self.tokens)

    # ---- accounting -------------------------------------------------------------------------
    @property
    def weights_bytes(self) -> int:
        return ll.llama_model_size(self._model)

    @property
    def kv_bytes(self) -> int:
        """Bytes of the allocated KV cache (f16 K and V for every layer and context slot)."""
        n_layer = ll.llama_model_n_layer(self._model)
        n_head = ll.llama_model_n_head(self._model)
        n_head_kv = ll.llama_model_n_head_kv(self._model)
        n_embd = ll.llama_model_n_embd(self._model)
        arch = self.meta("general.architecture") or ""
        k_dim = int(self.meta(f"{arch}.attention.key_length") or n_embd // n_head)
        v_dim = int(self.meta(f"{arch}.attention.value_length") or n_embd // n_head)
        return n_layer * self.n_ctx * n_head_kv * (k_dim + v_dim) * 2

    def on_devices(self) -> dict[str, dict[str, int]]:
        """What llama.cpp holds for this model on each device ("host", or a GPU's name such as CUDA0): bytes of
        weights, KV cache, compute and output buffers, as it sized them at load (its log), the output buffer
        grown to the most rows a decode has asked for (output_reserve)."""
        # with backend sampling llama.cpp also keeps a row's sampled logits, probabilities and candidates
        per_row = (16 if self.backend_sampling else 4) * self.n_vocab
        return held_per_device(self._held, per_row * self._max_rows)

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = ll.llama_model_meta_val_str(self._model, key.encode(), buf, 256)
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def perf(self) -> ll.llama_perf_context_data:
        return ll.llama_perf_context(self._ctx)

    def perf_reset(self) -> None:
        ll.llama_perf_context_reset(self._ctx)

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            if getattr(self, "_chains", None):
                self._detach()
            ll.llama_batch_free(self._batch)
            ll.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            ll.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        self.close()
