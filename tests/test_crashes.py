"""A native crash of the engine (SIGSEGV sent to the process that decodes, as llama.cpp's kernels die) becomes one
line naming the signal and the log, a non-zero exit, and keeps what was finished: `speclocal run` and `bench` run
their work in a supervised child (speclocal.crash); the engine process of the TUI and `serve` is started again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from polling import wait_for

from speclocal.engine.types import GenerationRequest
from speclocal.engine_process import EngineCrashed, LoadSpec, ProcessBackend
from speclocal.options import Settings

SPECLOCAL = [sys.executable, "-m", "speclocal.cli"]
CRASH_LINE = "speclocal: error: the llama.cpp engine crashed (signal 11, SIGSEGV); llama.cpp's log and the Python " \
             "stack at the crash: {log}"


def _said(err: str) -> list[str]:
    """stderr's lines, less the weight layout's one-time notice (said where this session first probed)."""
    return [line for line in err.strip().splitlines() if "weight layout" not in line]


def _worker(proc: subprocess.Popen) -> psutil.Process:
    """The supervised child that does a command's work (the only child of the `speclocal` process)."""
    assert wait_for(lambda: psutil.Process(proc.pid).children(), timeout=30, poll=0.01)
    (child,) = psutil.Process(proc.pid).children()
    return child


def test_run_crash_is_one_line_naming_the_signal_and_the_log(smollm2, user_dirs):
    proc = subprocess.Popen(SPECLOCAL + ["run", "Write a very long essay about rivers.", "--mode", "plain", "-m",
                                         str(smollm2), "-n", "2000", "-c", "4096"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout.read(40)  # streamed text: the engine is decoding
    _worker(proc).send_signal(signal.SIGSEGV)
    out, err = proc.communicate(timeout=60)
    log = user_dirs["logs"] / "run.log"
    assert proc.returncode == 128 + signal.SIGSEGV
    assert _said(err) == [CRASH_LINE.format(log=log)] and "Traceback" not in err
    assert "Fatal Python error: Segmentation fault" in log.read_text()  # where it died, for a bug report


def test_bench_crash_keeps_a_partial_report_of_the_finished_runs(smollm2, tmp_path, user_dirs):
    out = tmp_path / "out"
    proc = subprocess.Popen(SPECLOCAL + ["bench", "--categories", "qa,creative", "--per-category", "2", "-n", "8",
                                         "--methods", "plain,lookup", "-m", str(smollm2), "-c", "512", "--out",
                                         str(out), "--profile-every", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checkpoint = out / ".partial.json"

    def runs_done() -> int:
        try:
            return json.loads(checkpoint.read_text())["runs_done"]
        except (OSError, ValueError, KeyError):
            return 0

    assert wait_for(lambda: runs_done() >= 3 or proc.poll() is not None, timeout=300, poll=0.05)
    assert proc.poll() is None, proc.communicate()[1]
    _worker(proc).send_signal(signal.SIGSEGV)
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGSEGV, err
    assert CRASH_LINE.format(log=user_dirs["logs"] / "bench.log") in err and "Traceback" not in err
    data = json.loads((out / "results.json").read_text())
    assert data["partial"] is True and 3 <= data["runs_done"] == len(data["runs"]) < data["runs_planned"] == 12
    assert "signal 11, SIGSEGV" in data["crashed"]
    report = (out / "report.md").read_text()
    assert report.startswith("# speclocal bench report (PARTIAL)") and "stopped by a crash" in report
    assert "report:" in stdout and not checkpoint.exists()


def test_a_crashed_engine_process_says_so_and_the_next_call_starts_a_new_one(smollm2, tmp_path):
    log = tmp_path / "engine.log"
    backend = ProcessBackend(LoadSpec(smollm2, None, Settings(ctx_size=512)), log_file=log)
    req = GenerationRequest(prompt="Once upon a time", mode="plain", n_predict=400)
    try:
        first = backend.pid
        threading.Timer(0.5, os.kill, (first, signal.SIGSEGV)).start()
        with pytest.raises(EngineCrashed) as crash:
            backend.generate(req, None, threading.Event())
        assert str(crash.value).startswith("the llama.cpp engine crashed (signal 11, SIGSEGV)")
        assert str(log) in str(crash.value) and "Fatal Python error: Segmentation fault" in log.read_text()
        again = backend.generate(GenerationRequest(prompt="Once upon a time", mode="plain", n_predict=4), None,
                                 threading.Event())
        assert again.n_generated == 4 and backend.pid != first and backend.restarts == 1
    finally:
        backend.close()


def test_run_without_a_crash_exits_as_before(smollm2):
    done = subprocess.run(SPECLOCAL + ["run", "Count: 1, 2, 3,", "--raw", "--mode", "plain", "-m", str(smollm2),
                                       "-n", "4", "-c", "256"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "decode tokens/s" in done.stdout and _said(done.stderr) == []
    bad = subprocess.run(SPECLOCAL + ["run", "hi", "-m", "no/such.gguf"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("speclocal: error:") and bad.stderr.count("\n") == 1


def test_the_tui_shows_a_crash_in_the_pane_and_runs_again(smollm2, tmp_path):
    import asyncio

    from textual.widgets import TextArea

    from speclocal.options import Settings
    from speclocal.tui.app import SpeclocalApp
    from speclocal.tui.widgets import OutputPane

    settings = Settings(main=str(smollm2), draft=str(smollm2), n_predict=400, ctx_size=1024, draft_source="lookup")

    async def go():
        app = SpeclocalApp(settings, config_path=tmp_path / "config.toml")
        async with app.run_test(size=(100, 30)) as pilot:
            async def until(predicate, timeout):
                deadline = time.monotonic() + timeout
                while not predicate():
                    assert time.monotonic() < deadline, "condition not reached in time"
                    await pilot.pause(0.05)

            await until(lambda: app.backend is not None, 120)
            editor = app.query_one("#prompt", TextArea)
            editor.focus()
            editor.insert("Write a long story about a lighthouse keeper.")
            await pilot.press("ctrl+r")
            plain = app.query_one("#pane-plain", OutputPane)
            await until(lambda: len(plain.text) > 20, 60)
            first = app.backend.pid
            os.kill(first, signal.SIGSEGV)
            await until(lambda: not app.running, 60)
            assert plain.border_subtitle == "failed"
            assert "the llama.cpp engine crashed (signal 11, SIGSEGV)" in plain.note_text
            assert "ctrl+r runs again" in plain.note_text and app.history == []
            app.settings = Settings(**{**vars(settings), "n_predict": 6})
            await pilot.press("ctrl+r")
            await until(lambda: app.history and not app.running, 120)
            assert app.backend.pid != first and app.history[0].plain.n_generated == 6
            await pilot.press("ctrl+q")
        app.close_backend()

    asyncio.run(go())
