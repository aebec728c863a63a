"""The engine: a loaded main (+ optional draft) model and one decode loop for every mode.

Plain decoding is the same loop with a drafter that proposes nothing, so the modes differ only in
drafting and comparisons between them are fair. Auto mode's drafter belongs to the policy layer above
the engine: whoever builds the Engine hands it in (`auto_drafter`; `speclocal.policy.open_engine` does).
"""

from __future__ import annotations

import codecs
import logging
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import psutil

from speclocal import options
from speclocal.engine.chat import render_chat
from speclocal.engine.drafters import Drafter, ModelDrafter, PromptLookupDrafter, Proposal
from speclocal.models.layout import LABELS as LAYOUT_LABELS
from speclocal.models.layout import choose as choose_layout
from speclocal.engine.llama import LoadedModel, default_threads
from speclocal.engine.sampling import Dist, Sampling, accept_or_resample, distribution, sample
from speclocal.engine.suffix import SuffixDrafter
from speclocal.engine.suffix_store import DEFAULT_MAX_BYTES, SuffixStore
from speclocal.engine.types import GenerationRequest, GenerationResult, MemoryParts, StepEvent
from speclocal.errors import SpeclocalError
from speclocal.models.devices import compute_label, devices, memory_pools, resolve_gpu_layers

log = logging.getLogger("speclocal.engine")

NO_DRAFT = Proposal()
STORE_MODES = ("suffix", "auto")  # the modes whose generations the suffix store keeps

AutoDrafterFactory = Callable[["Engine", GenerationRequest], Drafter]


