"""The engine worker: one long-lived thread that makes every engine call (load, prompt checks, generation,
close), fed from a bounded set of waiting jobs, one generation at a time.

The engine itself runs in a process of its own (`speclocal.engine_process.ProcessBackend`), so a native crash in
llama.cpp costs the request in flight, not the server: that request is answered with a 500 naming the crash, the
worker starts a new engine process (`/health` says "restarting" meanwhile) and serves the next request. One
thread because the engine answers one call at a time. The web side never touches the engine: it submits a `Job`
and reads the job's events from an asyncio queue, filled from this thread with `loop.call_soon_threadsafe`. A
job's `cancel` Event is checked by the engine before every step.

Events, in order: ("started", n_prompt) or ("rejected", SpeclocalError) or ("cancelled", None) or
("crashed", message) or ("error", message) (tokenizing failed); then ("step", StepEvent) per main-model pass;
then ("done", GenerationResult) or ("error", message) or ("crashed", message).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from speclocal.engine_process import EngineCrashed
from speclocal.errors import SpeclocalError
from speclocal.serve.protocol import Parsed, drafters_used
from speclocal.serve.status import StatusLog

log = logging.getLogger("speclocal.serve")


class Busy(Exception):
    """The wait queue is full."""


@dataclass(eq=False)
class Job:
    parsed: Parsed
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)
    t_submit: float = field(default_factory=time.perf_counter)

    def emit(self, kind: str, payload: Any = None) -> None:
        """Called from the worker thread: hand an event to the asyncio side."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is gone (shutdown): nobody is listening any more
            self.cancel.set()


class EngineWorker:
    """Owns the engine. `open_engine` runs on the worker thread; `queue_size` jobs may wait while one runs."""

    def __init__(self, open_engine: Callable[[], Any], queue_size: int, status: StatusLog):
        self._open = open_engine
        self.queue_size = queue_size
        self.status = status
        self._jobs: queue.Queue = queue.Queue()
        self._pending: set[Job] = set()  # submitted and not finished, the running one included
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self.engine: Any = None
        self.running: Job | None = None
        self.served = 0
        self.restarting = False  # a new engine process is loading after a crash
        self.crashes = 0
        self._thread = threading.Thread(target=self._main, name="speclocal-engine", daemon=True)

    # ---- the web side ------------------------------------------------------------------------------
    def start(self) -> None:
        """Load the engine on the worker thread; re-raise its error here."""
        self._thread.start()
        while not self._ready.wait(0.2):  # a timed wait lets Ctrl-C through while the models load
            pass
        if self._load_error is not None:
            raise self._load_error

    def submit(self, job: Job) -> None:
        with self._lock:
            if len(self._pending) > self.queue_size:  # one running + queue_size waiting
                raise Busy
            self._pending.add(job)
        self._jobs.put(job)

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._pending) - (self.running is not None)

    @property
    def busy(self) -> bool:
        return self.running is not None

    def retry_after(self) -> int:
        """Seconds a refused client should wait: the recent mean generation time times the jobs ahead."""
        with self._lock:
            ahead = len(self._pending)
        return max(1, min(120, round(self.status.mean_wall() * ahead)))

    def cancel_all(self) -> None:
        """Shutdown: every waiting and running generation stops within one step. Safe in a signal handler."""
        for job in list(self._pending):
            job.cancel.set()

    def stop(self, timeout: float = 30.0) -> None:
        self.cancel_all()
        self._jobs.put(None)
        self._thread.join(timeout)

    # ---- the worker thread -------------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self.engine = self._open()
        except BaseException as e:  # noqa: BLE001 - handed to start(), which raises it on the main thread
            self._load_error = e
            self._ready.set()
            if self.engine is not None:
                self.engine.close()
            return
        self._ready.set()
        try:
            while (job := self._jobs.get()) is not None:
                self.running = job
                try:
                    self._run(job)
                finally:
                    with self._lock:
                        self._pending.discard(job)
                        self.running = None
        finally:
            self.engine.close()

    def _run(self, job: Job) -> None:
        t_start = time.perf_counter()
        if job.cancel.is_set():  # its client left while it waited
            job.emit("cancelled")
            return
        req = job.parsed.req
        try:
            n_prompt = len(self.engine.prompt_tokens(req))
        except EngineCrashed as e:
            self._crashed(job, e)
            return
        except SpeclocalError as e:
            self.status.rejected_prompt()
            job.emit("rejected", e)
            return
        except Exception as e:  # noqa: BLE001 - one failed request must not stop the server
            self._failed(job, e)
            return
        job.emit("started", n_prompt)
        try:
            result = self.engine.generate(req, on_step=lambda ev: job.emit("step", ev), cancel=job.cancel)
        except EngineCrashed as e:
            self._crashed(job, e)
            return
        except Exception as e:  # noqa: BLE001 - one failed request must not stop the server
            self._failed(job, e)
            return
        self.served += 1
        task = result.auto.get("task", job.parsed.task) if result.auto else job.parsed.task
        self.status.finished(job.parsed.kind, task, result, drafters_used(result),
                             time.perf_counter() - t_start, t_start - job.t_submit)  # logged before it is answered
        job.emit("done", result)

    def _failed(self, job: Job, e: Exception) -> None:
        """A request failed without the engine dying: answer it with the error and go on to the next."""
        log.debug("request failed", exc_info=True)
        message = str(e) if isinstance(e, SpeclocalError) else f"{type(e).__name__}: {e}"
        self.status.failure(message)
        job.emit("error", message)
        self._recover()

    def _crashed(self, job: Job, e: EngineCrashed) -> None:
        """The engine process died mid-request: answer it, then start a new one before the next request."""
        self.crashes += 1
        self.status.failure(str(e))
        job.emit("crashed", str(e))
        self.restarting = True
        t0 = time.perf_counter()
        try:
            self.engine.ensure_running()
            self.status.note(f"engine restarted after a crash, in {time.perf_counter() - t0:.1f} s")
        except Exception as e2:  # noqa: BLE001 - the next request tries again
            self.status.note(f"the engine could not be started again ({e2}); the next request tries again")
        finally:
            self.restarting = False

    def _recover(self) -> None:
        """After a failed generation, clear the KV caches: the next request starts from a known state."""
        try:
            self.engine.reset()
        except Exception:  # noqa: BLE001
            log.debug("reset after a failure failed", exc_info=True)
