"""What the stats pane's RAM lines read: speclocal's own RSS (this process and the engine process) and the
memory the system has available (psutil)."""

from __future__ import annotations

import psutil


class SystemProbe:
    """Called: (RSS of this process plus the engine process once `track`ed, system available memory)."""

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self._engine = None

    def track(self, pid: int | None) -> None:
        """Count the engine process `pid` (None: no separate engine process) from now on."""
        try:
            self._engine = psutil.Process(pid) if pid else None
        except psutil.Error:
            self._engine = None

    def __call__(self) -> tuple[int, int]:
        rss = self._proc.memory_info().rss
        if self._engine is not None:
            try:
                rss += self._engine.memory_info().rss
            except psutil.Error:  # it has ended; the App reports that on its next call
                self._engine = None
        return rss, psutil.virtual_memory().available
