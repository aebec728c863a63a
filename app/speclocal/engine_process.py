"""The TUI's engine in a process of its own.

`ProcessBackend` runs `EngineBackend` in a spawned child process that does nothing but decode, like
`speclocal run`; the App talks to it through a pipe. Steps stream back one message per main-model
pass; cancelling sets a shared event the engine checks before each step. The UI's Python and the
decode loop's no longer share a GIL, so a redraw never delays the decode thread taking it back after a
llama.cpp call; the cores are still shared (docs/benchmarks.md: what drawing costs decoding).

A llama.cpp abort or crash ends the child, not the App: the next call raises `EngineProcessError`
and the terminal is left as it was. Unloading ends the process, so all its memory goes back.

The child writes nothing to the terminal: its stdout and stderr (llama.cpp's C logging) and its
Python logging go to the log file it is given.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
from pathlib import Path

from speclocal.engine.types import GenerationRequest, GenerationResult, MemoryParts
from speclocal.errors import SpeclocalError
from speclocal.tui.backend import EngineBackend, LoadSpec, OnStep

log = logging.getLogger("speclocal.tui")

POLL_S = 0.05  # how often a waiting call checks the cancel flag and that the child is alive
CLOSE_WAIT_S = 10.0


class EngineProcessError(SpeclocalError):
    """The engine process failed or ended."""


class _Stderr2:
    """A stand-in for `sys.stderr` whose file descriptor is 2; what is written to it is dropped."""

    def fileno(self) -> int:
        return 2

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _start_resource_tracker() -> None:
    """multiprocessing's resource tracker (its Event needs one) is started on first use and handed
    `sys.stderr.fileno()`. While a Textual app runs, `sys.stderr` is Textual's capture, whose fileno()
    is -1, and starting the engine failed with "bad value(s) in fds_to_keep". Start it on fd 2 (the TUI
    points fd 2 at its log file) before anything else needs it."""
    from multiprocessing import resource_tracker

    saved = sys.stderr
    sys.stderr = _Stderr2()
    try:
        resource_tracker.ensure_running()
    finally:
        sys.stderr = saved


def _quiet(log_file: str | None) -> None:
    """In the child: point fds 1 and 2 and Python logging at the log file (or at nothing)."""
    target = log_file or os.devnull
    try:
        if log_file:
            Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        fd = os.open(os.devnull, os.O_WRONLY)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    root = logging.getLogger()
    root.handlers.clear()
    if log_file:
        handler = logging.FileHandler(target, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s engine %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)


def _error(e: BaseException) -> tuple:
    if isinstance(e, SpeclocalError):
        return ("error", None, str(e))
    return ("error", type(e).__name__, str(e))


def serve(spec: LoadSpec, conn, cancel, log_file: str | None) -> None:
    """The child's main loop: load, then answer requests until `close` or the parent goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the App stops runs (cancel) and the child (close)
    _quiet(log_file)
    try:
        backend = EngineBackend(spec)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which shows it
        if not isinstance(e, SpeclocalError):
            log.exception("loading models failed")
        conn.send(_error(e))
        return
    try:
        conn.send(("ready", backend.describe(), backend.has_draft_model, backend.memory()))
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            cmd = msg[0]
            if cmd == "close":
                break
            try:
                if cmd == "generate":
                    _, request, stream = msg
                    on_step = (lambda ev: conn.send(("step", ev))) if stream else None
                    conn.send(("done", backend.generate(request, on_step, cancel)))
                elif cmd == "reset":
                    backend.reset()
                    conn.send(("done", None))
                else:
                    conn.send(("error", "ValueError", f"unknown request {cmd!r}"))
            except (BrokenPipeError, EOFError):
                break
            except Exception as e:  # noqa: BLE001 - reported to the parent
                if not isinstance(e, SpeclocalError):
                    log.exception("%s failed", cmd)
                conn.send(_error(e))
    finally:
        backend.close()


class ProcessBackend:
    """A `GenerationBackend` whose engine lives in a child process. Construction starts the child
    and waits until it has loaded the models (or raises what loading raised)."""

    def __init__(self, spec: LoadSpec, log_file: Path | None = None):
        _start_resource_tracker()
        ctx = mp.get_context("spawn")  # a fresh interpreter: no threads or llama.cpp state forked
        self._conn, child_conn = ctx.Pipe()
        self._cancel = ctx.Event()
        self._lock = threading.Lock()
        self._proc = ctx.Process(target=serve, args=(spec, child_conn, self._cancel,
                                                     str(log_file) if log_file else None),
                                 name="speclocal-engine", daemon=True)
        self._proc.start()
        child_conn.close()
        try:
            msg = self._wait(None)
        except BaseException:
            self.close()
            raise
        _, self._describe, self._has_draft, self._memory = msg

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def describe(self) -> str:
        return self._describe

    @property
    def has_draft_model(self) -> bool:
        return self._has_draft

    def memory(self) -> MemoryParts:
        return self._memory

    def generate(self, request: GenerationRequest, on_step: OnStep | None,
                 cancel: threading.Event) -> GenerationResult:
        with self._lock:
            self._cancel.clear()
            self._send(("generate", request, on_step is not None))
            while True:
                msg = self._wait(cancel)
                if msg[0] == "step":
                    if on_step is not None:
                        on_step(msg[1])
                    continue
                result: GenerationResult = msg[1]
                self._memory = result.memory
                return result

    def reset(self) -> None:
        with self._lock:
            self._send(("reset",))
            self._wait(None)

    def close(self) -> None:
        if self._proc.is_alive():
            try:
                self._conn.send(("close",))
            except OSError:
                pass
            self._proc.join(CLOSE_WAIT_S)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(CLOSE_WAIT_S)
        self._conn.close()

    def _send(self, msg: tuple) -> None:
        try:
            self._conn.send(msg)
        except OSError as e:
            raise EngineProcessError(f"the engine process has gone ({e}); restart speclocal") from None

    def _wait(self, cancel: threading.Event | None) -> tuple:
        """The child's next message; passes `cancel` on while waiting; raises the child's errors."""
        while True:
            if cancel is not None and cancel.is_set() and not self._cancel.is_set():
                self._cancel.set()
            try:
                ready = self._conn.poll(POLL_S)
                msg = self._conn.recv() if ready else None
            except (EOFError, OSError):
                msg = None
                ready = True
            if msg is None:
                if ready or not self._proc.is_alive():
                    self._proc.join(1.0)
                    raise EngineProcessError(
                        f"the engine process ended unexpectedly (exit code {self._proc.exitcode}; see the log)")
                continue
            if msg[0] == "error":
                _, kind, text = msg
                raise SpeclocalError(text) if kind is None else RuntimeError(f"{kind}: {text}")
            return msg
