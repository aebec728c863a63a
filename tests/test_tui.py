"""The TUI with a scripted FakeBackend: Pilot tests and snapshots. No model is loaded here."""

from __future__ import annotations

import asyncio
import csv
import json
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, TextArea

from speclocal import locations
from speclocal.engine.types import GenerationResult, MemoryParts, StepEvent
from speclocal.options import Settings
from speclocal.tui.app import SpeclocalApp
from speclocal.tui.config import dumps, load_settings, save_settings
from speclocal.tui.history import LiveMode, RunRecord, history_csv, summarize_by_task
from speclocal.tui.main import settings_from_cli
from speclocal.tui.screens import ChoiceScreen, HelpScreen, MissingModelsScreen, SettingsScreen
from speclocal.tui.testing import FAKE_TEXT, FakeBackend, fake_pieces
from speclocal.tui.widgets import HistoryPanel, OutputPane, TokenView, add_pieces, sparkline

PROBE = (1_950_000_000, 19_000_000_000)


@pytest.fixture(autouse=True)
def _no_models(tmp_path, monkeypatch):
    """An empty models dir: these tests never see the real model files (the other user dirs: conftest)."""
    (tmp_path / "models").mkdir(exist_ok=True)
    monkeypatch.setenv(locations.MODELS_ENV, str(tmp_path / "models"))
CODE_PROMPT = "Write a Python function that returns the n-th Fibonacci number."


def fixed_probe() -> tuple[int, int]:
    return PROBE


def make_app(fake: FakeBackend, tmp_path: Path | None = None, settings: Settings | None = None) -> SpeclocalApp:
    return SpeclocalApp(
        settings or Settings(), backend=fake, probe=fixed_probe,
        config_path=(tmp_path / "config.toml") if tmp_path else None, export_dir=tmp_path,
    )


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def in_app(tmp_path):
    """in_app(body, backend=None, size=(80, 24), **kw): `await body(app, pilot)` in a fresh App at `size` (80x24:
    the smallest supported), on a ready `backend`, or (none given) loading models with the `backend_factory` in
    `kw`; settings saved to tmp_path/config.toml, history exported to tmp_path."""

    def go(body, backend: FakeBackend | None = None, size: tuple[int, int] = (80, 24), **kw) -> None:
        async def main():
            kw.setdefault("settings", Settings())
            app = SpeclocalApp(backend=backend, probe=fixed_probe, config_path=tmp_path / "config.toml",
                               export_dir=tmp_path, **kw)
            async with app.run_test(size=size) as pilot:
                await body(app, pilot)

        run(main())

    return go


async def wait_for(pilot, predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.01)


async def type_prompt(pilot, text: str) -> None:
    await wait_for(pilot, lambda: pilot.app.screen.query("#prompt"))  # screens may still be switching under load
    editor = pilot.app.query_one("#prompt", TextArea)
    editor.focus()
    editor.insert(text)
    await pilot.pause()


async def run_prompt(pilot, text: str) -> None:
    app = pilot.app
    n = len(app.history)
    runs = app._run_count
    await type_prompt(pilot, text)
    await pilot.press("ctrl+r")
    await wait_for(pilot, lambda: app._run_count == runs + 1 and not app.running)
    await pilot.pause()
    assert len(app.history) == n + 1


