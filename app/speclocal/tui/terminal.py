"""Keeping the terminal the TUI's alone: nothing else may write to it while the App draws."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path


class QuietStderr:
    """While the TUI runs, nothing may write to the terminal behind its back. C code (llama.cpp,
    ggml) writes to file descriptor 2, so fd 2 is pointed at a log file; Textual draws on
    `sys.__stderr__`, which is re-opened on a duplicate of the terminal's descriptor. Python logging
    handlers that write to a stream are swapped for the same log file. All restored on exit."""

    def __init__(self, path: Path):
        self.path = path
        self._saved_fd: int | None = None
        self._terminal = None
        self._orig = None
        self._removed: list[logging.Handler] = []
        self._handler: logging.Handler | None = None

    def __enter__(self) -> "QuietStderr":
        root = logging.getLogger()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handler = logging.FileHandler(self.path, encoding="utf-8")
        except OSError:
            return self  # no log file: leave everything as it is
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for h in list(root.handlers):
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                root.removeHandler(h)
                self._removed.append(h)
        root.addHandler(self._handler)
        try:
            orig = sys.__stderr__
            orig.flush()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._saved_fd = os.dup(2)
            self._terminal = os.fdopen(os.dup(self._saved_fd), "w", encoding=orig.encoding, errors=orig.errors,
                                       buffering=1 if orig.line_buffering else -1)
            os.dup2(fd, 2)
            os.close(fd)
            self._orig = (sys.__stderr__, sys.stderr)
            sys.__stderr__ = sys.stderr = self._terminal
        except (OSError, AttributeError, ValueError, TypeError):
            pass
        return self

    def __exit__(self, *exc) -> None:
        if self._orig is not None:
            sys.__stderr__, sys.stderr = self._orig
            try:
                self._terminal.close()
            except OSError:
                pass
        if self._saved_fd is not None:
            os.dup2(self._saved_fd, 2)
            os.close(self._saved_fd)
        root = logging.getLogger()
        if self._handler is not None:
            root.removeHandler(self._handler)
            self._handler.close()
        for h in self._removed:
            root.addHandler(h)
