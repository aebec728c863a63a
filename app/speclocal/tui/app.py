"""The speclocal TUI: a prompt, plain vs speculative side by side, live stats and a history.

Generation runs in one thread worker at a time (plain and speculative one after the other, never
concurrently). The worker only posts dataclass messages, batching tokens so that at most ~12 messages
a second reach the UI however fast decoding is; the stats pane redraws on a 4 Hz timer.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.widgets import Button, Footer, Header, Select, Static, TextArea

from speclocal.errors import SpeclocalError
from speclocal.tui import compositor
from speclocal.tui.backend import (
    GenerationBackend, LoadSpec, ModelPlan, RunRequest, inspect_plan, plan_models,
)
from speclocal.tui.config import Settings, config_dir, save_settings
from speclocal.tui.engine_process import ProcessBackend
from speclocal.tui.messages import (
    BackendLoaded, LoadFailed, ModeFinished, PlanReady, RunFailed, RunFinished, RunStarted, StepInfo, TokensArrived,
)
from speclocal.tui.screens import ChoiceScreen, HelpScreen, LoadingScreen, MissingModelsScreen, SettingsScreen
from speclocal.tasks import detect_task
from speclocal.tui.state import MODE_LABELS, LiveMode, RunRecord, export_history
from speclocal.tui.widgets import HistoryPanel, OutputPane, StatsPane

log = logging.getLogger("speclocal.tui")

BATCH_INTERVAL_S = 0.1  # a worker posts tokens at most this often
STATS_INTERVAL_S = 0.4  # the stats pane redraws this often (the issue asks for >= 2x per second)
MAIN_ONLY = {"run", "stop", "clear", "new_chat", "settings", "toggle_history", "toggle_colour", "save_history"}


class SystemProbe:
    """RSS of speclocal (this process and the engine process, once `track`ed) and system available
    memory (psutil)."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._proc = psutil.Process()
        self._engine = None

    def track(self, pid: int | None) -> None:
        """Count the engine process `pid` (None: no separate engine process) from now on."""
        try:
            self._engine = self._psutil.Process(pid) if pid else None
        except self._psutil.Error:
            self._engine = None

    def __call__(self) -> tuple[int, int]:
        rss = self._proc.memory_info().rss
        if self._engine is not None:
            try:
                rss += self._engine.memory_info().rss
            except self._psutil.Error:  # it has ended; the App reports that on its next call
                self._engine = None
        return rss, self._psutil.virtual_memory().available


class _Batcher:
    """The `on_step` callback: collects steps in the worker thread, posts one message per interval."""

    def __init__(self, post: Callable, run_id: int, mode: str, interval: float):
        self.post, self.run_id, self.mode, self.interval = post, run_id, mode, interval
        self.pieces: list[str] = []
        self.flags: list[bool] = []
        self.steps: list[StepInfo] = []
        self.last = 0.0

    def __call__(self, ev) -> None:
        self.pieces.extend(ev.pieces)
        self.flags.extend(ev.from_draft)
        self.steps.append(StepInfo(len(ev.tokens), ev.drafted, ev.accepted, ev.t_draft, ev.t_verify, ev.t_sample,
                                   ev.n_generated, ev.elapsed))
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        if self.steps:
            self.post(TokensArrived(self.run_id, self.mode, self.pieces, self.flags, self.steps))
            self.pieces, self.flags, self.steps = [], [], []
        self.last = now if now is not None else time.monotonic()


class _Run:
    """The run in progress."""

    def __init__(self, run_id: int, prompt: str, task: str, modes: list[str], spec_mode: str | None,
                 settings: Settings, cancel: threading.Event):
        self.run_id, self.prompt, self.task, self.modes = run_id, prompt, task, modes
        self.spec_mode, self.settings, self.cancel = spec_mode, settings, cancel
        self.outcomes: dict[str, object] = {}
        self.failed = False
        self.launched = False  # its worker has started (set on the UI thread)
        self.done = threading.Event()


def _has_highlighting(language: str) -> bool:
    try:
        from textual._tree_sitter import TREE_SITTER, get_language

        return bool(TREE_SITTER and get_language(language) is not None)
    except Exception:  # noqa: BLE001 - optional feature
        return False


