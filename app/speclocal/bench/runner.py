"""Running the benchmark: methods, the measurement loop, progress with ETA, interruption.

One generation at a time, always. Every measured run starts from cleared KV caches (a cached prompt
would inflate speed), uses the same seed and sampling, and the method order alternates from one
prompt (and repetition) to the next so slow drift of the machine does not favour one method. With
`bracket` (the default of a full run) plain runs both before and after the other methods of each
prompt turn, and each method is paired with the mean of the two: a change of the machine's speed
during the turn then moves the method and its baseline together. With `remeasure`, the cost curve is
measured again every `profile_every_s` seconds (between prompts, and at the end), so the cost model is
checked against curves measured around each run, not one taken at the start of a long bench.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Callable, Collection, TextIO

from speclocal import options
from speclocal.bench.ceiling import hindsight_speedup
from speclocal.drafts import MODES, STORE_MODES, needs_draft_model
from speclocal.engine import DraftParams, Engine, GenerationRequest, GenerationResult, Sampling
from speclocal.engine.equivalence import NEAR_TIE, compare_outputs
from speclocal.errors import SpeclocalError
from speclocal.files import atomic_write
from speclocal.interrupt import cancel_on_signals
from speclocal.policy.costmodel import CostCurve
from speclocal.suite import Question

METHOD_KINDS = MODES  # one method kind per engine mode: plain, spec, lookup, suffix, auto
WARMUP_PROMPT = "Write a Python function that adds two numbers."
WARMUP_N = 8
AUTO_LOOKUP_MAX = options.default("lookup_max")  # auto's cap for model-free drafts, whatever the kK grids
SUFFIX_MAX = options.default("lookup_max")  # suffix-kK: the suffix drafter picks its own length below the cap


@dataclass(frozen=True)
class Method:
    name: str  # "plain", "spec-k3", "lookup-k4", "suffix-k16", "auto"
    mode: str  # the engine mode
    k: int  # draft length (0 for plain; for auto the most draft-model tokens a step drafts)
    lookup_k: int = 0  # auto: the most model-free (lookup, suffix) tokens a step drafts

    @property
    def uses_draft_model(self) -> bool:
        return needs_draft_model(self.mode)


def parse_int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpeclocalError(f"{flag} takes comma-separated integers, e.g. 2,4,8; got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise SpeclocalError(f"{flag} values must be >= 1, got {text!r}")
    return list(dict.fromkeys(values))


def parse_methods(names: list[str] | None, draft_max: list[int], lookup_max: list[int],
                  suffix_max: list[int] | None = None) -> list[Method]:
    """Method kinds -> concrete methods; plain always runs first (it is the baseline of every pair)."""
    names = list(METHOD_KINDS) if names is None else names
    unknown = [n for n in names if n not in METHOD_KINDS]
    if unknown:
        raise SpeclocalError(f"unknown method {unknown[0]!r} (choose from {', '.join(METHOD_KINDS)})")
    out = [Method("plain", "plain", 0)]
    for kind in dict.fromkeys(names):
        if kind == "spec":
            out += [Method(f"spec-k{k}", "spec", k) for k in draft_max]
        elif kind == "lookup":
            out += [Method(f"lookup-k{k}", "lookup", k) for k in lookup_max]
        elif kind == "suffix":
            out += [Method(f"suffix-k{k}", "suffix", k) for k in (suffix_max or [SUFFIX_MAX])]
        elif kind == "auto":
            out.append(Method("auto", "auto", max(draft_max), AUTO_LOOKUP_MAX))
    return out


def run_order(methods: list[Method], i: int, bracket: bool) -> list[Method]:
    """The methods of the i-th prompt in run order, forward and backward in turn; bracketed, plain (the
    first method) runs first and last and the others alternate between."""
    if bracket and len(methods) > 1:
        others = methods[1:] if i % 2 == 0 else methods[:0:-1]
        return [methods[0], *others, methods[0]]
    return methods if i % 2 == 0 else methods[::-1]


@dataclass
class BenchSettings:
    n_predict: int
    reps: int
    sampling: Sampling
    draft_min: int = 0
    draft_p_min: float = 0.0
    stability_n: int = 0  # 0 = no stability run
    equivalence: bool = True
    bracket: bool = False  # plain before and after the other methods of each prompt turn
    # the suffix store: off (default), or read as it was when the bench started by every run, and given
    # what suffix and auto runs produced (one per prompt turn) only when the bench ends
    store: bool = False

    def to_dict(self) -> dict:
        return {"n_predict": self.n_predict, "reps": self.reps, "sampling": asdict(self.sampling),
                "greedy": self.sampling.greedy, "draft_min": self.draft_min, "draft_p_min": self.draft_p_min,
                "stability_n": self.stability_n, "equivalence_check": self.equivalence,
                "bracket_plain": self.bracket, "store": self.store}


@dataclass
class Task:
    """One measured generation to come: a question's turn, by one method, in one repetition."""

    phase: str  # suite | stability
    question: Question
    rep: int
    n_predict: int
    cost: float  # estimated seconds-ish units, for the ETA
    order: int = 0  # run_order's key: the prompt's place in its repetition plus the repetition, so the method
    # order flips from one prompt to the next and, for each prompt, from one repetition to the next


