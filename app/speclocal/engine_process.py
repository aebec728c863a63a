"""The engine in a process of its own, for the front ends that live on (the TUI, `speclocal serve`).

`ProcessBackend` runs `EngineBackend` in a spawned child process that does nothing but decode; the parent talks to
it through a pipe. Steps stream back one message per main-model pass; cancelling sets a shared event the engine
checks before each step. The parent's Python and the decode loop's no longer share a GIL, so drawing or serving
HTTP never delays the decode thread taking it back after a llama.cpp call (the cores are still shared).

A native crash in llama.cpp ends the child, not the parent: the call in flight raises `EngineCrashed`, one line
naming the signal and the log, and the next call starts a fresh child (the models load again), so the user or the
next client goes on. Unloading ends the process, so all its memory goes back.

The child writes nothing to the parent's terminal: its stdout and stderr (llama.cpp's C logging), its Python
logging and, at a crash, the Python stack (`faulthandler`) go to the log file it is given.
"""

from __future__ import annotations

import faulthandler
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from speclocal import options
from speclocal.crash import crash_line
from speclocal.engine.types import GenerationRequest, GenerationResult, MemoryParts, StepEvent
from speclocal.errors import SpeclocalError

log = logging.getLogger("speclocal.engine_process")

POLL_S = 0.05  # how often a waiting call checks the cancel flag and that the child is alive
CLOSE_WAIT_S = 10.0

OnStep = Callable[[StepEvent], None]


class EngineProcessError(SpeclocalError):
    """The engine process failed or ended."""


class EngineCrashed(EngineProcessError):
    """The engine process died by a signal (a native crash); the next call starts a new one."""


@dataclass(frozen=True)
class LoadSpec:
    """What loading needs: the planned files and the settings they load with (`options.load_args`)."""

    main_path: Path
    draft_path: Path | None
    settings: options.Settings = options.Settings()
    store_dir: Path | None = None  # the suffix store's directory (opened only when a request uses it)
    check_pair: bool = False  # the TUI checked the pair before loading (its verdict screen); serve has not
    measure_curve: bool = False  # auto's cost curve measured (or read from the cache) right after loading


@dataclass(frozen=True)
class EngineFacts:
    """What the parent knows of the loaded engine without asking it."""

    describe: str  # one line naming the models, the device and the layout (the TUI's header)
    main_path: Path
    draft_name: str | None
    n_ctx: int
    memory: MemoryParts
    layout_note: str = ""  # what the layout probe found, when it found it just now