# ---- pilot tests ------------------------------------------------------------------------------
def test_typing_and_running_fills_both_panes_and_history(in_app):
    fake = FakeBackend(step_delay=0.001)

    async def go(app, pilot):
        await pilot.click("#prompt")
        await pilot.press(*"def fib(n):")  # really typed, key by key
        assert app.query_one("#prompt", TextArea).text == "def fib(n):"
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: not app.running and app.history)
        await pilot.pause()
        plain = app.query_one("#pane-plain", OutputPane)
        spec = app.query_one("#pane-spec", OutputPane)
        assert plain.text == FAKE_TEXT and spec.text == FAKE_TEXT
        for pane in (plain, spec):  # streamed to the end of a text taller than the pane, and kept in view
            view = pane.query_one(TokenView)
            assert view.max_scroll_y > 0 and view.scroll_offset.y == view.max_scroll_y
        assert plain.coloured_spans() == []
        coloured = spec.coloured_spans()
        assert coloured and spec.n_from_draft == fake.results[-1].n_accepted > 0
        table = app.query_one("#history-table", DataTable)
        assert table.row_count == 1
        rec = app.history[0]
        assert rec.task == "code" and rec.plain.n_generated == rec.spec.n_generated == len(fake_pieces(FAKE_TEXT))
        assert rec.speedup == pytest.approx(fake.results[1].decode_tps / fake.results[0].decode_tps)
        assert [r.mode for r in fake.requests] == ["plain", "spec"]
        assert fake.requests[0].messages[-1] == {"role": "user", "content": "def fib(n):"}
        # the turn joined the conversation; the editor is ready for the next one
        assert [m["role"] for m in app.conversation] == ["user", "assistant"]
        assert app.query_one("#prompt", TextArea).text == ""

    in_app(go, fake)


def test_runs_alternate_order_and_continue_the_chat(in_app):
    fake = FakeBackend()

    async def go(app, pilot):
        await run_prompt(pilot, CODE_PROMPT)
        await run_prompt(pilot, "Thanks! How are you today?")
        assert [r.mode for r in fake.requests] == ["plain", "spec", "spec", "plain"]
        assert [r.task for r in app.history] == ["code", "chat"]
        assert fake.requests[0].task == "code" and fake.requests[2].task == "chat"
        second = fake.requests[2].messages
        assert [m["role"] for m in second] == ["user", "assistant", "user"]
        assert app.history[1].order == "spec>plain"
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert app.conversation == [] and fake.resets == 1
        await run_prompt(pilot, CODE_PROMPT)
        assert len(fake.requests[-1].messages) == 1

    in_app(go, fake)


def test_stop_cancels_within_a_step(in_app):
    fake = FakeBackend(FAKE_TEXT * 40, step_delay=0.01)

    async def go(app, pilot):
        await type_prompt(pilot, CODE_PROMPT)
        await pilot.press("ctrl+r")
        plain = app.query_one("#pane-plain", OutputPane)
        await wait_for(pilot, lambda: plain.n_tokens >= 5)
        t0 = time.monotonic()
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.running, timeout=2.0)
        assert time.monotonic() - t0 < 1.0
        out = fake.results[-1]
        assert out.stop_reason == "cancelled" and out.n_generated < len(fake.pieces)
        assert [r.mode for r in fake.requests] == ["plain"]  # the second mode never started
        assert app.history == [] and app.conversation == []
        assert "stopped" in str(plain.border_subtitle)
        assert app.query_one("#prompt", TextArea).text == CODE_PROMPT  # kept, to run again

    in_app(go, fake)


def test_settings_change_the_next_run(tmp_path, in_app):
    fake = FakeBackend()

    async def go(app, pilot):
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen) and app.screen.query("#set-draft_max"))
        screen = app.screen
        for name, value in (("draft_max", "5"), ("temperature", "0.7"), ("seed", "42"), ("n_predict", "20")):
            field = screen.query_one(f"#set-{name}", Input)
            field.focus()
            field.clear()
            await pilot.press(*value)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        assert app.settings.draft_max == 5
        await run_prompt(pilot, CODE_PROMPT)
        req = fake.requests[-1]
        assert (req.mode, req.draft.max, req.sampling.temp, req.sampling.seed, req.n_predict) == ("spec", 5, 0.7, 42, 20)
        assert app.history[-1].spec.n_generated == 20
        assert "k=5" in str(app.query_one("#pane-spec", OutputPane).border_title)
        # saved to the config file, and read back the same
        saved = tomllib.loads((tmp_path / "config.toml").read_text())["settings"]
        assert saved["draft_max"] == 5 and saved["temperature"] == 0.7
        assert load_settings(tmp_path / "config.toml")[0] == app.settings

    in_app(go, fake)