def jsonable(x):
    """Dataclasses, numpy scalars and tuples -> plain JSON types (for the auto explanation)."""
    if is_dataclass(x) and not isinstance(x, type):
        return jsonable(asdict(x))
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if hasattr(x, "item"):
        try:
            return x.item()
        except (TypeError, ValueError):
            pass
    return str(x)


def draft_memory_added(method: Method, res: GenerationResult) -> int:
    """What the draft costs in memory for this method: weights + KV of the draft model, if it uses one."""
    return res.memory.draft_total if method.uses_draft_model else 0


def record_of(res: GenerationResult, method: Method, task: Task, turn: int, order: int) -> dict:
    """One run for results.json: where it belongs in the plan, and the engine's own result (without the token
    ids)."""
    q = task.question
    rec = {
        "phase": task.phase, "category": q.category, "question_id": q.question_id, "turn": turn, "rep": task.rep,
        "order": order, "method": method.name, "k": method.k, "n_predict": task.n_predict,
        **jsonable(res.to_dict(steps=True, tokens=False)),
        "draft_memory_added": draft_memory_added(method, res), "equivalence": None,
        # other work on the machine skews timing: the 1-minute load average when the run ended (includes ours)
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    if rec["auto"] is None:
        del rec["auto"]
    return rec


class Progress:
    """One line on stderr: done/total, the current run, elapsed and ETA (cost-weighted)."""

    def __init__(self, total_cost: float, total_runs: int, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.total_cost = max(total_cost, 1e-9)
        self.total_runs = total_runs
        self.done_cost = 0.0
        self.done_runs = 0
        self.t0 = time.monotonic()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._width = 0

    @staticmethod
    def _clock(s: float) -> str:
        s = int(round(s))
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"

    def line(self, label: str) -> str:
        elapsed = time.monotonic() - self.t0
        frac = self.done_cost / self.total_cost
        eta = "?" if self.done_cost <= 0 else self._clock(elapsed / self.done_cost * (self.total_cost - self.done_cost))
        width = 20
        bar = "#" * int(frac * width) + "-" * (width - int(frac * width))
        return (f"bench [{bar}] {frac:4.0%} {self.done_runs}/{self.total_runs} runs | {label} | "
                f"elapsed {self._clock(elapsed)} | ETA {eta}")

    def show(self, label: str, transient: bool = False) -> None:
        """Redraw the line; `transient` lines (a run starting) are skipped when stderr is not a terminal."""
        if transient and not self.tty:
            return
        text = self.line(label)
        if self.tty:
            import shutil

            text = text[: max(20, shutil.get_terminal_size().columns - 1)]
            pad = max(0, self._width - len(text))
            self.stream.write("\r" + text + " " * pad)
            self._width = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def advance(self, cost: float, label: str) -> None:
        self.done_cost += cost
        self.done_runs += 1
        self.show(label)

    def finish(self) -> None:
        if self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()


class _Interrupted(Exception):
    """Ctrl-C/SIGTERM arrived: stop measuring, keep what is finished."""


class BenchRunner:
    """Executes the plan on one engine; `records` holds every finished measurement, even after Ctrl-C."""

    def __init__(self, engine: Engine, methods: list[Method], questions: list[Question],
                 stability: list[Question], settings: BenchSettings,
                 progress_stream: TextIO | None = None,
                 on_record: Callable[[dict], None] | None = None,
                 profiles: list[dict] | None = None, remeasure: Callable[[], dict] | None = None,
                 profile_every_s: float = 0.0, done: Collection[tuple] = frozenset(),
                 priors_file: Path | None = None):
        self.engine = engine
        self.priors_file = priors_file  # where auto learns (the warm-up's lessons are forgotten)
        self.methods = methods
        self.questions = questions
        self.stability = stability if settings.stability_n > 0 else []
        self.s = settings
        self.records: list[dict] = []
        self.warmup: list[dict] = []
        self.partial = False
        self.on_record = on_record
        self.progress_stream = progress_stream
        self.to_store: dict[tuple, tuple[list[int], list[int]]] = {}  # (question, turn) -> prompt, output
        self.store_info: dict | None = None
        # cost curves measured so far, the first the one the bench started with; each record's "profile" is the
        # index of the last one measured before it
        self.profiles: list[dict] = list(profiles or [])
        self.remeasure = remeasure
        self.profile_every_s = profile_every_s
        self._profiled_at = time.monotonic()
        # prompts' repetitions finished in earlier sittings (`--resume`) are not run again
        self.tasks = [t for t in self._plan() if (t.phase, t.question.question_id, t.rep) not in done]
        runs_per_turn = len(run_order(methods, 0, settings.bracket))
        self.total_runs = sum(len(t.question.turns) for t in self.tasks) * runs_per_turn

    # ---- planning -------------------------------------------------------------------------------
    def _tokens(self, text: str) -> int:
        return len(self.engine.main.tokenize(text, add_special=False))

    def _plan(self) -> list[Task]:
        tasks: list[Task] = []
        cost: dict[str, float] = {}
        for q in self.questions + self.stability:
            n = self.s.n_predict if q not in self.stability else self.s.stability_n
            turn_tokens = [self._tokens(t) + 12 for t in q.turns]  # + chat-template tokens per turn
            need = sum(turn_tokens) + n * len(q.turns) + 32
            if need > self.engine.main.n_ctx:
                raise SpeclocalError(
                    f"question {q.question_id} needs about {need} tokens of context ({sum(turn_tokens)} prompt + "
                    f"{len(q.turns)} x {n} generated), the context is {self.engine.main.n_ctx}: raise -c/--ctx-size")
            # decode ~1 unit per token; prompt processing some 2.5x cheaper per token (a rough weight for the ETA)
            c = 0.0
            for i in range(len(turn_tokens)):
                c += n + (sum(turn_tokens[: i + 1]) + i * n) / 2.5
            cost[q.question_id] = c
        for rep in range(self.s.reps):
            for j, q in enumerate(self.questions):
                tasks.append(Task("suite", q, rep, self.s.n_predict, cost[q.question_id], order=j + rep))
        for j, q in enumerate(self.stability):
            tasks.append(Task("stability", q, 0, self.s.stability_n, cost[q.question_id], order=j))
        return tasks

    def _request(self, method: Method, messages: list[dict], n: int) -> GenerationRequest:
        k = max(method.k, 1)
        caps = {"lookup": dict(lookup_max=k), "suffix": dict(lookup_max=k),
                "auto": dict(max=k, lookup_max=method.lookup_k)}.get(method.mode, dict(max=k))
        return GenerationRequest(messages=tuple(messages), mode=method.mode, n_predict=n, sampling=self.s.sampling,
                                 draft=DraftParams(min=self.s.draft_min, p_min=self.s.draft_p_min, **caps),
                                 store="read" if self.s.store else "off")

    # ---- running --------------------------------------------------------------------------------
    def run(self) -> bool:
        """Run everything. Ctrl-C (SIGINT) or SIGTERM stops within one decoding step: the run in progress
        is dropped, every finished one is kept, `partial` is set. Returns True when complete."""
        total_cost = sum(t.cost for t in self.tasks)
        progress = Progress(total_cost, self.total_runs, self.progress_stream)
        self._store_before = self._store_size() if self.s.store else None
        self._cancel = threading.Event()
        try:
            with cancel_on_signals(self._cancel):
                progress.show("warm-up")
                self._warm_up()
                for task in self.tasks:
                    self._reprofile(progress)
                    self._run_task(task, run_order(self.methods, task.order, self.s.bracket), progress,
                                   task.cost / max(1, len(task.question.turns)))
                self._reprofile(progress)
        except (KeyboardInterrupt, _Interrupted):
            self.partial = True
        finally:
            progress.finish()
        if self.s.store:
            self._fill_store()
        return not self.partial

    def _reprofile(self, progress: Progress) -> None:
        """Measure the cost curve again once `profile_every_s` has passed since the last one, if a run came
        after that one (between prompts, and at the end)."""
        if self.remeasure is None or self.profile_every_s <= 0 or self._cancel.is_set():
            return
        last = len(self.profiles) - 1
        if time.monotonic() - self._profiled_at < self.profile_every_s or not any(
                r.get("profile") == last for r in self.records):
            return
        progress.show("measuring the cost curve again")
        self.profiles.append(self.remeasure())
        self._profiled_at = time.monotonic()

    def _fill_store(self) -> None:
        """With --store: add what the suffix and auto runs produced (one output per prompt turn, its first)
        now that every run has read the store as it was at the start."""
        store = self.engine.suffix_store()
        if store is None:
            return
        before = self._store_before
        added = 0
        for prompt, output in self.to_store.values():
            try:
                added += store.add(prompt, output)
            except (OSError, ValueError) as e:  # a full disk costs the store, not the bench's results
                print(f"speclocal bench: could not add to the suffix store: {e}", file=sys.stderr)
                break
        self.store_info = {"directory": str(store.directory), "before": before, "tokens_added": added,
                           "after": self._store_size()}

    def _store_size(self) -> dict | None:
        store = self.engine.suffix_store()
        if store is None:
            return None
        return {"generations": store.n_generations, "tokens": store.n_tokens, "bytes": store.bytes_on_disk}

    def _generate(self, req: GenerationRequest) -> GenerationResult:
        if self._cancel.is_set():
            raise _Interrupted
        self.engine.reset()
        res = self.engine.generate(req, cancel=self._cancel)
        if self._cancel.is_set() or res.stop_reason == "cancelled":
            raise _Interrupted
        return res

    def _warm_up(self) -> None:
        """One short generation per method, so no measured run pays first-call costs; not measured, and what auto
        learnt from it forgotten (`priors_file` as it was)."""
        p = self.priors_file
        before = p.read_bytes() if p is not None and p.is_file() else None
        for m in self.methods:
            res = self._generate(self._request(m, [{"role": "user", "content": WARMUP_PROMPT}], WARMUP_N))
            self.warmup.append({"method": m.name, "n_generated": res.n_generated, "decode_tps": res.decode_tps})
        self.engine.reset()
        if p is not None:
            if before is None:
                p.unlink(missing_ok=True)
            else:
                atomic_write(p, before)

    def _run_task(self, task: Task, order: list[Method], progress: Progress, turn_cost: float) -> None:
        q = task.question
        history: list[dict] = []
        for turn, content in enumerate(q.turns):
            messages = history + [{"role": "user", "content": content}]
            results: dict[str, tuple[GenerationResult, dict]] = {}  # plain: its first run
            for pos, m in enumerate(order):
                label = f"{q.question_id}" + (f" turn {turn + 1}" if len(q.turns) > 1 else "") + f" {m.name}"
                progress.show(label + " …", transient=True)
                req = self._request(m, messages, task.n_predict)
                res = self._generate(req)
                if self.s.store and m.mode in STORE_MODES and task.phase == "suite":
                    self.to_store.setdefault((q.question_id, turn), (self.engine.prompt_tokens(req), res.tokens))
                rec = record_of(res, m, task, turn, pos)
                if self.profiles:
                    rec["profile"] = len(self.profiles) - 1
                self.records.append(rec)
                results.setdefault(m.name, (res, rec))
                if self.on_record:
                    self.on_record(rec)
                progress.advance(turn_cost / len(order), f"{label} {res.decode_tps:.1f} t/s")
            plain = results["plain"][0]
            prompt = self.engine.prompt_tokens(self._request(self.methods[0], messages, task.n_predict))
            if self.s.sampling.greedy and self.s.equivalence:
                by_position: dict[tuple, dict] = {}  # methods parting from plain at one token share one check
                for name, (res, rec) in results.items():
                    if name == "plain":
                        continue
                    n = min(len(plain.tokens), len(res.tokens))
                    i = next((j for j in range(n) if plain.tokens[j] != res.tokens[j]), n)
                    key = (i, i == n)
                    if key not in by_position:
                        by_position[key] = asdict(compare_outputs(self.engine, prompt, plain.tokens, res.tokens))
                    rec["equivalence"] = dict(by_position[key], compared=n, near_tie_threshold=NEAR_TIE)
                self.engine.reset()
            if self.s.sampling.greedy and self.profiles:  # what copying could give here at best (not timed)
                results["plain"][1]["hindsight"] = hindsight_speedup(prompt, plain.tokens,
                                                                     CostCurve.from_dict(self.profiles[-1]))
            if self.on_record:  # the turn's checks are on its records now: on disk too, before the next run
                self.on_record(results["plain"][1])
            # every method's next turn continues from the same conversation: the main model's own (plain) answer
            history = messages + [{"role": "assistant", "content": plain.text}]
