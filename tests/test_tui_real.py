"""The TUI end to end on the real tiny pair (Qwen2.5-Coder 1.5B + 0.5B): load, run, colour, stats."""

from __future__ import annotations

import asyncio
import os
import re
import time

import pytest
from textual.widgets import Static, TextArea

from speclocal.tui.app import SpeclocalApp
from speclocal.options import Settings
from speclocal.tui.screens import ChoiceScreen
from speclocal.tui.widgets import OutputPane, StatsPane

PROMPT = "Write a Python function `is_even(n)` that returns True when n is even. Only the code."


async def wait_for(pilot, predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await pilot.pause(0.05)


def test_real_tui_runs_both_modes_on_the_tiny_pair(tiny_main, tiny_draft, tmp_path):
    settings = Settings(main=str(tiny_main), draft=str(tiny_draft), n_predict=24, ctx_size=1024, draft_max=3)

    async def go():
        app = SpeclocalApp(settings, config_path=tmp_path / "config.toml")
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.backend is not None or isinstance(app.screen, ChoiceScreen), 300)
            assert app.backend is not None, "the pair did not load"
            assert tiny_main.name in app.sub_title and tiny_draft.name in app.sub_title
            editor = app.query_one("#prompt", TextArea)
            editor.focus()
            editor.insert(PROMPT)
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: app.history and not app.running, 300)
            await pilot.pause(0.3)

            rec = app.history[0]
            assert rec.task == "code" and rec.spec_mode == "spec"
            assert 5 <= rec.plain.n_generated <= 24 and 5 <= rec.spec.n_generated <= 24
            assert rec.acceptance is not None and rec.acceptance > 0
            spec = app.query_one("#pane-spec", OutputPane)
            plain = app.query_one("#pane-plain", OutputPane)
            assert "def is_even" in plain.text and "def is_even" in spec.text
            assert spec.coloured_spans(), "no accepted draft token was coloured"
            assert spec.n_from_draft == app.last_run.results["spec"].n_accepted > 0
            assert plain.coloured_spans() == []

            stats = app.query_one(StatsPane)
            text = "\n".join(str(w.render()) for w in stats.query(Static))
            m = re.search(r"accept(?:ance)?\s+(\d+)%", text)
            assert m and int(m.group(1)) > 0, text
            assert "RAM" in text and ("draft adds" in text or "the draft costs" in text)
            mem = app.memory
            assert mem.main_weights > mem.draft_weights > 0 and mem.main_kv > 0 and mem.draft_kv > 0
            # what llama.cpp holds per device, from the engine's process: on this CPU, all of it on the host
            assert list(mem.main_held) == list(mem.draft_held) == ["host"] and "held" in text and "host" in text
            # the engine runs in a process of its own; the RAM shown counts it (it holds the weights)
            assert app.backend.pid != os.getpid() and app.rss > mem.main_weights
            await pilot.press("ctrl+q")
        app.close_backend()

    asyncio.run(go())


def test_real_incompatible_pair_shows_the_verdict(tiny_main, smollm2, tmp_path):
    """SmolLM2 has another tokenizer: the inspector's verdict is shown, nothing is loaded."""
    loaded = []
    settings = Settings(main=str(tiny_main), draft=str(smollm2))

    async def go():
        app = SpeclocalApp(settings, backend_factory=lambda spec: loaded.append(spec))
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: isinstance(app.screen, ChoiceScreen) and app.screen.query("#choice-text"), 60)
            text = str(app.screen.query_one("#choice-text").render())
            assert "NOT compatible" in text
            assert loaded == [] and app.backend is None

    asyncio.run(go())


@pytest.mark.parametrize("size", [(80, 24)])
def test_real_tui_loads_in_80x24_without_log_lines(tiny_main, tiny_draft, size, capfd):
    """Nothing from llama.cpp reaches the terminal while the app runs (the engine logs to `logging`)."""
    settings = Settings(main=str(tiny_main), draft=str(tiny_draft), n_predict=4, ctx_size=512)

    async def go():
        app = SpeclocalApp(settings)
        async with app.run_test(size=size) as pilot:
            await wait_for(pilot, lambda: app.backend is not None or isinstance(app.screen, ChoiceScreen), 300)
            assert app.backend is not None
        app.close_backend()

    asyncio.run(go())
    out, err = capfd.readouterr()
    assert "llama" not in out + err and "ggml" not in out + err