class Engine:
    """Load a main model (and optionally a draft model) once; generate many times.

    Threads: generations are serialised by a lock. Keep llama.cpp calls to one live thread at a time
    (the main thread, or worker threads that end): llama.cpp's OpenMP keeps a thread pool per calling
    thread, and with two pools alive on a machine with no spare cores it stops spinning at barriers,
    which slows decoding (docs/benchmarks.md).

    `store_dir`: where the suffix drafter's store of earlier generations lives (one store per tokenizer;
    `speclocal.locations.suffix_store_dir()` for the user's); None = no store. It is opened when a request
    first uses it (`GenerationRequest.store`), so a run that turns it off never touches it."""

    def __init__(self, main_path: str | Path, draft_path: str | Path | None = None,
                 n_ctx: int = options.default("ctx_size"), n_threads: int | None = None,
                 n_gpu_layers: str | int = options.default("n_gpu_layers"), check_pair: bool = True,
                 force: bool = False, auto_drafter: AutoDrafterFactory | None = None,
                 store_dir: str | Path | None = None, store_max_bytes: int = DEFAULT_MAX_BYTES,
                 repack: bool | None = options.default("repack")):
        options.check("ctx_size", n_ctx)
        n_gpu_layers = resolve_gpu_layers(n_gpu_layers)
        if not force:
            check_memory(Path(main_path), Path(draft_path) if draft_path else None, n_ctx, n_gpu_layers)
        if draft_path is not None and check_pair:
            _require_compatible(Path(main_path), Path(draft_path))
        self.n_threads = n_threads or default_threads()
        self.n_gpu_layers = n_gpu_layers  # as llama.cpp takes it: -1 = every layer
        device = compute_label(n_gpu_layers, devices())  # e.g. "CPU (AMD EPYC)", "CUDA0 (...), all layers"
        paths = [Path(main_path)] + ([Path(draft_path)] if draft_path else [])
        # a weight layout that survives a test decode here (probed once per machine), or the one --repack names
        self.layout = choose_layout(paths, device, n_gpu_layers, repack)
        if self.layout.news:  # said once, when found
            logging.getLogger("speclocal.notice").warning("%s", self.layout.note)
        # the layout named where it is not llama.cpp's default (the label keys cost profiles: their curves differ)
        self.compute = device + LAYOUT_LABELS[self.layout.layout]
        self.main = LoadedModel(paths[0], n_ctx, self.n_threads, n_gpu_layers, n_seq=2, layout=self.layout.layout)
        self.draft = (LoadedModel(paths[1], n_ctx, self.n_threads, n_gpu_layers, layout=self.layout.layout)
                      if draft_path else None)
        self._auto_drafter = auto_drafter
        self._lookup: PromptLookupDrafter | None = None
        self._suffix: SuffixDrafter | None = None
        self.store_dir = Path(store_dir) if store_dir is not None else None
        self.store_max_bytes = store_max_bytes
        self._store: SuffixStore | None = None
        self._lock = threading.Lock()
        self._warm_up()

    @classmethod
    def from_settings(cls, s: options.Settings, need_draft: bool = True, **kw) -> "Engine":
        """The pair, models and load settings of `s` (catalogue ids or paths, resolved in `s.models_dir`); the
        user's suffix store (opened only if a request uses it)."""
        from speclocal import locations
        from speclocal.models.catalogue import resolve_pair

        main, draft = resolve_pair(s.pair or None, s.main or None, s.draft or None, s.models_dir or None)
        kw.setdefault("store_dir", locations.suffix_store_dir())
        return cls(main, draft if need_draft else None, n_ctx=s.ctx_size, n_threads=s.threads or None,
                   n_gpu_layers=s.n_gpu_layers, force=s.force, repack=s.repack, **kw)

    def _warm_up(self) -> None:
        """One pass through each model, so the first timed run does not pay for mmap page faults."""
        for m in (self.main, self.draft):
            if m is not None:
                m.eval([m.bos if m.bos >= 0 else 0], outputs="last")
                m.clear()

    # ---- prompts ----------------------------------------------------------------------------
    def _chat_tokens(self, messages: list[dict]) -> list[int]:
        tokens = self.main.tokenize(render_chat(self.main, messages), add_special=False)
        if self.main.add_bos and (not tokens or tokens[0] != self.main.bos):
            tokens.insert(0, self.main.bos)
        return tokens

    def fit_chat(self, messages: list[dict], reserve: int) -> tuple[list[dict], int]:
        """Context policy for long chats: drop the oldest turns (never system messages or the last
        message) until the prompt leaves `reserve` tokens free. Returns (messages, turns dropped)."""
        kept, dropped = list(messages), 0
        while len(self._chat_tokens(kept)) + reserve > self.main.n_ctx:
            i = next((j for j, m in enumerate(kept[:-1]) if m["role"] != "system"), None)
            if i is None:
                break  # only the newest message is left: the length check in prompt_tokens reports it
            del kept[i]
            if i < len(kept) - 1 and kept[i]["role"] == "assistant":
                del kept[i]  # a turn is a user message and its answer
            dropped += 1
        return kept, dropped

    def prompt_tokens(self, req: GenerationRequest) -> list[int]:
        return self._prompt(req)[0]

    def _prompt(self, req: GenerationRequest) -> tuple[list[int], int]:
        """The prompt's tokens and how many chat turns `fit_context` left out."""
        dropped = 0
        if req.messages is not None:
            messages = list(req.messages)
            if req.fit_context:
                messages, dropped = self.fit_chat(messages, reserve=req.n_predict)
            tokens = self._chat_tokens(messages)
        else:
            tokens = self.main.tokenize(req.prompt or "", add_special=True)
        if not tokens:
            raise SpeclocalError("the prompt is empty")
        if len(tokens) >= self.main.n_ctx:
            raise SpeclocalError(
                f"prompt is {len(tokens)} tokens, context is {self.main.n_ctx}: shorten it or raise -c/--ctx-size"
            )
        return tokens, dropped

    # ---- drafters ---------------------------------------------------------------------------
    def drafter(self, req: GenerationRequest) -> Drafter:
        """The drafter for the request's mode."""
        if req.mode == "plain":
            return Drafter()
        for m in (self.main, self.draft if req.mode in ("spec", "auto") else None):
            if m is not None and m.memory_kind in ("recurrent", "hybrid"):
                raise SpeclocalError(f"{m.path.name} keeps a {m.memory_kind} state that cannot roll back a rejected "
                                     f"draft, so mode {req.mode!r} cannot run on it: use --mode plain")
        if req.mode == "lookup":
            if self._lookup is None or self._lookup.params != req.draft:
                self._lookup = PromptLookupDrafter(req.draft)
            return self._lookup
        if req.mode == "suffix":
            return self.suffix_drafter(req)
        if req.mode == "auto":
            if self._auto_drafter is None:
                raise SpeclocalError("auto mode needs the policy's drafter: build the engine with "
                                     "speclocal.policy.open_engine")
            return self._auto_drafter(self, req)
        return self.model_drafter(req)

    def suffix_store(self) -> SuffixStore | None:
        """The suffix store for the main model's tokenizer (opened on first use, then kept up to date with
        what other processes add); None without a `store_dir`, or if it cannot be opened (logged)."""
        if self.store_dir is None:
            return None
        if self._store is None:
            try:
                self._store = SuffixStore(self.store_dir, self.main.vocab_fingerprint(), self.store_max_bytes)
            except OSError as e:
                log.warning("suffix store in %s unusable, going on without it: %s", self.store_dir, e)
                self.store_dir = None
                return None
        else:
            self._store.reload_if_changed()
        return self._store

    def suffix_drafter(self, req: GenerationRequest) -> SuffixDrafter:
        """The suffix drafter for `req` (auto uses it too): kept between requests with the same caps and store
        use, so a chat's next turn extends its index instead of rebuilding it."""
        store = self.suffix_store() if req.store != "off" else None
        d = self._suffix
        if d is None or d.params != req.draft or d.store is not store:
            d = self._suffix = SuffixDrafter(req.draft, store, n_vocab=self.main.n_vocab)
        return d

    def _remember(self, req: GenerationRequest, prompt: list[int], result: GenerationResult) -> None:
        """Add a finished suffix or auto generation to the store (when the request lets it), and report the
        store's size in the result."""
        if req.store == "off" or self.store_dir is None:
            return
        if req.mode not in STORE_MODES and self._store is None:
            return  # a plain run does not open the store just to report it
        store = self.suffix_store()
        if store is None:
            return
        added = 0
        if req.store == "on" and req.mode in STORE_MODES and result.tokens and result.stop_reason != "cancelled":
            try:
                added = store.add(prompt, result.tokens)
            except (OSError, ValueError) as e:
                log.warning("could not add the generation to the suffix store: %s", e)
        result.store = {"generations": store.n_generations, "tokens": store.n_tokens, "bytes": store.bytes_on_disk,
                        "added": added, "add_s": store.last_add_s if added else 0.0}

    def model_drafter(self, req: GenerationRequest) -> ModelDrafter:
        if self.draft is None:
            raise SpeclocalError("mode 'spec' needs a draft model (-md/--model-draft or a pair)")
        return ModelDrafter(self.draft, req.draft, self.main.n_vocab)

    def check_kv(self) -> None:
        """Raise if a KV cache no longer holds exactly the tokens the engine believes it holds."""
        for m in (self.main, self.draft):
            if m is not None and m.kv_positions() != len(m.tokens):
                raise SpeclocalError(f"KV cache of {m.path.name} holds {m.kv_positions()} positions, "
                                     f"the record says {len(m.tokens)}")

    def reset(self) -> None:
        """Clear every KV cache, so the next run processes its whole prompt (fair timing)."""
        self.main.clear()
        if self.draft:
            self.draft.clear()
        self._lookup = None
        self._suffix = None

    def memory(self) -> MemoryParts:
        d = self.draft
        return MemoryParts(self.main.weights_bytes, d.weights_bytes if d else 0, self.main.kv_bytes,
                           d.kv_bytes if d else 0)

    # ---- the decode loop --------------------------------------------------------------------
    def generate(self, req: GenerationRequest, on_step: Callable[[StepEvent], None] | None = None,
                 cancel: threading.Event | None = None, drafter: Drafter | None = None) -> GenerationResult:
        """Run one generation. `cancel` is checked before each step; a cancelled run returns what it has.
        `drafter`: use this one instead of the mode's (benchmarks: a synthetic drafter)."""
        with self._lock:
            return self._generate(req, on_step, cancel, drafter)

    def _generate(self, req: GenerationRequest, on_step, cancel, drafter: Drafter | None) -> GenerationResult:
        main, s = self.main, req.sampling.seeded()
        prompt, dropped = self._prompt(req)
        drafter = drafter or self.drafter(req)
        rng = np.random.default_rng(s.seed)
        tally = _Tally()
        text = _Text(main.piece, req.stop)

        # prompt processing: all but the last token, reusing what the cache holds (up to the request's limit)
        cached = main.reuse_prefix(prompt[:-1][: req.reuse_limit], keep_last=False)
        main.eval(prompt[cached:-1], outputs="none")
        drafter.prepare(prompt)
        tally.decoding()

        history = list(prompt)  # main's KV holds history[:-1]; history[-1] is the pending token
        stop_reason = "length"
        while tally.n_generated < req.n_predict:
            if cancel is not None and cancel.is_set():
                stop_reason = "cancelled"
                break
            room = main.n_ctx - len(main.tokens) - 1
            if room < 0:
                stop_reason = "context"
                break
            k = min(req.draft.cap(req.mode), req.n_predict - tally.n_generated - 1, room)
            t0 = time.perf_counter()
            draft = drafter.draft(history, k, s, rng) if k > 0 else NO_DRAFT  # 1. draft
            t1 = time.perf_counter()
            base, on_branch = len(main.tokens), False
            if draft.runner_up:  # 2. verify in one pass (3. accept the agreed prefix + one token of main's)
                rows = main.eval_branches([history[-1]] + draft.tokens, draft.runner_up.at, draft.runner_up.tokens)
                t2 = time.perf_counter()
                new, n_acc, on_branch = _accept_branches(rows, draft, s, rng)
                main.keep_branch(on_branch)
            else:
                rows = main.eval([history[-1]] + draft.tokens, outputs="all")
                t2 = time.perf_counter()
                new, n_acc = _accept(rows, draft, s, rng)
            eog = next((i for i, t in enumerate(new) if main.is_eog(t)), None)
            if eog is not None:
                new, n_acc, stop_reason = new[:eog], min(n_acc, eog), "eos"
            drafter.observe(draft.n_drafted, n_acc, on_branch)
            main.truncate(base + len(new))  # 4. roll back: the KV cache holds history[:-1] again
            t3 = time.perf_counter()

            history.extend(new)
            last = (stop_reason == "eos" or tally.n_generated + len(new) >= req.n_predict
                    or len(main.tokens) >= main.n_ctx)  # no step follows: nothing is held back
            pieces, past_stop = text.add(new, final=last)
            n_draft = draft.n_drafted
            if text.stopped:  # the output ends at the stop string, and so do its tokens and counts
                stop_reason = "stop"
                here = min(past_stop, len(new))
                cut = max(0, n_acc - (len(new) - here))  # accepted drafts past the stop: as if never drafted
                new, n_acc, n_draft = new[: len(new) - here], n_acc - cut, n_draft - cut
                tally.drop(past_stop - here)  # tokens of earlier steps that began the stop string
            origins = [i < n_acc for i in range(len(new))]
            source = draft.source.reported if n_draft else None
            tally.step(new, origins, n_draft, n_acc, t0, t1, t2, t3, source)
            if on_step is not None:
                on_step(StepEvent(tokens=new, pieces=pieces, from_draft=origins, drafted=n_draft, accepted=n_acc,
                                  t_draft=t1 - t0, t_verify=t2 - t1, t_sample=t3 - t2, n_generated=tally.n_generated,
                                  elapsed=t3 - tally.t_decode0, source=source))
            if stop_reason in ("eos", "stop"):
                break
        result = tally.result(mode=req.mode, text=text.finish(), stop_reason=stop_reason, n_prompt=len(prompt),
                              n_cached=cached, memory=self.memory(),
                              auto=drafter.finish(tally.n_generated, stop_reason), dropped_turns=dropped,
                              seed=s.seed, draft_prompt=drafter.prompt_work())
        self._remember(req, prompt, result)  # after the clock stopped: storing is not decoding
        return result

    def close(self) -> None:
        self.main.close()
        if self.draft:
            self.draft.close()


