"""The engine: a loaded main (+ optional draft) model and one decode loop for every mode.

Plain decoding is the same loop with a drafter that proposes nothing, so the modes differ only in
drafting and comparisons between them are fair.
"""

from __future__ import annotations

import codecs
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import psutil

from speclocal.engine.chat import render_chat
from speclocal.engine.drafters import Draft, Drafter, DraftParams, ModelDrafter, PromptLookupDrafter
from speclocal.engine.llama import LoadedModel, default_threads
from speclocal.engine.sampling import Sampling, accept_or_resample, probabilities, sample
from speclocal.engine.types import GenerationResult, MemoryParts, StepEvent
from speclocal.errors import SpeclocalError

Mode = Literal["plain", "spec", "lookup", "auto"]
MODES: tuple[str, ...] = ("plain", "spec", "lookup", "auto")
AUTO_K_CAP = 16  # auto picks its own draft length, up to this


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate. Give `messages` (chat, through the model's template) or `prompt` (raw)."""

    messages: tuple[dict, ...] | None = None
    prompt: str | None = None
    mode: Mode = "spec"
    n_predict: int = 256
    sampling: Sampling = field(default_factory=Sampling)
    draft: DraftParams = field(default_factory=DraftParams)
    stop: tuple[str, ...] = ()
    task: str | None = None  # auto mode: code | edit | json | chat | creative; None = detect from the prompt

    def __post_init__(self) -> None:
        if (self.messages is None) == (self.prompt is None):
            raise SpeclocalError("give either chat messages or a raw prompt")
        if self.mode not in MODES:
            raise SpeclocalError(f"unknown mode {self.mode!r} (choose from {', '.join(MODES)})")
        if self.n_predict < 1:
            raise SpeclocalError(f"-n/--n-predict must be >= 1, got {self.n_predict}")
        if self.mode in ("spec", "lookup") and self.draft.max < 1:
            raise SpeclocalError(f"--draft-max must be >= 1 for mode {self.mode!r} (use --mode plain for no drafts)")


class Engine:
    """Load a main model (and optionally a draft model) once; generate many times.

    Threads: generations are serialised by a lock. Keep llama.cpp calls to one live thread at a time
    (the main thread, or worker threads that end): llama.cpp's OpenMP keeps a thread pool per calling
    thread, and with two pools alive on a machine with no spare cores it stops spinning at barriers,
    which costs about 30 % of decode speed on 2 cores (docs/benchmarks.md)."""

    def __init__(self, main_path: str | Path, draft_path: str | Path | None = None, n_ctx: int = 4096,
                 n_threads: int | None = None, n_gpu_layers: int = 0, check_pair: bool = True,
                 force: bool = False):
        if n_ctx < 16:
            raise SpeclocalError(f"-c/--ctx-size must be >= 16, got {n_ctx}")
        if not force:
            check_memory(Path(main_path), Path(draft_path) if draft_path else None, n_ctx)
        self.n_threads = n_threads or default_threads()
        self.n_gpu_layers = n_gpu_layers
        self._curve = None
        if draft_path is not None and check_pair:
            _require_compatible(Path(main_path), Path(draft_path))
        self.main = LoadedModel(Path(main_path), n_ctx, self.n_threads, n_gpu_layers)
        self.draft = LoadedModel(Path(draft_path), n_ctx, self.n_threads, n_gpu_layers) if draft_path else None
        self._lookup: PromptLookupDrafter | None = None
        self._lock = threading.Lock()
        self._warm_up()

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
        if req.messages is not None:
            tokens = self._chat_tokens(list(req.messages))
        else:
            tokens = self.main.tokenize(req.prompt or "", add_special=True)
        if not tokens:
            raise SpeclocalError("the prompt is empty")
        if len(tokens) >= self.main.n_ctx:
            raise SpeclocalError(
                f"prompt is {len(tokens)} tokens, context is {self.main.n_ctx}: shorten it or raise -c/--ctx-size"
            )
        return tokens

    def _drafter(self, req: GenerationRequest) -> Drafter:
        if req.mode == "plain":
            return Drafter()
        if req.mode == "lookup":
            if self._lookup is None or self._lookup.params != req.draft:
                self._lookup = PromptLookupDrafter(req.draft)
            return self._lookup
        if req.mode == "auto":
            return self._auto_drafter(req)
        if self.draft is None:
            raise SpeclocalError("mode 'spec' needs a draft model (-md/--model-draft or a pair)")
        return ModelDrafter(self.draft, req.draft, self.main.n_vocab)

    def cost_curve(self, refresh: bool = False, max_age_s: float | None = None):
        """This machine's measured cost curve for the loaded pair (cached on disk; see `speclocal profile`);
        `max_age_s` re-measures a cached curve older than that."""
        from speclocal.policy.profile import load_or_measure  # policy sits above the engine: import late

        if self._curve is None or refresh or max_age_s is not None:
            self._curve, _ = load_or_measure(self, refresh=refresh, max_age_s=max_age_s)
        return self._curve

    def _auto_drafter(self, req: GenerationRequest) -> Drafter:
        from speclocal.policy.auto import AutoDrafter
        from speclocal.tasks import TASKS, detect_task

        if req.task is not None and req.task not in TASKS:
            raise SpeclocalError(f"unknown task type {req.task!r} (choose from {', '.join(TASKS)})")
        text = req.prompt if req.messages is None else next(
            (m["content"] for m in reversed(req.messages) if m.get("role") == "user"), "")
        model = ModelDrafter(self.draft, req.draft, self.main.n_vocab) if self.draft else None
        return AutoDrafter(self.cost_curve(), req.task or detect_task(text), model, PromptLookupDrafter(req.draft))

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

    def memory(self) -> MemoryParts:
        d = self.draft
        return MemoryParts(self.main.weights_bytes, d.weights_bytes if d else 0, self.main.kv_bytes, d.kv_bytes if d else 0)

    # ---- the decode loop --------------------------------------------------------------------
    def generate(self, req: GenerationRequest, on_step: Callable[[StepEvent], None] | None = None,
                 cancel: threading.Event | None = None) -> GenerationResult:
        """Run one generation. `cancel` is checked before each step; a cancelled run returns what it has."""
        with self._lock:
            return self._generate(req, on_step, cancel)

    def _generate(self, req, on_step, cancel) -> GenerationResult:
        main = self.main
        prompt = self.prompt_tokens(req)
        drafter = self._drafter(req)
        s = req.sampling
        rng = np.random.default_rng(s.seed)
        proc = psutil.Process()
        peak_rss = proc.memory_info().rss
        utf8 = codecs.getincrementaldecoder("utf-8")("replace")

        t_start = time.perf_counter()
        cached = main.reuse_prefix(prompt[:-1], keep_last=False)
        main.eval(prompt[cached:-1], outputs="none")
        drafter.prepare(prompt)
        t_decode0 = time.perf_counter()

        history = list(prompt)  # main's KV holds history[:-1]; history[-1] is the pending token
        out_tokens: list[int] = []
        from_draft: list[bool] = []
        text = ""
        steps: list[tuple[int, int, int, float]] = []
        n_drafted = n_accepted = 0
        t_draft = t_verify = t_sample = 0.0
        ttft = None
        stop_reason = "length"
        max_stop = max((len(x) for x in req.stop), default=0)

        while len(out_tokens) < req.n_predict:
            if cancel is not None and cancel.is_set():
                stop_reason = "cancelled"
                break
            room = main.n_ctx - len(main.tokens) - 1
            if room < 0:
                stop_reason = "context"
                break
            k = min(AUTO_K_CAP if req.mode == "auto" else req.draft.max, req.n_predict - len(out_tokens) - 1, room)
            ta = time.perf_counter()
            draft = drafter.draft(history, k, s, rng) if k > 0 else Draft([], None)
            tb = time.perf_counter()
            base = len(main.tokens)
            rows = main.eval([history[-1]] + draft.tokens, outputs="all")
            tc = time.perf_counter()
            new, n_acc = self._accept(rows, draft, s, rng)
            drafter.observe(len(draft.tokens), n_acc)
            eog_at = next((i for i, t in enumerate(new) if main.is_eog(t)), None)
            if eog_at is not None:
                new = new[:eog_at]
                n_acc = min(n_acc, eog_at)
                stop_reason = "eos"
            main.truncate(base + len(new))  # the KV cache holds history[:-1]: up to, not including, the last new token
            td = time.perf_counter()
            pieces = [utf8.decode(main.piece(t)) for t in new]
            history.extend(new)
            out_tokens.extend(new)
            origins = [i < n_acc for i in range(len(new))]
            from_draft.extend(origins)
            prev_len = len(text)
            text += "".join(pieces)
            n_drafted += len(draft.tokens)
            n_accepted += n_acc
            t_draft += tb - ta
            t_verify += tc - tb
            t_sample += td - tc
            steps.append((len(new), len(draft.tokens), n_acc, td - t_decode0))
            if ttft is None:
                ttft = td - t_start
            if max_stop:
                hit = _find_stop(text, req.stop, max(0, prev_len - max_stop))
                if hit is not None:
                    text = text[:hit]
                    stop_reason = "stop"
            peak_rss = max(peak_rss, proc.memory_info().rss)
            if on_step is not None:
                on_step(StepEvent(new, pieces, origins, len(draft.tokens), n_acc, tb - ta, tc - tb, td - tc,
                                  len(out_tokens), td - t_decode0))
            if stop_reason in ("eos", "stop"):
                break
        text += utf8.decode(b"", final=True)

        t_end = time.perf_counter()
        t_decode = t_end - t_decode0
        auto = None
        if req.mode == "auto":
            auto = drafter.explain()
            drafter.learn()
        n_gen = len(out_tokens)
        n_passes = len(steps)
        return GenerationResult(
            mode=req.mode, text=text, tokens=out_tokens, from_draft=from_draft, stop_reason=stop_reason,
            n_prompt=len(prompt), n_prompt_cached=cached, t_prompt=t_decode0 - t_start,
            ttft=ttft if ttft is not None else t_end - t_start,
            n_generated=n_gen, t_decode=t_decode, decode_tps=n_gen / t_decode if t_decode > 0 and n_gen else 0.0,
            n_drafted=n_drafted, n_accepted=n_accepted,
            acceptance=n_accepted / n_drafted if n_drafted else None,
            n_passes=n_passes, tokens_per_pass=n_gen / n_passes if n_passes else 0.0,
            t_draft=t_draft, t_verify=t_verify, t_sample=t_sample,
            draft_share=t_draft / t_decode if t_decode > 0 else 0.0,
            peak_rss=peak_rss, memory=self.memory(), auto=auto, steps=steps,
        )

    @staticmethod
    def _accept(rows: np.ndarray, draft: Draft, s: Sampling, rng: np.random.Generator) -> tuple[list[int], int]:
        """Verify drafted tokens against the main model's rows; return the new tokens and how many
        of them were accepted drafts (the last new token always comes from the main model)."""
        drafted = draft.tokens
        if s.greedy:
            targets = rows.argmax(axis=1)
            n = 0
            while n < len(drafted) and drafted[n] == targets[n]:
                n += 1
            return drafted[:n] + [int(targets[n])], n
        for i, x in enumerate(drafted):
            p = probabilities(rows[i], s)
            if draft.q is not None:
                q = draft.q[i]
            else:
                q = np.zeros_like(p)
                q[x] = 1.0
            ok, tok = accept_or_resample(p, q, x, rng)
            if not ok:
                return drafted[:i] + [tok], i
        return drafted + [sample(probabilities(rows[len(drafted)], s), rng)], len(drafted)

    def close(self) -> None:
        self.main.close()
        if self.draft:
            self.draft.close()


def _find_stop(text: str, stops: tuple[str, ...], start: int) -> int | None:
    hits = [i for i in (text.find(x, start) for x in stops if x) if i >= 0]
    return min(hits) if hits else None


def check_memory(main: Path, draft: Path | None, n_ctx: int) -> None:
    """Refuse, before loading, a setup whose estimated need exceeds the RAM available now."""
    from speclocal.models.gguf_info import LLAMA_CTX_PAD, estimate_memory, read_gguf

    infos = [read_gguf(main)] + ([read_gguf(draft)] if draft else [])
    est = estimate_memory(infos[0], infos[1] if draft else None, n_ctx)
    if est.total <= est.ram_available:
        return
    gib = lambda n: f"{n / 2**30:.1f} GiB"  # noqa: E731
    per_token = sum(m.kv_bytes_per_token for m in infos)
    fixed = est.total - per_token * est.n_ctx
    fits = (est.ram_available - fixed) // per_token // LLAMA_CTX_PAD * LLAMA_CTX_PAD if per_token else 0
    hint = f"-c {fits} would fit" if fits >= LLAMA_CTX_PAD else "a smaller model is needed"
    parts = ", ".join(f"{m.role} {gib(m.weights)} weights + {gib(m.kv_cache)} KV + {gib(m.compute)} buffers"
                      for m in est.models)
    raise SpeclocalError(f"not enough memory: -c {n_ctx} needs ~{gib(est.total)} ({parts}) but "
                         f"{gib(est.ram_available)} is available; {hint}, or pass --force to load anyway")


def _require_compatible(main: Path, draft: Path) -> None:
    """Refuse a pair llama.cpp would refuse, with the inspector's verdict."""
    from speclocal.models.gguf_info import check_compat, read_gguf

    verdict = check_compat(read_gguf(main), read_gguf(draft))
    if not verdict.ok:
        raise SpeclocalError(f"{draft.name} cannot draft for {main.name}: {verdict.detail}")