class EngineBackend:
    """The real engine behind `ProcessBackend`, in the child. Construction loads the weights (seconds)."""

    def __init__(self, spec: LoadSpec):
        from speclocal.engine import Engine  # imports llama_cpp: only here, in the engine process
        from speclocal.policy import auto_drafter

        self.engine = Engine(spec.main_path, spec.draft_path, **options.load_args(spec.settings),
                             check_pair=spec.check_pair, auto_drafter=auto_drafter, store_dir=spec.store_dir)
        if spec.measure_curve:
            from speclocal.policy.profile import cost_curve

            cost_curve(self.engine)

    def facts(self) -> EngineFacts:
        e = self.engine
        names = e.main.path.name + (f" + {e.draft.path.name}" if e.draft else "")
        return EngineFacts(f"{names} · {e.compute} · {e.n_threads} threads · ctx {e.main.n_ctx}", e.main.path,
                           e.draft.path.name if e.draft else None, e.main.n_ctx, e.memory(),
                           e.layout.note if e.layout.news else "")

    def describe(self) -> str:
        return self.facts().describe

    @property
    def has_draft_model(self) -> bool:
        return self.engine.draft is not None

    @property
    def notice(self) -> str:
        return self.facts().layout_note

    def generate(self, request: GenerationRequest, on_step: OnStep | None,
                 cancel: threading.Event) -> GenerationResult:
        return self.engine.generate(request, on_step=on_step, cancel=cancel)

    def prompt_tokens(self, request: GenerationRequest) -> list[int]:
        return self.engine.prompt_tokens(request)

    def reset(self) -> None:
        self.engine.reset()

    def memory(self) -> MemoryParts:
        return self.engine.memory()

    def close(self) -> None:
        self.engine.close()


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
    """In the child: point fds 1 and 2, Python logging and the crash handler's stack at the log file (or at
    nothing)."""
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
    faulthandler.enable()  # fd 2: the log file
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
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops runs (cancel) and the child (close)
    _quiet(log_file)
    try:
        backend = EngineBackend(spec)
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which shows it
        if not isinstance(e, SpeclocalError):
            log.exception("loading models failed")
        conn.send(_error(e))
        return
    try:
        conn.send(("ready", backend.facts()))
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
                elif cmd == "prompt_tokens":
                    conn.send(("done", backend.prompt_tokens(msg[1])))
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
    """The engine in a child process. Construction starts the child and waits until it has loaded the models (or
    raises what loading raised). After a crash the next call starts a new child (`restarts` counts them)."""

    def __init__(self, spec: LoadSpec, log_file: Path | None = None):
        _start_resource_tracker()
        self.spec = spec
        self.log_file = log_file
        self.restarts = 0
        self._lock = threading.Lock()
        self._proc = None
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("spawn")  # a fresh interpreter: no threads or llama.cpp state forked
        self._conn, child_conn = ctx.Pipe()
        self._cancel = ctx.Event()
        self._proc = ctx.Process(target=serve, args=(self.spec, child_conn, self._cancel,
                                                     str(self.log_file) if self.log_file else None),
                                 name="speclocal-engine", daemon=True)
        self._proc.start()
        child_conn.close()
        try:
            _, self.facts = self._wait(None)
        except BaseException:
            self.close()
            raise

    def ensure_running(self) -> None:
        """Start a new child where the last one died (the call before this one said why)."""
        if self._proc is not None and not self._proc.is_alive():
            self.close()
            self.restarts += 1
            log.info("starting a new engine process (restart %d)", self.restarts)
            self._start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    def describe(self) -> str:
        return self.facts.describe

    @property
    def has_draft_model(self) -> bool:
        return self.facts.draft_name is not None

    @property
    def notice(self) -> str:
        return self.facts.layout_note

    def memory(self) -> MemoryParts:
        return self.facts.memory

    def generate(self, request: GenerationRequest, on_step: OnStep | None,
                 cancel: threading.Event) -> GenerationResult:
        with self._lock:
            self.ensure_running()
            self._cancel.clear()
            self._send(("generate", request, on_step is not None))
            while True:
                msg = self._wait(cancel)
                if msg[0] == "step":
                    if on_step is not None:
                        on_step(msg[1])
                    continue
                result: GenerationResult = msg[1]
                self.facts = replace(self.facts, memory=result.memory)
                return result

    def prompt_tokens(self, request: GenerationRequest) -> list[int]:
        with self._lock:
            self.ensure_running()
            self._send(("prompt_tokens", request))
            return self._wait(None)[1]

    def reset(self) -> None:
        with self._lock:
            self.ensure_running()
            self._send(("reset",))
            self._wait(None)

    def close(self) -> None:
        if self._proc is None:
            return
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
        except OSError:
            raise self._ended() from None

    def _ended(self) -> EngineProcessError:
        """What the child's end means, once it has ended."""
        self._proc.join(1.0)
        code = self._proc.exitcode
        if code is not None and code < 0 and -code != signal.SIGKILL:
            return EngineCrashed(crash_line(-code, self.log_file))
        return EngineProcessError(f"the engine process ended unexpectedly (exit code {code}"
                                  + (f"; see {self.log_file})" if self.log_file else ")"))

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
                    raise self._ended()
                continue
            if msg[0] == "error":
                _, kind, text = msg
                raise SpeclocalError(text) if kind is None else RuntimeError(f"{kind}: {text}")
            return msg
