"""Waiting for something another process or thread does, with a deadline (tests only)."""

from __future__ import annotations

import time


def wait_for(predicate, timeout: float = 60.0, poll: float = 0.05) -> bool:
    """Poll `predicate` until it is true (True) or `timeout` seconds pass (False)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(poll)
    return False