def test_settings_list_only_compatible_drafts(tiny_main, tiny_draft, smollm2):
    """Like LM Studio: for the 1.5B main, the 0.5B (same tokenizer) is offered, SmolLM2 is not."""
    from speclocal.tui.screens import compatible_drafts, local_models

    candidates = local_models(tiny_main.parent)
    paths = {p for _, _, p in candidates}
    assert {tiny_main, tiny_draft, smollm2} <= paths
    drafts, note = compatible_drafts(tiny_main, candidates)
    offered = {p for _, _, p in drafts}
    assert tiny_draft in offered and smollm2 not in offered and tiny_main not in offered
    assert "hidden" in note


def test_draft_picker_shows_the_measured_ranking_or_how_to_measure(tiny_main, tiny_draft, tmp_path):
    """F2's draft picker: without a saved ranking a hint to run `speclocal drafts`; with one, each ranked draft's
    measured speedup per task type beside its name."""
    from speclocal.policy import drafts_rank as dr
    from speclocal.policy.profile import machine_id
    from speclocal.tui.screens import SettingsScreen
    from speclocal.tui.testing import FakeBackend

    async def picker() -> tuple[list[str], str]:
        app = SpeclocalApp(Settings(main=str(tiny_main)), backend=FakeBackend(), config_path=tmp_path / "c.toml")
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("f2")
            await wait_for(pilot, lambda: isinstance(app.screen, SettingsScreen)
                           and str(app.screen.query_one("#draft-note", Static).render()), 30)
            labels = [str(label) for label, _ in app.screen.query_one("#set-draft")._options]
            return labels, str(app.screen.query_one("#draft-note", Static).render())

    labels, note = asyncio.run(picker())
    assert "speclocal drafts" in note and not any("#1" in x for x in labels)
    row = {"label": "qwen2.5-coder-0.5b-q4km", "path": str(tiny_draft), "overall": {"k_drafting": 3},
           "tasks": {"code": {"predicted": 1.3, "best_k": 3}, "chat": {"predicted": 1.0, "best_k": 0}}}
    dr.save_ranking({"version": dr.RANKING_VERSION, "main": str(tiny_main), "main_key": dr._file_key(tiny_main),
                     "machine": machine_id(), "measured_at": time.time(), "candidates": [row]})
    labels, note = asyncio.run(picker())
    assert any("#1: code 1.30x chat plain" in x for x in labels), labels
    assert "ranked by `speclocal drafts`" in note


def test_both_modes_of_a_run_start_from_the_same_cache_state(smollm2):
    """The second mode of a run reuses no more of the KV cache than the first did: on the second turn of a chat
    both reuse the first turn, neither the prompt the other just processed (spec first, then plain, in run 2)."""
    from speclocal.engine_process import EngineBackend, LoadSpec

    backend = EngineBackend(LoadSpec(smollm2, smollm2, Settings(ctx_size=1024)))
    settings = Settings(n_predict=12, draft_max=3, order="alternate")

    async def go():
        app = SpeclocalApp(settings, backend=backend)
        async with app.run_test(size=(100, 30)) as pilot:
            for n, prompt in enumerate(["Name a colour.", "Name another one, and say why you like it."], start=1):
                editor = app.query_one("#prompt", TextArea)
                editor.focus()
                editor.insert(prompt)
                await pilot.press("ctrl+r")
                await wait_for(pilot, lambda: len(app.history) == n and not app.running, 120)
            first, second = app.history
            assert second.order == "spec>plain"
            for rec in (first, second):
                assert rec.plain.n_prompt_cached == rec.spec.n_prompt_cached, rec.order
            assert second.plain.n_prompt_cached > 0  # the first turn is reused, by both
            assert second.plain.n_prompt_cached < second.plain.n_prompt - 1

    try:
        asyncio.run(go())
    finally:
        backend.close()