def _accept(rows: np.ndarray, draft: Proposal, s: Sampling, rng: np.random.Generator) -> tuple[list[int], int]:
    """Verify drafted tokens against the main model's rows; return the new tokens and how many of them
    were accepted drafts (the last new token always comes from the main model)."""
    drafted = draft.tokens
    if s.greedy:
        targets = rows.argmax(axis=1)
        n = 0
        while n < len(drafted) and drafted[n] == targets[n]:
            n += 1
        return drafted[:n] + [int(targets[n])], n
    for i, x in enumerate(drafted):
        q = draft.q[i] if draft.q is not None else Dist.point(x)
        ok, tok = accept_or_resample(distribution(rows[i], s), q, x, rng)
        if not ok:
            return drafted[:i] + [tok], i
    return drafted + [sample(distribution(rows[len(drafted)], s), rng)], len(drafted)


def _accept_branches(rows: np.ndarray, draft: Proposal, s: Sampling,
                     rng: np.random.Generator) -> tuple[list[int], int, bool]:
    """Verify a draft with a second candidate (point masses, rows from `eval_branches`): at each position the
    main model's token (greedy: its argmax; else a sample of its distribution) is kept, and the walk goes on
    down the candidate that drafted that token, if one did. For point-mass drafts this is the speculative
    rule itself (accept x with probability p(x), else resample from p without x) applied to each candidate
    in turn (SpecInfer's multi-candidate rule), so the output follows p exactly. Returns the new tokens, how
    many were accepted drafts, and whether they followed the second candidate."""
    main, at, branch = draft.tokens, draft.runner_up.at, draft.runner_up.tokens
    new, row, on_branch = [], 0, False
    while True:
        tok = int(rows[row].argmax()) if s.greedy else sample(distribution(rows[row], s), rng)
        new.append(tok)
        d = len(new) - 1  # depth of the drafted token this one is checked against
        if not on_branch and d < len(main) and tok == main[d]:
            row = 1 + d
        elif not on_branch and d == at and tok == branch[0]:
            on_branch, row = True, 1 + len(main)
        elif on_branch and d - at < len(branch) and tok == branch[d - at]:
            row = 1 + len(main) + d - at
        else:
            return new, len(new) - 1, on_branch
        # an accepted draft: its row says what follows it


