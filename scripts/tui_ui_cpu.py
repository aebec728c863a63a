"""CPU time the TUI's own thread spends drawing one run, with a fake engine (no model, no decoding).

    python scripts/tui_ui_cpu.py [-n 128] [--timeline]

The fake backend streams tokens at ~20 steps/s (a 2-core CPU's pace); the number printed is the UI
thread's CPU seconds between pressing run and the history row, next to the wall time. `--timeline` also
prints the CPU seconds of each half second (streaming, and the bursts when a run starts, switches mode and ends).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from textual.widgets import TextArea

from speclocal.options import Settings
from speclocal.tui.app import SpeclocalApp
from speclocal.tui.testing import FakeBackend
from tui_bench import PROMPT


async def measure(n: int, timeline: list[float] | None = None) -> tuple[float, float]:
    backend = FakeBackend(text="def lru(self, key):\n    return self.cache.get(key)\n" * 40, step_delay=0.05,
                          plain_tps=20)
    app = SpeclocalApp(Settings(n_predict=n, draft_max=3, order="plain-first"), backend=backend)
    async with app.run_test(size=(120, 40)) as pilot:
        app.query_one("#prompt", TextArea).insert(PROMPT)
        await pilot.pause(0.5)
        t0, c0 = time.monotonic(), time.thread_time()
        await pilot.press("ctrl+r")
        last = c0
        while not app.history:
            await asyncio.sleep(0.5 if timeline is not None else 0.05)
            if timeline is not None:
                now = time.thread_time()
                timeline.append(now - last)
                last = now
        return time.monotonic() - t0, time.thread_time() - c0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", type=int, default=128)
    p.add_argument("--timeline", action="store_true")
    args = p.parse_args()
    timeline: list[float] | None = [] if args.timeline else None
    wall, cpu = asyncio.run(measure(args.n, timeline))
    print(f"run {wall:.2f} s wall, UI thread {cpu:.2f} s CPU ({cpu / wall:.0%} of one core)")
    if timeline is not None:
        print("UI thread CPU per 0.5 s:", " ".join(f"{c:.3f}" for c in timeline))


if __name__ == "__main__":
    main()
