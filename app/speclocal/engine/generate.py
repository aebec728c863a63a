"""The engine: a loaded main (+ optional draft) model, its drafters and store, generating through `loop.decode`.

Plain decoding is the same loop with a drafter that proposes nothing, so the modes differ only in
drafting and comparisons between them are fair. Auto mode's drafter belongs to the policy layer above
the engine: whoever builds the Engine hands it in (`auto_drafter`; `speclocal.policy.open_engine` does).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from speclocal import options
from speclocal.drafts import STORE_MODES, needs_draft_model
from speclocal.engine.chat import render_chat
from speclocal.engine.drafting.base import Drafter, PlainDrafter
from speclocal.engine.drafting.lookup import PromptLookupDrafter
from speclocal.engine.drafting.model import ModelDrafter
from speclocal.engine.drafting.suffix import SuffixDrafter
from speclocal.engine.llama import LoadedModel, TopRows, default_threads
from speclocal.engine.loop import decode
from speclocal.engine.sampling import Sampling, device_top_k
from speclocal.engine.store.store import DEFAULT_MAX_BYTES, SuffixStore
from speclocal.engine.types import GenerationRequest, GenerationResult, MemoryParts, StepEvent
from speclocal.errors import SpeclocalError
from speclocal.models.devices import compute_label, devices, offload_device, resolve_gpu_layers
from speclocal.models.layout import LABELS as LAYOUT_LABELS
from speclocal.models.layout import choose as choose_layout
from speclocal.models.plan import check_load

log = logging.getLogger("speclocal.engine")


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
                 n_ctx: int = options.default("ctx_size"), n_threads: int | None = options.default("threads"),
                 n_gpu_layers: str | int = options.default("n_gpu_layers"), check_pair: bool = True,
                 force: bool = False, auto_drafter: AutoDrafterFactory | None = None,
                 store_dir: str | Path | None = None, store_max_bytes: int = DEFAULT_MAX_BYTES,
                 repack: bool | None = options.default("repack"),
                 backend_sampling: bool | None = options.default("backend_sampling")):
        options.check("ctx_size", n_ctx)
        n_gpu_layers = resolve_gpu_layers(n_gpu_layers)
        found = devices()  # read once for the whole load
        pair = draft_path is not None and check_pair
        if pair or not force:
            check_load(Path(main_path), Path(draft_path) if draft_path else None, n_ctx, n_gpu_layers, found).require(
                pair=pair, memory=not force)
        self.n_threads = n_threads or default_threads()
        self.n_gpu_layers = n_gpu_layers  # as llama.cpp takes it: -1 = every layer
        device = compute_label(n_gpu_layers, found)  # e.g. "CPU (AMD EPYC)", "CUDA0 (...), all layers"
        paths = [Path(main_path)] + ([Path(draft_path)] if draft_path else [])
        # a weight layout that survives a test decode here (probed once per machine), or the one --repack names
        self.layout = choose_layout(paths, device, n_gpu_layers, repack)
        if self.layout.news:  # said once, when found
            logging.getLogger("speclocal.notice").warning("%s", self.layout.note)
        if backend_sampling is None:  # on a GPU the rows' logits would cross the bus: select candidates there
            backend_sampling = n_gpu_layers < 0 and offload_device(found) is not None
        self.backend_sampling = backend_sampling
        load = {"layout": self.layout.layout, "backend_sampling": backend_sampling, "found": found}
        self.main = LoadedModel(paths[0], n_ctx, self.n_threads, n_gpu_layers, n_seq=2, **load)
        self.draft = LoadedModel(paths[1], n_ctx, self.n_threads, n_gpu_layers, **load) if draft_path else None
        self._auto_drafter = auto_drafter
        self._lookup: PromptLookupDrafter | None = None
        self._suffix: SuffixDrafter | None = None
        self.store_dir = Path(store_dir) if store_dir is not None else None
        self.store_max_bytes = store_max_bytes
        self._store: SuffixStore | None = None
        self._lock = threading.Lock()
        self.sample_as(Sampling())  # what a profile measures too
        self._warm_up()
        # the layout named where it is not llama.cpp's default, and sampling on the device (the label keys cost
        # profiles: their curves differ)
        self.compute = (device + LAYOUT_LABELS[self.layout.layout]
                        + (", sampling on the device" if self.backend_sampling else ""))

    @classmethod
    def from_settings(cls, s: options.Settings, need_draft: bool = True, **kw) -> "Engine":
        """The pair, models and load settings (`options.load_args`) of `s` (catalogue ids or paths, resolved in
        `s.models_dir`); the user's suffix store (opened only if a request uses it)."""
        from speclocal import locations
        from speclocal.models.catalogue import resolve_pair

        main, draft = resolve_pair(s.pair or None, s.main or None, s.draft or None, s.models_dir or None)
        kw.setdefault("store_dir", locations.suffix_store_dir())
        return cls(main, draft if need_draft else None, **options.load_args(s), **kw)

    def sample_as(self, s: Sampling) -> None:
        """With backend sampling: as many candidates per row as `s` reads, selected on the device (or full rows
        where it needs them)."""
        if self.backend_sampling:
            for m in (self.main, self.draft):
                if m is not None:
                    m.sample_on_device(device_top_k(s))

    def _warm_up(self) -> None:
        """One pass through each model, so the first timed run does not pay for mmap page faults; where rows are
        to be sampled on the device but llama.cpp refused the chain or the device cannot run the top-k, sampling
        goes back to the host."""
        on_device = True
        for m in (self.main, self.draft):
            if m is not None:
                rows = m.eval([m.bos if m.bos >= 0 else 0], outputs="last")
                on_device = on_device and isinstance(rows, TopRows) and rows.on_device()
                m.clear()
        if self.backend_sampling and not on_device:
            logging.getLogger("speclocal.notice").warning(
                "this device cannot select a row's top-k (llama.cpp's backend sampling): sampling on the host")
            self.backend_sampling = False
            for m in (self.main, self.draft):
                if m is not None:
                    m.sample_on_device(None)

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
            return PlainDrafter()
        for m in (self.main, self.draft if needs_draft_model(req.mode) else None):
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
                           d.kv_bytes if d else 0, self.main.on_devices(), d.on_devices() if d else {})

    # ---- the decode loop --------------------------------------------------------------------
    def generate(self, req: GenerationRequest, on_step: Callable[[StepEvent], None] | None = None,
                 cancel: threading.Event | None = None, drafter: Drafter | None = None) -> GenerationResult:
        """Run one generation. `cancel` is checked before each step; a cancelled run returns what it has.
        `drafter`: use this one instead of the mode's (benchmarks: a synthetic drafter)."""
        with self._lock:
            return self._generate(req, on_step, cancel, drafter)

    def _generate(self, req: GenerationRequest, on_step, cancel, drafter: Drafter | None) -> GenerationResult:
        s = req.sampling.seeded()
        self.sample_as(s)
        prompt, dropped = self._prompt(req)
        drafter = drafter or self.drafter(req)
        out = decode(self.main, drafter, req, prompt, s, on_step, cancel)
        result = out.tally.result(mode=req.mode, text=out.text.finish(), stop_reason=out.stop_reason,
                                  n_prompt=len(prompt), n_cached=out.cached, memory=self.memory(),
                                  auto=drafter.finish(out.tally.n_generated, out.stop_reason), dropped_turns=dropped,
                                  seed=s.seed, draft_prompt=drafter.prompt_work())
        self._remember(req, prompt, result)  # storing is not decoding: the clock stopped in `decode`
        return result

    def close(self) -> None:
        self.main.close()
        if self.draft:
            self.draft.close()