def test_settings_reject_bad_values_and_draft_source_none(in_app):
    fake = FakeBackend()

    async def go(app, pilot):
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen) and app.screen.query("#set-draft_max"))
        screen = app.screen
        screen.query_one("#set-draft_max", Input).value = "0"
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, SettingsScreen)
        assert "draft max" in str(screen.query_one("#settings-errors").render())
        screen.query_one("#set-draft_max", Input).value = "4"
        screen.query_one("#set-draft_source").value = "none"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not isinstance(app.screen, SettingsScreen))
        await run_prompt(pilot, "Hello, how are you?")
        assert [r.mode for r in fake.requests] == ["plain"]
        rec = app.history[-1]
        assert rec.spec_mode == "" and rec.speedup is None and rec.task == "chat"

    in_app(go, fake)


def test_lookup_when_no_draft_model(in_app):
    fake = FakeBackend(has_draft=False)

    async def go(app, pilot):
        await run_prompt(pilot, CODE_PROMPT)
        assert [r.mode for r in fake.requests] == ["plain", "lookup"]
        assert "prompt lookup" in str(app.query_one("#pane-spec", OutputPane).border_title)

    in_app(go, fake)


def test_auto_colours_each_accepted_token_by_its_drafter_and_shows_the_store(in_app):
    """Auto mode: the legend names a colour per draft source and each accepted draft token is drawn in its
    step's source colour; the stats show the suffix store's size after a run that used it."""
    fake = FakeBackend()

    async def go(app, pilot):
        await run_prompt(pilot, CODE_PROMPT)
        assert [r.mode for r in fake.requests] == ["plain", "auto"] and fake.requests[1].store == "on"
        spec = app.query_one("#pane-spec", OutputPane)
        assert "auto" in str(spec.border_title)
        result = fake.results[-1]
        drawn = {src: "".join(spec.coloured_spans(src)) for src in ("model", "lookup", "suffix", "store")}
        by_source: dict[str, int] = {}
        for (n, drafted, accepted, _), src in zip(result.steps, result.step_sources):
            if accepted:
                by_source[src] = by_source.get(src, 0) + accepted
        assert set(by_source) == {"model", "lookup", "suffix", "store"}
        for src, n in by_source.items():
            assert drawn[src], src  # every source that drafted accepted tokens has its colour on screen
        assert spec.coloured_spans() == spec.coloured_spans("model")  # the draft model keeps the usual green
        drawn_text = "".join(seg.text for strip in spec.query_one(TokenView)._lines for seg in strip)
        assert "accepted drafts from model · lookup · suffix · store" in drawn_text
        stats = str(app.query_one("#stats-spec").render())
        assert "suffix store" in stats and "48.3k tokens" in stats, stats  # 48,213 + what this run added

    in_app(go, fake, size=(120, 40), settings=Settings(draft_source="auto"))


def test_suffix_mode_runs_without_a_draft_model_and_marks_drafts_from_the_store(in_app):
    fake = FakeBackend(has_draft=False)

    async def go(app, pilot):
        await run_prompt(pilot, CODE_PROMPT)
        assert [r.mode for r in fake.requests] == ["plain", "suffix"]
        spec = app.query_one("#pane-spec", OutputPane)
        assert "suffix" in str(spec.border_title)
        assert spec.coloured_spans() and spec.coloured_spans("store")  # the conversation's and the store's
        assert app.history[-1].spec_mode == "suffix"

    in_app(go, fake, size=(120, 40), settings=Settings(draft_source="suffix"))


