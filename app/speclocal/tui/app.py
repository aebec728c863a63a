"""The speclocal TUI: a prompt, plain vs speculative side by side, live stats and a history.

The App lays the screen out and answers keys; loading models (`loading`) and running prompts
(`generation`) are its two mixins; the stats pane redraws with each token batch, or on a timer while
no tokens arrive.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from textual import on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.widgets import Button, Footer, Header, Select, Static, TextArea

from speclocal import locations
from speclocal.drafts import Source
from speclocal.engine_process import LoadSpec, ProcessBackend
from speclocal.options import Settings
from speclocal.tasks import TASKS
from speclocal.tui import compositor
from speclocal.tui.backend import GenerationBackend
from speclocal.tui.config import save_settings
from speclocal.tui.generation import BATCH_INTERVAL_S, RunControl, RunState
from speclocal.tui.history import LiveMode, RunRecord, export_history
from speclocal.tui.loading import ModelLoading, load_key
from speclocal.tui.probe import SystemProbe
from speclocal.tui.screens import HelpScreen, LoadingScreen, SettingsScreen
from speclocal.tui.widgets import SOURCE_COLOURS, HistoryPanel, OutputPane, StatsPane

STATS_INTERVAL_S = 0.4  # the stats pane redraws this often: at least twice a second
MAIN_ONLY = {"run", "stop", "clear", "new_chat", "settings", "toggle_history", "toggle_colour", "save_history"}
TASK_CHOICES = [("auto-detect", "auto")] + [({"edit": "edit code", "json": "JSON"}.get(t, t), t) for t in TASKS]


def draft_lengths(s: Settings, mode: str | None) -> str:
    """How long a step of the speculative mode drafts, for titles: k=3, k=16, k≤16 (the suffix drafter picks its
    own length), k≤3/16 (auto: model/model-free)."""
    return {"spec": f"k={s.draft_max}", "lookup": f"k={s.lookup_max}", "suffix": f"k≤{s.lookup_max}",
            "auto": f"k≤{s.draft_max}/{s.lookup_max}"}.get(mode or "", "")


def draft_legend(mode: str | None, color_drafts: bool) -> str:
    """The speculative pane's legend: what the colours of accepted draft tokens mean in this mode."""
    if not mode:
        return ""
    if not color_drafts:
        return "colouring off (ctrl+t)"
    if mode == "auto":
        return "accepted from [$success]model[/] [$primary]lookup[/] [$warning]suffix[/] [$error]store[/]"
    if mode == "suffix":
        return "[$success]green[/] = accepted drafts, [$error]red[/] = from earlier outputs"
    return "[$success]green[/] = accepted draft tokens"


def _has_highlighting(language: str) -> bool:
    try:
        from textual._tree_sitter import TREE_SITTER, get_language

        return bool(TREE_SITTER and get_language(language) is not None)
    except Exception:  # noqa: BLE001 - optional feature
        return False


def load_engine_process(spec: LoadSpec) -> GenerationBackend:
    """The App's default backend: the real engine in a process of its own, logging to the TUI's log file."""
    return ProcessBackend(spec, log_file=locations.tui_log_path())


class SpeclocalApp(ModelLoading, RunControl, App[int]):
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
                 config_path: Path | None = None, probe: Callable[[], tuple[int, int]] | None = None,
                 inspect_models: bool = True, export_dir: Path | None = None, config_warning: str | None = None):
        super().__init__()
        self.settings = settings or Settings()
        self.backend: GenerationBackend | None = backend
        self._fixed_backend = backend is not None
        self.backend_factory = backend_factory or load_engine_process
        self.config_path = config_path
        self.probe = probe or SystemProbe()
        self._tracked_pid: int | None = None  # the engine process whose RAM the probe counts
        self.inspect_models = inspect_models
        self.export_dir = export_dir
        self.config_warning = config_warning
        self.conversation: list[dict] = []
        self.history: list[RunRecord] = []
        self.live: dict[str, LiveMode] = {}
        self.current_run: RunState | None = None
        self.last_run: RunState | None = None
        self._run_count = 0
        self.memory = None
        self.store_info: dict | None = None  # the suffix store's size after the latest run that used it
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
                yield Select(TASK_CHOICES, value=self.settings.task, allow_blank=False, compact=True, id="task")
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
                for src, (name, _) in SOURCE_COLOURS.items():
                    colour = getattr(self.current_theme, name, None)
                    if colour:
                        pane.source_styles[src] = Style(color=Color.parse(colour).rich_color)
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
        if source == Source.MODEL and (self.backend is None or not self.backend.has_draft_model):
            return Source.LOOKUP.mode
        return Source(source).mode

    def _update_spec_title(self) -> None:
        mode = self._spec_mode()
        k = draft_lengths(self.settings, mode)
        pane = self.query_one("#pane-spec", OutputPane)
        pane.border_title = (f"{Source.of_mode(mode).mode_label.capitalize()}, {k}" if mode
                             else "Speculative · off (draft source: none)")
        pane.by_source = mode == "auto"
        pane.legend = {"auto": [(s.value, s) for s in (Source.MODEL, Source.LOOKUP, Source.SUFFIX, Source.STORE)],
                       "suffix": [("the conversation", "suffix"), ("earlier outputs", "store")]}.get(mode or "", [])
        if not self.running and pane.n_tokens == 0:
            pane.border_subtitle = draft_legend(mode, self.settings.color_drafts)

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

    def _stats_with_tokens(self) -> None:
        """Redraw the stats in the frame of a token batch (not in one of their own), often enough."""
        if time.monotonic() - self._stats_drawn >= STATS_INTERVAL_S * 0.75:
            self._refresh_stats()

    def _refresh_stats(self) -> None:
        self._stats_drawn = time.monotonic()
        run = self.current_run or self.last_run
        spec_mode = run.spec_mode if run is not None else self._spec_mode()
        lengths = draft_lengths(run.settings if run is not None else self.settings, spec_mode)
        try:
            stats = self.query_one(StatsPane)
        except NoMatches:  # the 0.4 s timer can fire while the app closes and its widgets are gone
            return
        stats.show(live=self.live, spec_mode=spec_mode, lengths=lengths, memory=self.memory, rss=self.rss,
                   peak=self.peak_rss, available=self.available, store=self.store_info)

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
        directory = self.export_dir or (self.config_path.parent if self.config_path else locations.history_dir())
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

    def action_settings(self) -> None:
        if self.running:
            self.notify("Stop the run first (esc).", severity="warning")
            return
        self.push_screen(SettingsScreen(self.settings), self._settings_done)

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
        reload = load_key(old) != load_key(new) or self.backend is None
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


