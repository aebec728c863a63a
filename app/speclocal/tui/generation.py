"""Running a prompt in the App: plain and the speculative mode one after the other in one thread worker,
never concurrently. The worker talks to the UI only through dataclass messages (`tui.messages`), batching
steps so that at most one batch per BATCH_INTERVAL_S reaches the UI however fast decoding is."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Callable

from textual import work
from textual.widgets import TextArea

from speclocal.drafts import MODES, Source
from speclocal.engine.types import GenerationRequest, GenerationResult, StepEvent, same_seed
from speclocal.engine_process import EngineCrashed
from speclocal.errors import SpeclocalError
from speclocal.options import Settings
from speclocal.tasks import detect_task
from speclocal.tui.backend import GenerationBackend
from speclocal.tui.history import LiveMode, RunRecord
from speclocal.tui.messages import ModeFinished, RunFailed, RunFinished, RunStarted, TokensArrived
from speclocal.tui.widgets import HistoryPanel, OutputPane

log = logging.getLogger("speclocal.tui")

BATCH_INTERVAL_S = 0.1  # a worker posts steps at most this often


class Batcher:
    """The `on_step` callback: collects steps in the worker thread, posts one message per interval."""

    def __init__(self, post: Callable, run_id: int, mode: str, interval: float):
        self.post, self.run_id, self.mode, self.interval = post, run_id, mode, interval
        self.steps: list[StepEvent] = []
        self.last = 0.0

    def __call__(self, ev: StepEvent) -> None:
        self.steps.append(ev)
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        if self.steps:
            self.post(TokensArrived(self.run_id, self.mode, self.steps))
            self.steps = []
        self.last = now if now is not None else time.monotonic()


class RunState:
    """The run in progress: its prompt, modes in order, settings, results so far."""

    def __init__(self, run_id: int, prompt: str, task: str, modes: list[str], spec_mode: str | None,
                 settings: Settings, cancel: threading.Event):
        self.run_id, self.prompt, self.task, self.modes = run_id, prompt, task, modes
        self.spec_mode, self.settings, self.cancel = spec_mode, settings, cancel
        self.results: dict[str, GenerationResult] = {}
        self.failed = False
        self.launched = False  # its worker has started (set on the UI thread)
        self.done = threading.Event()


class RunControl:
    """The App's part that starts, streams, stops and records runs (a mixin of SpeclocalApp)."""

    def action_run(self) -> None:
        if self.running:
            self.notify("A run is in progress (esc stops it).", severity="warning")
            return
        if self.backend is None:
            self.notify("The models are not loaded.", severity="warning")
            return
        editor = self.query_one("#prompt", TextArea)
        prompt = editor.text.strip()
        if not prompt:
            self.notify("Type a prompt first.", severity="warning")
            editor.focus()
            return
        s = self.settings
        task = s.task if s.task != "auto" else detect_task(prompt)
        spec_mode = self._spec_mode()
        if s.draft_source == "model" and spec_mode == "lookup":
            self.notify("No draft model is loaded: the speculative run uses prompt lookup.", timeout=4)
        modes = ["plain"] + ([spec_mode] if spec_mode else [])
        if spec_mode and (s.order == "spec-first" or (s.order == "alternate" and self._run_count % 2 == 1)):
            modes.reverse()
        system = [{"role": "system", "content": s.system_prompt}] if s.system_prompt.strip() else []
        messages = tuple(system + self.conversation + [{"role": "user", "content": prompt}])
        requests = same_seed([GenerationRequest.from_settings(s, m, messages=messages, task=task, fit_context=True)
                              for m in modes])
        self._run_count += 1
        run = RunState(self._run_count, prompt, task, modes, spec_mode, s, threading.Event())
        self.current_run = run
        self.live = {}
        header = "› " + " ".join(prompt.split())[:200]
        for pane in self.query(OutputPane):
            pane.begin(header)
            pane.border_subtitle = "waiting"
        if not spec_mode:
            self._pane("spec").begin("Draft source is 'none': only the plain run. Change it in settings (f2).")
            self._pane("spec").border_subtitle = ""
        self._update_spec_title()
        self._set_running(True)
        self._status(f"#{run.run_id} {task}")
        # decoding starts once this frame is drawn, so the redraw does not take CPU from its first tokens
        self.call_after_refresh(self._launch, run, requests, self.backend)

    def _launch(self, run: RunState, requests: list[GenerationRequest], backend: GenerationBackend) -> None:
        if self._current(run.run_id) is None:
            run.done.set()
            return
        run.launched = True
        self._generate(run, requests, backend)

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def _generate(self, run: RunState, requests: list[GenerationRequest], backend: GenerationBackend) -> None:
        first_cached = None  # prompt tokens the first mode found cached: every later mode starts from there too
        try:
            for pos, req in enumerate(requests):
                if run.cancel.is_set():
                    break
                if first_cached is not None:
                    req = replace(req, reuse_limit=first_cached)
                self.post_message(RunStarted(run.run_id, req.mode, pos, len(requests)))
                batcher = Batcher(self.post_message, run.run_id, req.mode, self.batch_interval)
                try:
                    result = backend.generate(req, batcher, run.cancel)
                except SpeclocalError as e:
                    batcher.flush()
                    self.post_message(RunFailed(run.run_id, req.mode, str(e), isinstance(e, EngineCrashed)))
                    break
                except Exception as e:  # noqa: BLE001 - shown to the user instead of a traceback
                    log.exception("generation failed")
                    batcher.flush()
                    self.post_message(RunFailed(run.run_id, req.mode, f"{type(e).__name__}: {e}"))
                    break
                batcher.flush()
                first_cached = result.n_prompt_cached if first_cached is None else first_cached
                self.post_message(ModeFinished(run.run_id, req.mode, result))
            self.post_message(RunFinished(run.run_id, run.cancel.is_set()))
        finally:
            run.done.set()

    def _current(self, run_id: int) -> RunState | None:
        return self.current_run if self.current_run is not None and self.current_run.run_id == run_id else None

    def on_run_started(self, msg: RunStarted) -> None:
        run = self._current(msg.run_id)
        if run is None:
            return
        self.live[msg.mode] = LiveMode(msg.mode)
        self._pane(msg.mode).border_subtitle = f"running ({msg.position + 1}/{msg.n_modes})"
        self._status(f"#{run.run_id} {msg.mode} {msg.position + 1}/{msg.n_modes}…")
        self._refresh_stats()

    def on_tokens_arrived(self, msg: TokensArrived) -> None:
        if self._current(msg.run_id) is None:
            return
        self._pane(msg.mode).append(msg.pieces, msg.from_draft, msg.sources)
        lm = self.live.get(msg.mode)
        if lm is not None:
            lm.add(msg.steps)
        self._stats_with_tokens()

    def on_mode_finished(self, msg: ModeFinished) -> None:
        run = self._current(msg.run_id)
        if run is None:
            return
        r = msg.result
        run.results[msg.mode] = r
        track = getattr(self.probe, "track", None)
        if track is not None and getattr(self.backend, "pid", None) != self._tracked_pid:
            self._tracked_pid = self.backend.pid  # a new engine process after a crash: its RAM from now on
            track(self._tracked_pid)
        lm = self.live.setdefault(msg.mode, LiveMode(msg.mode))
        lm.result = r
        self.memory = r.memory
        if r.store is not None:
            self.store_info = r.store
        self.peak_rss = max(self.peak_rss or 0, r.peak_rss)
        what = "stopped" if r.stop_reason == "cancelled" else f"done ({r.stop_reason})"
        acc = f" · {r.acceptance:.0%} accepted" if r.acceptance is not None else ""
        pane = self._pane(msg.mode)
        pane.border_subtitle = f"{what} · {r.n_generated} tok · {r.decode_tps:.1f} t/s{acc}"
        if r.auto and r.auto.get("sentence"):
            pane.note("auto: " + r.auto["sentence"])
        if r.dropped_turns:
            self.notify(f"The {r.dropped_turns} oldest turn(s) were left out so the chat fits the context.",
                        severity="warning", timeout=6)
        self._refresh_stats()

    def on_run_failed(self, msg: RunFailed) -> None:
        run = self._current(msg.run_id)
        if run is None:
            return
        run.failed = True
        lm = self.live.setdefault(msg.mode, LiveMode(msg.mode))
        lm.failed = msg.error
        pane = self._pane(msg.mode)
        pane.border_subtitle = "failed"
        pane.note(f"failed: {msg.error}" + (" — ctrl+r runs again (the models load again first)"
                                            if msg.crashed else ""))
        self.notify(msg.error, title=f"{Source.of_mode(msg.mode).mode_label if msg.mode in MODES else msg.mode} run failed", severity="error", timeout=8)

    def on_run_finished(self, msg: RunFinished) -> None:
        run = self._current(msg.run_id)
        if run is None:
            return
        self.current_run = None
        self.last_run = run
        self._set_running(False)
        for mode in ("plain", "spec"):
            pane = self._pane(mode)
            if pane.border_subtitle in ("waiting",):
                pane.border_subtitle = "not run"
        complete = not msg.cancelled and not run.failed and all(m in run.results for m in run.modes)
        if complete:
            rec = RunRecord.from_results(run.run_id, run.task, run.prompt, run.modes, run.settings.draft_max,
                                         run.settings.temperature, run.results, self.peak_rss or 0)
            self.history.append(rec)
            self.query_one(HistoryPanel).add(rec, self.history)
            reply = run.results[run.modes[-1]].text  # the last mode's reply is what the KV caches hold
            self.conversation += [{"role": "user", "content": run.prompt}, {"role": "assistant", "content": reply}]
            self._update_turn()
            editor = self.query_one("#prompt", TextArea)
            editor.clear()
            editor.focus()
            sp = f" · {rec.speedup:.2f}x" if rec.speedup is not None else ""
            self._status(f"#{run.run_id} done{sp}")
        elif msg.cancelled:
            self._status(f"#{run.run_id} stopped")
        else:
            self._status(f"#{run.run_id} failed")
        self._update_spec_title()
        self._refresh_stats()

    def action_stop(self) -> None:
        if self.current_run is not None and not self.current_run.cancel.is_set():
            self.current_run.cancel.set()
            self._status("stopping…")