class _Tally:
    """A generation's counters, timings and peak RSS, and the result they add up to."""

    def __init__(self) -> None:
        self.t_start = time.perf_counter()
        self.t_decode0 = self.t_start
        self.ttft: float | None = None
        self.tokens: list[int] = []
        self.from_draft: list[bool] = []
        self.steps: list[tuple[int, int, int, float]] = []
        self.sources: list[str | None] = []
        self.n_drafted = self.n_accepted = 0
        self.t_draft = self.t_verify = self.t_sample = 0.0
        self._proc = psutil.Process()
        self.peak_rss = self._proc.memory_info().rss

    @property
    def n_generated(self) -> int:
        return len(self.tokens)

    def decoding(self) -> None:
        """Prompt processing is over: decode time starts now."""
        self.t_decode0 = time.perf_counter()

    def step(self, new: list[int], origins: list[bool], drafted: int, accepted: int,
             t0: float, t1: float, t2: float, t3: float, source: str | None = None) -> None:
        """One main-model pass: drafting t0..t1, verifying t1..t2, accepting and rolling back t2..t3."""
        self.tokens.extend(new)
        self.from_draft.extend(origins)
        self.n_drafted += drafted
        self.n_accepted += accepted
        self.t_draft += t1 - t0
        self.t_verify += t2 - t1
        self.t_sample += t3 - t2
        self.steps.append((len(new), drafted, accepted, t3 - self.t_decode0))
        self.sources.append(source)
        if self.ttft is None:
            self.ttft = t3 - self.t_start
        self.peak_rss = max(self.peak_rss, self._proc.memory_info().rss)

    def drop(self, n: int) -> None:
        """Take the last `n` tokens back (they began a stop string), with their counts, latest steps first."""
        i = len(self.steps) - 1
        while n > 0 and i >= 0:
            tokens, drafted, accepted, t = self.steps[i]
            take = min(n, tokens)
            if take:
                acc = sum(self.from_draft[-take:])
                del self.tokens[-take:], self.from_draft[-take:]
                self.n_accepted -= acc
                self.n_drafted -= acc
                self.steps[i] = (tokens - take, drafted - acc, accepted - acc, t)
                n -= take
            i -= 1

    def result(self, *, mode: str, text: str, stop_reason: str, n_prompt: int, n_cached: int, memory: MemoryParts,
               auto: dict | None, dropped_turns: int, seed: int, draft_prompt: tuple[int, float]) -> GenerationResult:
        t_end = time.perf_counter()
        t_decode = t_end - self.t_decode0
        n, passes = self.n_generated, len(self.steps)
        return GenerationResult(
            mode=mode, text=text, tokens=self.tokens, from_draft=self.from_draft, stop_reason=stop_reason,
            n_prompt=n_prompt, n_prompt_cached=n_cached, t_prompt=self.t_decode0 - self.t_start,
            ttft=self.ttft if self.ttft is not None else t_end - self.t_start,
            n_generated=n, t_decode=t_decode, decode_tps=n / t_decode if t_decode > 0 and n else 0.0,
            n_drafted=self.n_drafted, n_accepted=self.n_accepted,
            acceptance=self.n_accepted / self.n_drafted if self.n_drafted else None,
            n_passes=passes, tokens_per_pass=n / passes if passes else 0.0,
            t_draft=self.t_draft, t_verify=self.t_verify, t_sample=self.t_sample,
            draft_share=self.t_draft / t_decode if t_decode > 0 else 0.0,
            peak_rss=self.peak_rss, memory=memory, auto=auto, steps=self.steps, dropped_turns=dropped_turns,
            seed=seed, step_sources=self.sources, draft_prompt_tokens=draft_prompt[0], t_draft_prompt=draft_prompt[1],
        )


