"""The TUI's engine in its own process (SmolLM2-135M drafting for itself: quick, real llama.cpp)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from speclocal.errors import SpeclocalError
from speclocal.engine.types import GenerationRequest
from speclocal.engine_process import EngineBackend, LoadSpec
from speclocal.engine_process import EngineProcessError, ProcessBackend
from speclocal.options import Settings

TUI_BENCH = str(Path(__file__).resolve().parents[1] / "scripts" / "tui_bench.py")
MESSAGES = ({"role": "user", "content": "List three colours of the rainbow."},)


@pytest.fixture(scope="module")
def remote(smollm2, tmp_path_factory):
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    backend = ProcessBackend(LoadSpec(smollm2, smollm2, Settings(ctx_size=1024)), log_file=log)
    yield backend, log
    backend.close()


def test_generation_in_the_child_equals_the_in_process_engine(remote, smollm2):
    backend, log = remote
    assert backend.pid != os.getpid() and backend.has_draft_model
    assert smollm2.name in backend.describe() and backend.memory().main_weights > 0
    steps = []
    backend.reset()
    got = backend.generate(GenerationRequest(messages=MESSAGES, mode="spec", n_predict=20), steps.append, threading.Event())
    local = EngineBackend(LoadSpec(smollm2, smollm2, Settings(ctx_size=1024)))
    try:
        want = local.generate(GenerationRequest(messages=MESSAGES, mode="spec", n_predict=20), None, threading.Event())
    finally:
        local.close()
    assert got.text == want.text and got.n_generated == want.n_generated == 20
    assert sum(len(s.tokens) for s in steps) == got.n_generated and len(steps) == got.n_passes
    assert "".join(p for s in steps for p in s.pieces) == got.text
    assert got.n_accepted == want.n_accepted > 0  # the model drafting for itself is accepted
    assert "llama" in log.read_text(), "the child's llama.cpp log went somewhere else"


def test_cancel_reaches_the_child_within_a_step(remote):
    backend, _ = remote
    cancel = threading.Event()
    steps = []

    def on_step(ev) -> None:
        steps.append(ev)
        if len(steps) == 2:
            cancel.set()

    backend.reset()
    out = backend.generate(GenerationRequest(messages=MESSAGES, mode="plain", n_predict=200), on_step, cancel)
    assert out.stop_reason == "cancelled"
    assert 2 <= out.n_generated <= 8, out.n_generated  # set during step 2; the child sees it within a few steps
    # and the next run is not cancelled by the last one's flag
    out = backend.generate(GenerationRequest(messages=MESSAGES, mode="plain", n_predict=5), None, threading.Event())
    assert out.stop_reason == "length" and out.n_generated == 5


def test_each_load_setting_reaches_the_engine_as_one_of_its_keywords():
    """`options.load_args` is what the engine process and `Engine.from_settings` load with."""
    from inspect import signature

    from speclocal import options
    from speclocal.engine import Engine

    s = Settings(ctx_size=512, threads=2, n_gpu_layers="0", repack=False, backend_sampling=True, force=True)
    args = options.load_args(s)
    assert args == {"n_ctx": 512, "n_threads": 2, "n_gpu_layers": "0", "repack": False, "backend_sampling": True,
                    "force": True}
    assert set(args) <= set(signature(Engine.__init__).parameters)
    assert options.load_key(s) != options.load_key(Settings()) == options.load_key(Settings(force=True))


def test_load_errors_come_back_as_errors(tmp_path):
    bad = tmp_path / "not-a-model.gguf"
    bad.write_text("hello")
    with pytest.raises(SpeclocalError, match="not a GGUF file"):
        ProcessBackend(LoadSpec(bad, None))


def test_a_dead_engine_process_is_an_error_not_a_hang(smollm2):
    backend = ProcessBackend(LoadSpec(smollm2, None, Settings(ctx_size=512)))
    try:
        os.kill(backend.pid, 9)
        with pytest.raises(EngineProcessError, match="engine process"):
            backend.generate(GenerationRequest(messages=MESSAGES, mode="plain", n_predict=5), None, threading.Event())
    finally:
        backend.close()


def test_starts_while_textual_captures_stderr(smollm2, tmp_path):
    """Under a running Textual app `sys.stderr` has fileno() -1; in a real terminal that made the
    first engine start fail ("bad value(s) in fds_to_keep"). A fresh interpreter, as `speclocal` is."""
    script = tmp_path / "start_under_capture.py"
    script.write_text(f"""
import sys
from pathlib import Path
from speclocal.engine_process import LoadSpec
from speclocal.engine_process import ProcessBackend
from speclocal.options import Settings

class Capture:  # what textual.app._PrintCapture answers
    def fileno(self): return -1
    def write(self, text): return len(text)
    def flush(self): pass

if __name__ == "__main__":
    sys.stderr = Capture()
    backend = ProcessBackend(LoadSpec(Path({str(smollm2)!r}), None, Settings(ctx_size=256)))
    print("loaded", backend.has_draft_model)
    backend.close()
""")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "loaded False", out.stdout + out.stderr


def test_tui_bench_bad_model_is_one_line(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_text("not a model")
    out = subprocess.run([sys.executable, TUI_BENCH, "-m", str(bad), "-n", "4", "--reps", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tui_bench.py: error: not a GGUF file"), lines


@pytest.mark.parametrize("args,message", [(["--reps", "0"], "--reps and -n/--n-predict must be at least 1"),
                                          (["--size", "big"], "--size must be COLUMNSxROWS")])
def test_tui_bench_bad_arguments_are_one_line_before_loading(args, message):
    out = subprocess.run([sys.executable, TUI_BENCH, *args], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr and message in out.stderr.strip().splitlines()[-1]


@pytest.mark.models
def test_tui_bench_times_a_real_tui_run(smollm2):
    """The bench drives the real App against the engine process and reads what it drew: a change to how the App
    feeds its panes must not leave it waiting for a run that never ends."""
    out = subprocess.run([sys.executable, TUI_BENCH, "-m", str(smollm2), "-md", str(smollm2), "-c", "512", "-n", "8",
                          "--reps", "1"], capture_output=True, text=True, timeout=180)
    assert out.returncode in (0, 1), out.stderr[-2000:]  # 1: a ratio below the bench's 0.97 target
    rows = {line.split("|")[1].strip(): line for line in out.stdout.splitlines() if line.startswith("| p")
            or line.startswith("| s")}
    assert set(rows) == {"plain", "spec"}, out.stdout