def test_no_store_setting_asks_the_engine_to_leave_the_store_alone(in_app):
    fake = FakeBackend()

    async def go(app, pilot):
        await run_prompt(pilot, CODE_PROMPT)
        assert {r.store for r in fake.requests} == {"off"}
        assert fake.results[-1].store is None
        assert "suffix store" not in str(app.query_one("#stats-spec").render())

    in_app(go, fake, size=(120, 40), settings=Settings(draft_source="auto", store=False))


def test_colour_toggle_help_and_export(tmp_path, in_app):
    fake = FakeBackend()

    async def go(app, pilot):
        await run_prompt(pilot, CODE_PROMPT)
        spec = app.query_one("#pane-spec", OutputPane)
        assert spec.coloured_spans()
        await pilot.press("ctrl+t")
        assert spec.coloured_spans() == [] and app.settings.color_drafts is False
        await pilot.press("ctrl+t")
        assert spec.coloured_spans()
        await pilot.press("ctrl+s")
        await pilot.pause()
        csvs = sorted(tmp_path.glob("history-*.csv"))
        jsons = sorted(tmp_path.glob("history-*.json"))
        assert len(csvs) == len(jsons) == 1
        rows = list(csv.DictReader(csvs[0].open()))
        assert len(rows) == 1 and rows[0]["task"] == "code" and float(rows[0]["speedup"]) > 0
        data = json.loads(jsons[0].read_text())
        assert data["runs"][0]["n_accepted"] == fake.results[-1].n_accepted
        assert data["summary"][0]["task"] == "code"
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen))
        await pilot.press("ctrl+l")
        assert spec.text == "" and app.history  # clear keeps the history

    in_app(go, fake)


def test_history_toggle_at_80x24(in_app):
    fake = FakeBackend()

    async def go(app, pilot):
        history = app.query_one(HistoryPanel)
        assert not history.display or history.region.height == 0
        await pilot.press("f3")
        await pilot.pause()
        assert history.region.height > 0
        assert app.query_one("#stats").region.height == 0

    in_app(go, fake)


def test_missing_model_screen_and_fetch(tmp_path, monkeypatch, in_app):
    models = tmp_path / "models"
    loaded = []

    def factory(spec):
        loaded.append(spec)
        return FakeBackend()

    def fake_fetch(entries, dest=None, source="auto", progress=None):
        from speclocal.models.fetch import FetchResult

        out = []
        for e in entries:
            for done in (0, 512, 1024):
                progress(e.id, "downloading", done, 1024)
            (Path(dest) / e.file).write_bytes(b"GGUF")
            out.append(FetchResult(e, Path(dest) / e.file, "mirror", "downloaded", "0" * 64, 4, False))
        return out

    monkeypatch.setattr("speclocal.models.fetch.fetch_models", fake_fetch)

    async def go(app, pilot):
        await wait_for(pilot, lambda: isinstance(app.screen, MissingModelsScreen) and app.screen.query("#fetch"))
        screen = app.screen
        assert "speclocal fetch tiny" in str(screen.query_one("#fetch-command").render())
        assert "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf" in str(screen.query_one("#missing-list").render())
        await pilot.press("f")
        await wait_for(pilot, lambda: app.backend is not None)
        assert loaded and loaded[0].main_path == models / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
        assert loaded[0].draft_path == models / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
        assert app.screen is app.screen_stack[0]
        await run_prompt(pilot, CODE_PROMPT)

    in_app(go, backend_factory=factory, inspect_models=False)


def test_load_failure_shows_the_error_not_a_traceback(tmp_path, monkeypatch, in_app):
    from speclocal.errors import SpeclocalError

    models = tmp_path / "models"
    for name in ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"):
        (models / name).write_bytes(b"GGUF")

    def factory(spec):
        raise SpeclocalError("llama.cpp could not load it")

    async def go(app, pilot):
        await wait_for(pilot, lambda: isinstance(app.screen, ChoiceScreen) and app.screen.query("#choice-text"))
        assert "could not load it" in str(app.screen.query_one("#choice-text").render())
        await pilot.press("escape")
        await pilot.pause()
        assert app.backend is None and app.is_running

    in_app(go, backend_factory=factory, inspect_models=False)


