"""Ctrl-C and SIGTERM during generation: stop within one step and keep what was produced."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager


@contextmanager
def cancel_on_signals(cancel: threading.Event):
    """While active, SIGINT/SIGTERM set `cancel` instead of raising mid-decode; a second one raises."""
    if threading.current_thread() is not threading.main_thread():
        yield cancel
        return

    def handler(signum, frame):
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield cancel
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