class _Text:
    """The output text: tokens decoded as UTF-8 (a character split across tokens is emitted once whole), cut at
    the first stop string. Text that could still be the start of a stop string is held back from the pieces
    until the next tokens tell; the tokens that begin at or after the stop string's start are dropped, however
    the steps grouped them, so every mode ends on the same tokens."""

    def __init__(self, piece: Callable[[int], bytes], stops: tuple[str, ...]):
        self._piece = piece
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._stops = tuple(x for x in stops if x)
        self._longest = max((len(x) for x in self._stops), default=0)
        self.text = ""
        self._starts: list[int] = []  # where each kept token's text begins
        self._shown = 0  # characters of `text` handed out as pieces
        self.stopped = False

    def add(self, tokens: list[int], final: bool) -> tuple[list[str], int]:
        """Decode `tokens`; return what each of them that is kept shows now, and how many tokens (of these and,
        when a stop string began in an earlier step, of those too) begin at or after a stop string and are
        dropped. `final`: no tokens follow, so nothing is held back."""
        before, first = len(self.text), len(self._starts)  # first: index of this step's first token
        for t in tokens:
            self._starts.append(len(self.text))
            self.text += self._utf8.decode(self._piece(t))
        dropped = 0
        if self._stops:
            hits = [i for i in (self.text.find(x, max(0, before - self._longest)) for x in self._stops) if i >= 0]
            if hits:
                cut = min(hits)
                self.text, self.stopped = self.text[:cut], True
                dropped = sum(1 for s in self._starts if s >= cut)
                del self._starts[len(self._starts) - dropped:]
        visible = len(self.text) if final or self.stopped else len(self.text) - self._held_back()
        pieces = []
        for i in range(first, len(self._starts)):  # this step's tokens that are kept
            end = self._starts[i + 1] if i + 1 < len(self._starts) else len(self.text)
            upto = max(self._shown, min(end, visible))
            pieces.append(self.text[self._shown:upto])
            self._shown = upto
        return pieces, dropped

    def _held_back(self) -> int:
        """How many characters at the end of the text could begin a stop string."""
        for n in range(min(self._longest - 1, len(self.text)), 0, -1):
            tail = self.text[-n:]
            if any(x.startswith(tail) for x in self._stops):
                return n
        return 0

    def finish(self) -> str:
        """The whole text; a character left incomplete by the last token is flushed unless a stop cut it off."""
        return self.text if self.stopped else self.text + self._utf8.decode(b"", final=True)


