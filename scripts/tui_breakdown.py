"""`python -m speclocal.tui.bench`, with where each run's decode time went.

    python scripts/tui_breakdown.py [-n 128] [--reps 2]   (the same arguments as the TUI bench)

After the bench's table, one line per generation: headless or TUI, mode, decode seconds, the time in
llama.cpp's main-model passes (verify, and per pass), in drafting, in sampling, and the rest of the
decode loop ("other": Python between llama.cpp calls, including waits for the GIL).
"""

from __future__ import annotations

import sys

from speclocal.engine import generate
from speclocal.tui import bench

ROWS: list[tuple] = []
_generate = generate.Engine.generate


def timed_generate(self, req, on_step=None, cancel=None):
    r = _generate(self, req, on_step=on_step, cancel=cancel)
    ROWS.append(("TUI" if on_step is not None else "headless", req.mode, r))
    return r


def main(argv: list[str] | None = None) -> int:
    generate.Engine.generate = timed_generate
    rc = bench.main(argv)
    for where, mode, r in ROWS:
        other = r.t_decode - r.t_verify - r.t_draft - r.t_sample
        print(f"{where:8s} {mode:5s} n={r.n_generated} decode {r.t_decode:.2f} s: verify {r.t_verify:.2f} s "
              f"({r.t_verify / r.n_passes * 1e3:.1f} ms per pass), draft {r.t_draft:.2f}, sample {r.t_sample:.2f}, "
              f"other {other:.2f}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