def test_settings_that_need_a_reload_reload_the_models(tmp_path, in_app):
    models = tmp_path / "models"
    for name in ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"):
        (models / name).write_bytes(b"GGUF")
    made: list = []

    def factory(spec):
        made.append((spec, FakeBackend(has_draft=spec.draft_path is not None)))
        return made[-1][1]

    async def go(app, pilot):
        await wait_for(pilot, lambda: app.backend is not None)
        assert made[0][0].settings.threads == 0 and made[0][0].draft_path is not None
        await pilot.press("f2")
        await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen) and app.screen.query("#set-threads"))
        app.screen.query_one("#set-threads", Input).value = "2"
        app.screen.query_one("#set-draft_source").value = "lookup"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: len(made) == 2 and app.backend is made[1][1])
        assert made[0][1].closed
        assert made[1][0].settings.threads == 2 and made[1][0].draft_path is None  # lookup needs no draft model
        await run_prompt(pilot, CODE_PROMPT)
        assert [r.mode for r in made[1][1].requests] == ["plain", "lookup"]
        assert load_settings(tmp_path / "config.toml")[0].threads == 2

    in_app(go, backend_factory=factory, inspect_models=False)


def test_text_outgrowing_a_pane_scrolls_a_quarter_pane_at_a_time(in_app):
    """Jump scroll: each new line stays in view, but the view moves only every few lines."""

    async def go(app, pilot):
        pane = app.query_one("#pane-spec", OutputPane)
        view = pane.query_one(TokenView)
        height = view.scrollable_content_region.height
        slack = max(1, (height + 2) // 4)
        pane.begin()
        offsets = []
        for i in range(3 * height):
            pane.append([f"line {i}\n"], [False])
            await pilot.pause()
            last = len(view._lines) - 1
            assert view.scroll_offset.y <= last < view.scroll_offset.y + height, (i, view.scroll_offset.y)
            offsets.append(view.scroll_offset.y)
        moves = sum(b != a for a, b in zip(offsets, offsets[1:]))
        assert slack > 1 and 0 < moves <= (3 * height) // slack + 1, (moves, slack)
        assert view.virtual_size.height - len(view._lines) < slack
        view.scroll_home(animate=False)  # scrolled away by the user: new lines do not pull the view down
        await pilot.pause()
        pane.append(["more\n"], [False])
        await pilot.pause()
        assert view.scroll_offset.y == 0

    in_app(go, FakeBackend())


def test_appending_to_a_wrapped_paragraph_repaints_only_its_changed_lines(in_app):
    """A token added to a paragraph wrapped over several lines repaints the lines that changed, not the
    paragraph, and not the scrollbar's column; the text drawn is the text appended."""

    async def go(app, pilot):
        pane = app.query_one("#pane-spec", OutputPane)
        view = pane.query_one(TokenView)
        pane.begin()
        pane.append(["word " * 20], [False])  # one paragraph over several lines, all in view
        await pilot.pause()
        lines = len(view._lines)
        assert lines >= 3
        repaints = []
        refresh = view.refresh
        view.refresh = lambda *regions, **kw: (repaints.extend(regions), refresh(*regions, **kw))[1]
        pane.append(["tail"], [False])
        assert len(view._lines) == lines and view._plain[-1].endswith("tail")
        assert [(r.y + view.scroll_offset.y, r.height, r.width) for r in repaints] == [
            (lines - 1, 1, view.scrollable_content_region.width)]
        repaints.clear()
        pane.append([" more" * 8], [False])  # wraps onto a new line: the old last line and the new one
        assert lines < len(view._lines) <= view.scrollable_content_region.height
        assert [(r.y + view.scroll_offset.y, r.height) for r in repaints] == [(lines - 1, len(view._lines) - lines + 1)]
        assert " ".join(" ".join(view._plain).split()) == " ".join((("word " * 20) + "tail" + " more" * 8).split())

    in_app(go, FakeBackend())


def test_streaming_redraws_only_what_changed_with_textuals_result(in_app):
    """The cropped compositor writes exactly what Textual's partial update writes, rendering less."""
    from textual._compositor import Compositor
    from textual.geometry import Region
    from textual.widget import Widget

    from speclocal.tui.compositor import RowCroppedCompositor

    async def go(app, pilot):
        await run_prompt(pilot, CODE_PROMPT)
        comp = app.screen._compositor
        assert type(comp) is RowCroppedCompositor
        view = app.query_one("#pane-spec", OutputPane).query_one(TokenView)
        stats = app.query_one("#stats-ram")
        line = Region(view.region.x, view.region.y + 1, view.size.width, 1)  # one pane line, as while streaming
        updates = [[line], [Region(view.region.x, view.region.y, view.region.width, view.region.height)], [Region(0, 0, 80, 1)], [Region(0, 23, 80, 1)], [Region(3, 5, 40, 9)],
                   [line, Region(stats.region.x, stats.region.y, stats.region.width, 1)], [app.screen.region]]

        def written(cls, regions):
            comp.__class__ = cls
            try:
                comp._dirty_regions.clear()  # only these regions, not refreshes the app has pending
                comp._dirty_regions.update(regions)
                # a cursor move with nothing drawn after it draws nothing (Textual emits one for a cut that
                # starts where an update ends; the cropped compositor may not render the widget behind it)
                return re.sub(r"\x1b\[\d+;\d+H(?=\x1b\[\d+;\d+H|\n|$)", "",
                              comp.render_partial_update().render_segments(app.console))
            finally:
                comp.__class__ = RowCroppedCompositor

        for regions in updates:
            assert written(RowCroppedCompositor, regions) == written(Compositor, regions), regions
        # a pane line renders the pane's text view, not what is behind it (the pane, its containers, the
        # screen), nor the header, footer, stats or prompt
        rendered = []
        real = Widget.render_lines
        Widget.render_lines = lambda self, crop: rendered.append(self) or real(self, crop)
        try:
            written(RowCroppedCompositor, [line])
        finally:
            Widget.render_lines = real
        assert rendered == [view], [type(w).__name__ for w in rendered]

    in_app(go, FakeBackend())


# ---- snapshots --------------------------------------------------------------------------------
def test_snapshot_main_screen_mid_run(snap_compare):
    fake = FakeBackend(pause_at={"spec": 30})
    app = make_app(fake)

    async def run_before(pilot):
        await type_prompt(pilot, CODE_PROMPT)
        await pilot.press("ctrl+r")
        await wait_for(pilot, fake.paused.is_set)
        await pilot.pause(0.05)
        app.query_one("#prompt", TextArea).cursor_blink = False
        app._refresh_stats()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_snapshot_history(snap_compare):
    fake = FakeBackend()
    app = make_app(fake)

    async def run_before(pilot):
        for prompt in (CODE_PROMPT, "Tell me a short story about a cat.", "Convert this to JSON: name Ann, age 3"):
            await run_prompt(pilot, prompt)
        await pilot.press("f3")
        app.query_one("#prompt", TextArea).cursor_blink = False
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_snapshot_wide(snap_compare):
    fake = FakeBackend()
    app = make_app(fake)

    async def run_before(pilot):
        for prompt in (CODE_PROMPT, "Tell me a short story about a cat."):
            await run_prompt(pilot, prompt)
        app.query_one("#prompt", TextArea).cursor_blink = False
        await pilot.pause()

    assert snap_compare(app, terminal_size=(140, 40), run_before=run_before)


def test_snapshot_auto_sources(snap_compare):
    """Auto mode after a run: accepted tokens coloured by drafter, the legend under the prompt, the store's
    size in the stats."""
    fake = FakeBackend()
    app = make_app(fake, settings=Settings(draft_source="auto"))

    async def run_before(pilot):
        await run_prompt(pilot, CODE_PROMPT)
        app.query_one("#prompt", TextArea).cursor_blink = False
        await pilot.pause()

    assert snap_compare(app, terminal_size=(140, 40), run_before=run_before)


def test_stats_lines_fit_their_pane_after_a_run(in_app):
    """At 120x40 (the TUI bench's size) no stats line wraps: a wrapped line would push the last out of view."""

    async def go(app, pilot):
        await run_prompt(pilot, CODE_PROMPT)
        stats = app.query_one("#stats-spec")
        lines = str(stats.render()).split("\n")
        assert len(lines) == 5 and stats.size.height >= 5
        assert max(len(line) for line in lines) <= stats.size.width, lines

    in_app(go, FakeBackend(), size=(120, 40))


# ---- plain units ------------------------------------------------------------------------------
def step(n_tokens: int, drafted: int, accepted: int, n_generated: int, elapsed: float) -> StepEvent:
    return StepEvent(tokens=[0] * n_tokens, pieces=[""] * n_tokens, from_draft=[False] * n_tokens, drafted=drafted,
                     accepted=accepted, t_draft=0.0, t_verify=0.1, t_sample=0.0, n_generated=n_generated,
                     elapsed=elapsed)


def test_live_mode_rates_from_engine_time():
    lm = LiveMode("spec")
    lm.add([step(1, 0, 0, i + 1, 0.1 * (i + 1)) for i in range(20)])  # 10 t/s for 2 s
    assert lm.tps_avg() == pytest.approx(10.0)
    assert lm.tps_now() == pytest.approx(10.0)
    assert lm.spark() == pytest.approx([10.0] * 8)
    lm.add([step(4, 3, 3, 20 + 4 * (i + 1), 2.0 + 0.1 * (i + 1)) for i in range(10)])  # 40 t/s
    assert lm.tps_now() == pytest.approx(40.0)
    assert lm.acceptance() == 1.0 and lm.tokens_per_pass() == pytest.approx(60 / 30)
    assert sparkline([1.0, 2.0, 4.0], 10, 4.0) == "▃▅█"
    assert len(sparkline([1.0] * 100, 10, 1.0)) == 10


def test_streamed_pieces_split_into_paragraphs_without_control_characters():
    from rich.style import Style
    from rich.text import Text

    green = Style(color="green")
    paras = [Text()]
    add_pieces(paras, [("def f():\r\n", None), ("    return 1", green), ("\x1b[2J\nok\r", None)])
    assert [p.plain for p in paras] == ["def f():", "    return 1\ufffd[2J", "ok"]
    assert [(s.start, s.end, s.style) for s in paras[1].spans] == [(0, 12, green)]


def test_summary_per_task():
    def result(mode, tps, acc=0, drafted=0):
        return GenerationResult(mode, "x", [0] * 10, [False] * 10, "length", 5, 0, 0.1, 0.1, 10, 10 / tps, tps,
                                drafted, acc, acc / drafted if drafted else None, 5, 2.0, 0.0, 0.0, 0.0, 0.3, 0,
                                MemoryParts(0, 0, 0, 0))

    def rec(task, p, s, acc, drafted):
        return RunRecord(1, "t", task, "x", "plain>spec", 3, 0.0, result("plain", p), result("spec", s, acc, drafted), 0)

    rs = [rec("code", 10.0, 15.0, 9, 10), rec("chat", 10.0, 8.0, 2, 10), rec("code", 10.0, 13.0, 7, 10)]
    sums = {s.task: s for s in summarize_by_task(rs)}
    assert sums["code"].runs == 2 and sums["code"].speedup == pytest.approx(1.4)
    assert sums["code"].acceptance == pytest.approx(0.8) and sums["code"].verdict() == "spec pays"
    assert sums["chat"].verdict() == "plain wins"
    assert history_csv(rs).count("\n") == 4


def test_config_round_trip_and_bad_files(tmp_path):
    s = Settings(system_prompt='He said "hi"\n\tand \\ left \x7f', temperature=0.25, draft_p_min=1e-05, pair="tiny")
    path = save_settings(s, tmp_path / "sub" / "config.toml")
    assert load_settings(path) == (s, None)
    assert tomllib.loads(dumps(s))["settings"]["system_prompt"] == s.system_prompt
    path.write_text("[settings]\ndraft_max = 'three'\nseed = 7\nunknown = 1\n")
    got, warning = load_settings(path)
    assert got.seed == 7 and got.draft_max == 3 and "draft_max" in warning
    path.write_text("not = [toml")
    got, warning = load_settings(path)
    assert got == Settings() and "not valid TOML" in warning and "set aside" in warning
    aside = list(path.parent.glob("config.toml.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_text() == "not = [toml"  # kept for the user, not overwritten
    path.write_text("[settings]\ndraft_max = 0\n")
    assert load_settings(path)[0] == Settings()
    assert load_settings(tmp_path / "missing.toml") == (Settings(), None)
    assert not list(path.parent.glob("*.tmp"))  # no temporary files left


def test_settings_from_command_line_args():
    import argparse

    from speclocal.options import add_options

    args = argparse.Namespace(pair=None, main="/x/main.gguf", draft=None, ctx_size=2048, threads=None,
                              n_gpu_layers=None, models_dir=None)
    s = settings_from_cli(Settings(draft_max=5), args)
    assert (s.main, s.draft, s.draft_source, s.ctx_size, s.draft_max) == ("/x/main.gguf", "", "lookup", 2048, 5)
    assert settings_from_cli(Settings(), None) == Settings()
    # flags left at their defaults do not override saved settings
    p = argparse.ArgumentParser()
    add_options(p, "models")
    add_options(p, "generation")
    saved = Settings(ctx_size=8192, n_predict=100, temperature=0.5)
    assert settings_from_cli(saved, p.parse_args([])) == saved
    assert settings_from_cli(saved, p.parse_args(["-n", "64", "--pair", "coder-7b"])).n_predict == 64


def test_importing_the_tui_does_not_load_llama_cpp():
    code = ("import sys, speclocal.tui, speclocal.tui.app; "
            "assert 'llama_cpp' not in sys.modules and 'speclocal.engine.llama' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("argv", [[], ["tui"]])
def test_without_a_terminal_the_tui_exits_at_once_with_one_line(argv):
    """Standard input a pipe (a script, CI): one line pointing to `speclocal run`, exit 2, no hang, no traceback."""
    out = subprocess.run([sys.executable, "-m", "speclocal.cli", *argv], input="", capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.count("\n") == 1 and "needs a terminal" in out.stderr and "speclocal run" in out.stderr


def test_a_load_that_ends_after_the_app_closed_frees_its_models_and_shows_nothing():
    """The load worker posts its result; if the App closed meanwhile (its screens are gone) the models it loaded
    are closed and no screen is shown (it raised NoMatches from a pane that was no longer there)."""
    from speclocal.tui.messages import BackendLoaded, LoadFailed
    from speclocal.tui.testing import FakeBackend

    closed: list[bool] = []

    class Loaded(FakeBackend):
        def close(self) -> None:
            closed.append(True)

    app = SpeclocalApp(Settings(), backend=None, config_path=None)
    assert app.screen_stack == []  # as after the App's shutdown closed its screens
    app.on_backend_loaded(BackendLoaded(Loaded(), 0.1))
    app.on_load_failed(LoadFailed("no such file"))
    assert closed == [True] and app.backend is None