def check_memory(main: Path, draft: Path | None, n_ctx: int, n_gpu_layers: int = 0) -> None:
    """Refuse, before loading, a setup whose estimated need exceeds the memory it would live in: system RAM,
    and for offloaded layers the GPU's (see speclocal.models.devices.memory_pools)."""
    from speclocal.formatting import fmt_bytes
    from speclocal.models.gguf_info import LLAMA_CTX_PAD, estimate_memory, read_gguf

    infos = [read_gguf(main)] + ([read_gguf(draft)] if draft else [])
    est = estimate_memory(infos[0], infos[1] if draft else None, n_ctx)
    parts = [(m.weights, m.kv_cache, m.compute, info.n_layer) for m, info in zip(est.models, infos)]
    short = next((p for p in memory_pools(parts, est.ram_available, n_gpu_layers, devices()) if not p.fits), None)
    if short is None:
        return
    per_token = sum(m.kv_bytes_per_token for m in infos)
    fixed = short.need - per_token * est.n_ctx
    fits = (short.available - fixed) // per_token // LLAMA_CTX_PAD * LLAMA_CTX_PAD if per_token else 0
    hint = f"-c {fits} would fit" if fits >= LLAMA_CTX_PAD else "a smaller model is needed"
    if short.pool != "system RAM":
        hint += " (or fewer layers on the GPU: a lower -ngl)"
    detail = ", ".join(f"{m.role} {fmt_bytes(m.weights)} weights + {fmt_bytes(m.kv_cache)} KV + "
                       f"{fmt_bytes(m.compute)} buffers" for m in est.models)
    raise SpeclocalError(f"not enough memory: -c {n_ctx} needs ~{fmt_bytes(short.need)} of {short.pool} ({detail}) "
                         f"but {fmt_bytes(short.available)} is available; {hint}, or pass --force to load anyway")


def _require_compatible(main: Path, draft: Path) -> None:
    """Refuse a pair llama.cpp would refuse, with the inspector's verdict."""
    from speclocal.models.gguf_info import check_compat, read_gguf

    verdict = check_compat(read_gguf(main), read_gguf(draft))
    if not verdict.ok:
        raise SpeclocalError(f"{draft.name} cannot draft for {main.name}: {verdict.detail}")