class SpeclocalApp(App[int]):
    """`backend`: a ready backend (tests, demos): no model files are resolved or loaded.
    Otherwise the configured pair is resolved, fetched if missing (with consent), inspected and
    loaded with `backend_factory` (default: the real engine) in a worker."""

    CSS_PATH = "../speclocal.tcss"
    TITLE = "speclocal"
    SUB_TITLE = "plain vs speculative decoding"
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (34, "-tall")]
    BINDINGS = [
        Binding("ctrl+r,ctrl+enter", "run", "Run", priority=True),
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+l", "clear", "Clear"),
        Binding("ctrl+n", "new_chat", "New chat"),
        Binding("f2", "settings", "Settings"),
        Binding("f3", "toggle_history", "History"),
        Binding("ctrl+t", "toggle_colour", "Colour", show=False),
        Binding("ctrl+s", "save_history", "Save history", show=False),
        Binding("f1", "help", "Help"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(self, settings: Settings | None = None, *, backend: GenerationBackend | None = None,
                 backend_factory: Callable[[LoadSpec], GenerationBackend] | None = None,
                 config_path: Path | None = None, models_dir: str | Path | None = None,
                 probe: Callable[[], tuple[int, int]] | None = None, inspect_models: bool = True,
                 export_dir: Path | None = None, config_warning: str | None = None):
        super().__init__()
        self.settings = settings or Settings()
        self.backend: GenerationBackend | None = backend
        self._fixed_backend = backend is not None
        self.backend_factory = backend_factory or load_engine_process
        self.config_path = config_path
        self.models_dir = models_dir
        self.probe = probe or SystemProbe()
        self.inspect_models = inspect_models
        self.export_dir = export_dir
        self.config_warning = config_warning
        self.conversation: list[dict] = []
        self.history: list[RunRecord] = []
        self.live: dict[str, LiveMode] = {}
        self.current_run: _Run | None = None
        self.last_run: _Run | None = None
        self._run_count = 0
        self.memory = None
        self.rss: int | None = None
        self._stats_drawn = 0.0  # monotonic time the stats pane was last redrawn
        self.batch_interval = BATCH_INTERVAL_S
        self.peak_rss: int | None = None
        self.available: int | None = None
        self._no_draft = False  # the user chose to continue without the (incompatible) draft model
        self._force_memory = False  # the user chose to load a pair the memory estimate says will not fit
        self._loading: LoadingScreen | None = None
        self._load_cancelled = False

    # ---- layout -------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="prompt-row"):
            prompt = TextArea(id="prompt", soft_wrap=True, tab_behavior="focus", show_line_numbers=False,
                              placeholder="Type a code or chat prompt, then press ctrl+r to run it plain and speculative")
            if _has_highlighting("markdown"):
                prompt.language = "markdown"
            yield prompt
            with Vertical(id="controls"):
                yield Select([("auto-detect", "auto"), ("code", "code"), ("edit code", "edit"), ("JSON", "json"),
                              ("chat", "chat"), ("creative", "creative")], value=self.settings.task,
                             allow_blank=False, compact=True, id="task")
                yield Button("▶ Run", id="run", compact=True, variant="success")
                yield Button("■ Stop", id="stop", compact=True, variant="error", disabled=True)
                yield Static("new chat", id="turn")
                yield Static("starting…", id="status")
        with Horizontal(id="work"):
            with Horizontal(id="outputs"):
                yield OutputPane("Plain", id="pane-plain", color_drafts=False)
                yield OutputPane("Speculative", id="pane-spec", color_drafts=self.settings.color_drafts)
            with Vertical(id="side"):
                yield StatsPane(id="stats")
                yield HistoryPanel(id="history")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        compositor.install(self.screen)  # streaming redraws only the cells that change
        success = self.current_theme.success if self.current_theme else None
        if success:
            from rich.style import Style

            from textual.color import Color

            for pane in self.query(OutputPane):
                pane.accepted_style = Style(color=Color.parse(success).rich_color)
        self.call_after_refresh(self._startup)

    def _startup(self) -> None:
        self._update_spec_title()
        self.query_one("#prompt", TextArea).focus()
        self.set_interval(STATS_INTERVAL_S, self._tick)
        self._tick()
        if self.config_warning:
            self.notify(self.config_warning, severity="warning", timeout=8)
        if self.backend is not None:
            self._backend_ready(self.backend)
        else:
            self._start_models()

    # ---- helpers ------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.current_run is not None

    def _status(self, text: str) -> None:
        self.query_one("#status", Static).update(text, layout=False)  # one fixed line: no relayout mid-run

    def _pane(self, mode: str) -> OutputPane:
        return self.query_one("#pane-plain" if mode == "plain" else "#pane-spec", OutputPane)

    def _spec_mode(self) -> str | None:
        source = self.settings.draft_source
        if source == "none":
            return None
        if source == "auto":
            return "auto"
        if source == "lookup" or self.backend is None or not self.backend.has_draft_model:
            return "lookup"
        return "spec"

    def _update_spec_title(self) -> None:
        mode = self._spec_mode()
        k = self.settings.draft_max
        pane = self.query_one("#pane-spec", OutputPane)
        pane.border_title = {"spec": f"Speculative · draft model, k={k}", "lookup": f"Speculative · prompt lookup, k={k}",
                             "auto": f"Speculative · auto, k≤{k}", None: "Speculative · off (draft source: none)"}[mode]
        if not self.running and pane.n_tokens == 0:
            legend = "[$success]green[/] = accepted draft tokens" if self.settings.color_drafts else "colouring off (ctrl+t)"
            pane.border_subtitle = legend if mode else ""

    def _set_running(self, on: bool) -> None:
        self.query_one("#run", Button).disabled = on
        self.query_one("#stop", Button).disabled = not on
        # a blinking cursor is a redraw twice a second, each in a frame of its own: not while decoding
        self.query_one("#prompt", TextArea).cursor_blink = not on

    def _update_turn(self) -> None:
        n = sum(1 for m in self.conversation if m["role"] == "user")
        self.query_one("#turn", Static).update("new chat" if n == 0 else f"chat: {n} turn{'s' if n > 1 else ''}",
                                               layout=False)

    def _save_settings(self) -> None:
        if self.config_path is None:
            return
        try:
            save_settings(self.settings, self.config_path)
        except OSError as e:
            self.notify(f"cannot save settings to {self.config_path}: {e}", severity="warning")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in MAIN_ONLY and len(self.screen_stack) > 1:
            return False
        # run and stop stay enabled while a run starts and ends (the buttons show which applies): a
        # change would recompose the footer, a relayout of the screen just as decoding starts
        if action == "run":
            return None if self.backend is None else True
        if action == "toggle_history":
            return self.screen.has_class("-narrow") and self.screen.has_class("-short")
        return True

    # ---- loading models -----------------------------------------------------------------------
    def _start_models(self) -> None:
        s = self.settings
        want_draft = s.wants_draft_model and not self._no_draft
        plan = plan_models(s.pair, s.main, s.draft, want_draft=want_draft, directory=self.models_dir)
        self.sub_title = plan.label
        if plan.error:
            self._status("no models")
            self.push_screen(ChoiceScreen("Cannot use these models", [plan.error],
                                          [("Settings", "settings"), ("Quit", "quit")], escape="dismiss"),
                             self._after_choice)
            return
        if plan.missing:
            self._status("models missing")
            self.push_screen(MissingModelsScreen(plan), self._after_choice)
            return
        self._status("loading…")
        detail = f"{plan.main_path.name}" + (f" + {plan.draft_path.name}" if plan.draft_path else "")
        self._loading = LoadingScreen(plan.label, detail)
        self.push_screen(self._loading)
        self._load(plan, s, self._force_memory)

    @work(thread=True, exclusive=True, group="load", exit_on_error=False)
    def _load(self, plan: ModelPlan, s: Settings, force: bool) -> None:
        t0 = time.monotonic()
        try:
            if self.inspect_models:
                insp = inspect_plan(plan, s.ctx_size)
                if not insp.compatible or (insp.verdict == "does not fit" and not force):
                    self.post_message(PlanReady(plan, insp))
                    return
            backend = self.backend_factory(LoadSpec(plan.main_path, plan.draft_path, s.ctx_size, s.threads,
                                                    s.n_gpu_layers, force=force))
        except SpeclocalError as e:
            self.post_message(LoadFailed(str(e)))
            return
        except Exception as e:  # noqa: BLE001 - shown to the user instead of a traceback
            log.exception("loading models failed")
            self.post_message(LoadFailed(f"{type(e).__name__}: {e}"))
            return
        self.post_message(BackendLoaded(backend, time.monotonic() - t0))

    def _close_loading(self) -> None:
        if self._loading is not None:
            if self._loading.is_attached and self.screen is self._loading:
                self._loading.dismiss()
            self._loading = None

    def on_backend_loaded(self, msg: BackendLoaded) -> None:
        self._close_loading()
        if self._exiting():
            msg.backend.close()
            return
        self._backend_ready(msg.backend, msg.seconds)
        self._save_settings()

    def _exiting(self) -> bool:
        return self._load_cancelled

    def _backend_ready(self, backend: GenerationBackend, seconds: float | None = None) -> None:
        self.backend = backend
        self.sub_title = backend.describe()
        try:
            self.memory = backend.memory()
        except Exception:  # noqa: BLE001 - memory is informational
            self.memory = None
        track = getattr(self.probe, "track", None)
        if track is not None:
            track(getattr(backend, "pid", None))  # RAM shown includes the engine process
        self._update_spec_title()
        self._status("ready" + (f" ({seconds:.1f} s load)" if seconds else ""))
        self.refresh_bindings()
        self._tick()

    def on_plan_ready(self, msg: PlanReady) -> None:
        self._close_loading()
        insp = msg.inspection
        lines = insp.lines + [""]
        if not insp.compatible:
            title = "This draft cannot draft for this main model"
            lines.append("llama.cpp would refuse this pair (the draft's tokens must mean the same as the main's). "
                         "Choose another draft in settings, or go on with prompt lookup (no draft model).")
            choices = [("Use prompt lookup", "no-draft"), ("Settings", "settings"), ("Quit", "quit")]
        else:
            title = "This pair may not fit in memory"
            lines.append("Loading it could make the machine swap or the process be killed.")
            choices = [("Settings", "settings"), ("Load anyway", "force"), ("Quit", "quit")]
        self._status("not loaded")
        self.push_screen(ChoiceScreen(title, lines, choices), self._after_choice)

    def on_load_failed(self, msg: LoadFailed) -> None:
        self._close_loading()
        self._status("not loaded")
        choices = [("Settings", "settings"), ("Retry", "retry"), ("Quit", "quit")]
        if "memory" in msg.error.lower() or "ram" in msg.error.lower().split():
            choices.insert(2, ("Load anyway", "force"))
        self.push_screen(ChoiceScreen("Could not load the models", [msg.error], choices, escape="dismiss"),
                         self._after_choice)

    def _after_choice(self, value: str | None) -> None:
        if value == "quit":
            self.action_quit()
        elif value == "settings":
            self.action_settings(force=True)
        elif value in ("fetched", "retry"):
            self._start_models()
        elif value == "no-draft":
            self._no_draft = True
            self._start_models()
        elif value == "force":
            self._force_memory = True
            self._start_models()

    # ---- running --------------------------------------------------------------------------------
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
        requests = [RunRequest(messages, m, s.n_predict, s.temperature, s.seed, s.draft_max, s.draft_min,
                               s.draft_p_min, task) for m in modes]
        self._run_count += 1
        run = _Run(self._run_count, prompt, task, modes, spec_mode, s, threading.Event())
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

    def _launch(self, run: _Run, requests: list[RunRequest], backend: GenerationBackend) -> None:
        if self._current(run.run_id) is None:
            run.done.set()
            return
        run.launched = True
        self._generate(run, requests, backend)

    @work(thread=True, exclusive=True, group="generate", exit_on_error=False)
    def _generate(self, run: _Run, requests: list[RunRequest], backend: GenerationBackend) -> None:
        try:
            for pos, req in enumerate(requests):
                if run.cancel.is_set():
                    break
                self.post_message(RunStarted(run.run_id, req.mode, pos, len(requests)))
                batcher = _Batcher(self.post_message, run.run_id, req.mode, self.batch_interval)
                try:
                    outcome = backend.generate(req, batcher, run.cancel)
                except SpeclocalError as e:
                    batcher.flush()
                    self.post_message(RunFailed(run.run_id, req.mode, str(e)))
                    break
                except Exception as e:  # noqa: BLE001 - shown to the user instead of a traceback
                    log.exception("generation failed")
                    batcher.flush()
                    self.post_message(RunFailed(run.run_id, req.mode, f"{type(e).__name__}: {e}"))
                    break
                batcher.flush()
                self.post_message(ModeFinished(run.run_id, req.mode, outcome))
            self.post_message(RunFinished(run.run_id, run.cancel.is_set()))
        finally:
            run.done.set()

    def _current(self, run_id: int) -> _Run | None:
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
        self._pane(msg.mode).append(msg.pieces, msg.from_draft)
        lm = self.live.get(msg.mode)
        if lm is not None:
            lm.add(msg.steps)
        if time.monotonic() - self._stats_drawn >= STATS_INTERVAL_S * 0.75:
            self._refresh_stats()  # in the same frame as the tokens, not one of its own

    def on_mode_finished(self, msg: ModeFinished) -> None:
        run = self._current(msg.run_id)
        if run is None:
            return
        o = msg.outcome
        run.outcomes[msg.mode] = o
        lm = self.live.setdefault(msg.mode, LiveMode(msg.mode))
        lm.outcome = o
        self.memory = o.memory
        self.peak_rss = max(self.peak_rss or 0, o.peak_rss)
        what = "stopped" if o.stop_reason == "cancelled" else f"done ({o.stop_reason})"
        acc = f" · {o.acceptance:.0%} accepted" if o.acceptance is not None else ""
        pane = self._pane(msg.mode)
        pane.border_subtitle = f"{what} · {o.n_generated} tok · {o.decode_tps:.1f} t/s{acc}"
        if o.auto and o.auto.get("sentence"):
            pane.note("auto: " + o.auto["sentence"])
        if o.dropped_turns:
            self.notify(f"The {o.dropped_turns} oldest turn(s) were left out so the chat fits the context.",
                        severity="warning", timeout=6)
        self._refresh_stats()

    def on_run_failed(self, msg: RunFailed) -> None:
        run = self._current(msg.run_id)
        if run is None:
            return
        run.failed = True
        lm = self.live.setdefault(msg.mode, LiveMode(msg.mode))
        lm.failed = msg.error
        self._pane(msg.mode).border_subtitle = "failed"
        self.notify(msg.error, title=f"{MODE_LABELS.get(msg.mode, msg.mode)} run failed", severity="error", timeout=8)

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
        complete = not msg.cancelled and not run.failed and all(m in run.outcomes for m in run.modes)
        if complete:
            rec = RunRecord.from_outcomes(run.run_id, run.task, run.prompt, run.modes, run.settings.draft_max,
                                          run.settings.temperature, run.outcomes, self.peak_rss or 0)
            self.history.append(rec)
            self.query_one(HistoryPanel).add(rec, self.history)
            reply = run.outcomes[run.modes[-1]].text  # the last mode's reply is what the KV caches hold
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

    # ---- stats --------------------------------------------------------------------------------
    def _tick(self) -> None:
        try:
            self.rss, self.available = self.probe()
        except Exception:  # noqa: BLE001 - psutil may fail on exotic platforms
            self.rss = self.available = None
        if self.rss is not None:
            self.peak_rss = max(self.peak_rss or 0, self.rss)
        # while tokens stream, their batches draw the stats in the same frame (`on_tokens_arrived`, every
        # 0.3-0.4 s); this timer draws them when no batch has (loading, prompt processing, idle)
        if time.monotonic() - self._stats_drawn >= STATS_INTERVAL_S * 0.9:
            self._refresh_stats()

    def _refresh_stats(self) -> None:
        self._stats_drawn = time.monotonic()
        run = self.current_run or self.last_run
        spec_mode = run.spec_mode if run is not None else self._spec_mode()
        draft_max = run.settings.draft_max if run is not None else self.settings.draft_max
        try:
            stats = self.query_one(StatsPane)
        except NoMatches:  # the 0.4 s timer can fire while the app closes and its widgets are gone
            return
        stats.show(live=self.live, spec_mode=spec_mode, draft_max=draft_max, memory=self.memory, rss=self.rss,
                   peak=self.peak_rss, available=self.available)

    # ---- other actions --------------------------------------------------------------------------
    def action_clear(self) -> None:
        if self.running:
            self.notify("Stop the run first (esc).", severity="warning")
            return
        self.query_one("#prompt", TextArea).clear()
        for pane in self.query(OutputPane):
            pane.clear()
        self.live = {}
        self.last_run = None
        self._update_spec_title()
        self._refresh_stats()
        self._status("cleared")

    def action_new_chat(self) -> None:
        if self.running:
            self.notify("Stop the run first (esc).", severity="warning")
            return
        self.conversation = []
        if self.backend is not None:
            self.backend.reset()
        self.action_clear()
        self._update_turn()
        self._status("new chat")

    def action_toggle_colour(self) -> None:
        self.settings = replace(self.settings, color_drafts=not self.settings.color_drafts)
        self._pane("spec").set_color_drafts(self.settings.color_drafts)
        self._update_spec_title()
        self._save_settings()
        self.notify("Accepted draft tokens " + ("coloured" if self.settings.color_drafts else "not coloured"), timeout=2)

    def action_toggle_history(self) -> None:
        self.query_one("#side").toggle_class("-history")

    def action_save_history(self) -> None:
        if not self.history:
            self.notify("No runs to save yet.", severity="warning")
            return
        directory = self.export_dir or (self.config_path.parent if self.config_path else config_dir())
        meta = {"models": self.backend.describe() if self.backend else None}
        try:
            csv_path, json_path = export_history(self.history, directory, meta)
        except OSError as e:
            self.notify(f"cannot save history: {e}", severity="error")
            return
        self.notify(f"{csv_path}\n{json_path}", title=f"History saved ({len(self.history)} runs)", timeout=6)

    def action_help(self) -> None:
        if not isinstance(self.screen, (HelpScreen, LoadingScreen)):
            self.push_screen(HelpScreen())

    def action_settings(self, force: bool = False) -> None:
        if self.running:
            self.notify("Stop the run first (esc).", severity="warning")
            return
        self.push_screen(SettingsScreen(self.settings, Path(self.models_dir) if self.models_dir else None),
                         self._settings_done)

    def _settings_done(self, new: Settings | None) -> None:
        if new is None:
            if self.backend is None and not self._fixed_backend:
                self._start_models()  # came here from a verdict: try again with what we have
            return
        old = self.settings
        self.settings = new
        self.query_one("#task", Select).value = new.task
        self._pane("spec").set_color_drafts(new.color_drafts)
        self._save_settings()
        reload = old.load_key() != new.load_key() or self.backend is None
        if reload and not self._fixed_backend:
            self._no_draft = False
            self._force_memory = False
            if self.backend is not None:
                self.backend.close()
                self.backend = None
                self.memory = None
                self.conversation = []
                self._update_turn()
            self._start_models()
        self._update_spec_title()
        self._refresh_stats()

    @on(Select.Changed, "#task")
    def _task_changed(self, event: Select.Changed) -> None:
        if isinstance(event.value, str) and event.value != self.settings.task:
            self.settings = replace(self.settings, task=event.value)
            self._save_settings()

    @on(Button.Pressed, "#run")
    def _run_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_run()

    @on(Button.Pressed, "#stop")
    def _stop_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_stop()

    def on_resize(self) -> None:
        self.refresh_bindings()

    # ---- shutting down --------------------------------------------------------------------------
    async def action_quit(self) -> None:
        self.exit(0)

    def exit(self, result: int | None = None, return_code: int = 0, message=None) -> None:
        self.stop_generation()  # a run in its worker thread ends within one step
        super().exit(result, return_code, message)

    def on_unmount(self) -> None:
        self.stop_generation()

    def stop_generation(self) -> None:
        self._load_cancelled = True
        if self.current_run is not None:
            self.current_run.cancel.set()

    def close_backend(self, timeout: float = 30.0) -> None:
        """After the app has exited: stop a run still in its worker, then free the models."""
        self.stop_generation()
        run = self.current_run
        if run is not None and run.launched:
            run.done.wait(timeout)
        if self.backend is not None:
            try:
                self.backend.close()
            finally:
                self.backend = None


# ---- the entry point --------------------------------------------------------------------------
# argparse attribute -> Settings field, for flags of speclocal.options' add_model_args/add_generation_args
ARG_FIELDS = {"ctx_size": "ctx_size", "threads": "threads", "n_gpu_layers": "n_gpu_layers", "n_predict": "n_predict",
              "temp": "temperature", "seed": "seed", "draft_max": "draft_max", "draft_min": "draft_min",
              "draft_p_min": "draft_p_min", "system": "system_prompt"}
# their parser defaults (checked by a test): a value equal to its default is taken as "not given", so the
# saved settings win over flags the user did not type (options.py imports the engine: not imported here)
ARG_DEFAULTS = {"ctx_size": 4096, "threads": None, "n_gpu_layers": 0, "n_predict": 256, "temp": 0.0, "seed": 0,
                "draft_max": 3, "draft_min": 0, "draft_p_min": 0.0, "system": None}


def _settings_from_args(settings: Settings, args) -> Settings:
    """--pair/-m/-md and model/generation flags on the command line override the saved settings."""
    if args is None:
        return settings
    changes: dict = {}
    pair, main, draft = (getattr(args, k, None) for k in ("pair", "model", "model_draft"))
    if pair or main or draft:
        changes.update(pair=pair or "", main=main or "", draft=draft or "")
        if main and not draft and not pair:
            changes["draft_source"] = "lookup"  # -m alone: no draft model (like `speclocal run -m`)
    for attr, name in ARG_FIELDS.items():
        v = getattr(args, attr, None)
        if v is not None and v != ARG_DEFAULTS[attr]:
            changes[name] = type(getattr(settings, name))(v)
    new = replace(settings, **changes)
    bad = new.validate()
    if bad:
        raise SpeclocalError(bad[0])
    return new


class _QuietStderr:
    """While the TUI runs, nothing may write to the terminal behind its back. C code (llama.cpp,
    ggml) writes to file descriptor 2, so fd 2 is pointed at a log file; Textual draws on
    `sys.__stderr__`, which is re-opened on a duplicate of the terminal's descriptor. Python logging
    handlers that write to a stream are swapped for the same log file. All restored on exit."""

    def __init__(self, path: Path):
        self.path = path
        self._saved_fd: int | None = None
        self._terminal = None
        self._orig = None
        self._removed: list[logging.Handler] = []
        self._handler: logging.Handler | None = None

    def __enter__(self) -> "_QuietStderr":
        import sys

        root = logging.getLogger()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handler = logging.FileHandler(self.path, encoding="utf-8")
        except OSError:
            return self  # no log file: leave everything as it is
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for h in list(root.handlers):
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                root.removeHandler(h)
                self._removed.append(h)
        root.addHandler(self._handler)
        try:
            orig = sys.__stderr__
            orig.flush()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._saved_fd = os.dup(2)
            self._terminal = os.fdopen(os.dup(self._saved_fd), "w", encoding=orig.encoding, errors=orig.errors,
                                       buffering=1 if orig.line_buffering else -1)
            os.dup2(fd, 2)
            os.close(fd)
            self._orig = (sys.__stderr__, sys.stderr)
            sys.__stderr__ = sys.stderr = self._terminal
        except (OSError, AttributeError, ValueError, TypeError):
            pass
        return self

    def __exit__(self, *exc) -> None:
        import sys

        if self._orig is not None:
            sys.__stderr__, sys.stderr = self._orig
            try:
                self._terminal.close()
            except OSError:
                pass
        if self._saved_fd is not None:
            os.dup2(self._saved_fd, 2)
            os.close(self._saved_fd)
        root = logging.getLogger()
        if self._handler is not None:
            root.removeHandler(self._handler)
            self._handler.close()
        for h in self._removed:
            root.addHandler(h)


def log_path() -> Path:
    import platformdirs

    return Path(platformdirs.user_log_dir("speclocal")) / "tui.log"


def load_engine_process(spec: LoadSpec) -> GenerationBackend:
    """The App's default backend: the real engine in a process of its own, logging to `log_path()`."""
    return ProcessBackend(spec, log_file=log_path())


def run_tui(args=None) -> int:
    """`speclocal` with no subcommand. Reads the config, applies -m/-md/--pair/-c/-t/-ngl style
    attributes of `args` when present and not None, runs the app; returns the exit code."""
    from speclocal.tui.config import config_path, load_settings

    path = config_path()
    settings, warning = load_settings(path)
    settings = _settings_from_args(settings, args)
    with _QuietStderr(log_path()):
        app = SpeclocalApp(settings, config_path=path, models_dir=getattr(args, "dir", None),
                           config_warning=warning)
        try:
            app.run()
        finally:
            app.close_backend()
    return app.return_code or 0
