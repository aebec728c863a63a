"""A native crash (llama.cpp's kernels, an abort) becomes one line and an exit code, not a silent death.

`supervise` runs a command that loads models in a forked child and waits: the child does the work exactly as it
would have (same terminal, same standard streams), writing llama.cpp's log and, at a crash, the Python stack
(`faulthandler`) to the command's log file. When the child dies by a signal, the parent prints
`speclocal: error: the llama.cpp engine crashed (signal 11, SIGSEGV); ...` with that log's path, lets the command
save what it can (`on_crash`: bench writes its partial report) and exits with 128 + the signal's number.

Signals: Ctrl-C at a terminal reaches both processes (the child stops within a step, as before); a SIGINT or
SIGTERM sent to the parent alone (`kill`, a test, a service manager) is passed on to the child. Where `fork` or
`sigtimedwait` is missing (Windows, macOS), the command runs in this process, uncontained.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Callable

SI_KERNEL = 0x80  # siginfo.si_code of a signal the kernel sent (the terminal's Ctrl-C), not a process's kill()
FORWARDED = (signal.SIGINT, signal.SIGTERM)


def signal_text(signum: int) -> str:
    try:
        return f"signal {signum}, {signal.Signals(signum).name}"
    except ValueError:
        return f"signal {signum}"


def crash_line(signum: int, log_path: Path | str | None) -> str:
    """The one line a crash becomes."""
    where = f"; llama.cpp's log and the Python stack at the crash: {log_path}" if log_path else ""
    return f"the llama.cpp engine crashed ({signal_text(signum)}){where}"


def supported() -> bool:
    return hasattr(os, "fork") and hasattr(signal, "sigtimedwait") and hasattr(signal, "pthread_sigmask")


def supervise(work: Callable[[], int], log_path: Path, on_crash: Callable[[str], None] | None = None) -> int:
    """Run `work` in a forked child (see the module's docstring); its exit code, or 128 + the signal that killed it
    after one line on stderr. In the child this returns `work()`'s code, so the caller exits as it always does."""
    if not supported():
        return work()
    sys.stdout.flush()
    sys.stderr.flush()
    watched = {*FORWARDED, signal.SIGCHLD}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)  # before fork: no signal slips between
    pid = os.fork()
    if pid == 0:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        _record_crashes_in(log_path)
        return work()
    try:
        status = _wait(pid)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return code
    line = crash_line(-code, log_path)
    print(f"speclocal: error: {line}", file=sys.stderr, flush=True)
    if on_crash is not None:
        on_crash(line)
    return 128 - code


def _wait(pid: int) -> int:
    """Wait for the child, passing on SIGINT/SIGTERM that were sent to this process alone."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        info = signal.sigtimedwait({*FORWARDED, signal.SIGCHLD}, 1.0)
        if info is not None and info.si_signo in FORWARDED and info.si_code != SI_KERNEL:
            try:
                os.kill(pid, info.si_signo)
            except ProcessLookupError:
                pass


def _record_crashes_in(log_path: Path) -> None:
    """In the child: llama.cpp's log (from INFO) to `log_path`, and the Python stack there at a fatal signal."""
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        stream = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - open while the process lives
    except OSError:
        return
    faulthandler.enable(stream)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    for name in ("speclocal.llama_cpp", "speclocal.layout"):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        if logger.getEffectiveLevel() > logging.INFO:
            logger.setLevel(logging.INFO)
