"""Does drawing slow decoding? The TUI's decode tokens/s against the headless engine's, same prompt.

    python -m speclocal.tui.bench [-n 128] [--reps 3] [--pair tiny | -m MAIN -md DRAFT]

One engine is loaded once and shared. Each repetition runs the prompt headless (engine.generate
without a callback, like `speclocal run --mode compare`) in plain and in spec mode, then through the
TUI (the real App, headless Textual, tokens streamed into the panes and the stats redrawn). The
ratio is the median over repetitions of TUI t/s / headless t/s (a repetition's runs are a minute
apart, so slow drift of a shared machine mostly cancels); the issue asks for >= 0.97.

Every llama.cpp call here runs in a short-lived thread, as in the App, never on the main thread:
llama.cpp's OpenMP (libgomp) keeps one thread pool per calling thread, and once two pools are alive
on a machine with as many cores as decode threads it stops spinning at barriers, which cost about
30 % of decode speed on 2 cores (docs/benchmarks.md). A headless run on the main thread followed by
TUI runs in workers would measure that, not the TUI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time

PROMPT = ("Write a Python class `LRUCache` with `get(key)` and `put(key, value)` methods, O(1) each, "
          "using an OrderedDict. Include a docstring and type hints.")


def in_thread(fn):
    """Run `fn` in a fresh thread (its OpenMP pool goes when the thread ends) and return its result."""
    out: list = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            errors.append(e)

    t = threading.Thread(target=target, name="speclocal-bench")
    t.start()
    t.join()
    if errors:
        raise errors[0]
    return out[0]


def _headless(engine, mode: str, n: int) -> float:
    from speclocal.engine import DraftParams, GenerationRequest, Sampling

    engine.reset()
    req = GenerationRequest(messages=({"role": "user", "content": PROMPT},), mode=mode, n_predict=n,
                            sampling=Sampling(), draft=DraftParams(max=3))
    return engine.generate(req).decode_tps


async def _tui(backend, n: int, size: tuple[int, int]) -> dict[str, float]:
    from textual.widgets import TextArea

    from speclocal.tui.app import SpeclocalApp
    from speclocal.tui.config import Settings

    backend.reset()
    app = SpeclocalApp(Settings(n_predict=n, draft_max=3, order="plain-first"), backend=backend)
    async with app.run_test(size=size) as pilot:
        app.query_one("#prompt", TextArea).insert(PROMPT)
        await pilot.pause(0.5)  # a user presses run after the app has started and the prompt is typed
        await pilot.press("ctrl+r")
        while not app.history:
            if app.current_run is None and app.last_run is not None and app.last_run.failed:
                raise SystemExit("the TUI run failed")
            await pilot.pause(0.05)
        return {m: o.decode_tps for m, o in app.last_run.outcomes.items()}


def main(argv: list[str] | None = None) -> int:
    from speclocal.options import add_model_args

    p = argparse.ArgumentParser(prog="python -m speclocal.tui.bench", description=__doc__.split("\n\n")[0])
    add_model_args(p)
    p.add_argument("-n", "--n-predict", type=int, default=128)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--size", default="120x40", help="terminal size of the headless TUI (default 120x40)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    width, height = (int(x) for x in args.size.lower().split("x"))

    from speclocal.engine import Engine
    from speclocal.models.catalogue import resolve_pair
    from speclocal.tui.backend import EngineBackend

    main_path, draft_path = resolve_pair(args.pair, args.model, args.model_draft, args.dir)
    t0 = time.monotonic()
    engine = in_thread(lambda: Engine(main_path, draft_path, n_ctx=args.ctx_size, n_threads=args.threads,
                                       n_gpu_layers=args.n_gpu_layers))
    print(f"loaded {main_path.name} + {draft_path.name} in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    backend = EngineBackend.wrap(engine)
    headless: dict[str, list[float]] = {"plain": [], "spec": []}
    tui: dict[str, list[float]] = {"plain": [], "spec": []}
    try:
        for rep in range(args.reps):
            for mode in ("plain", "spec"):
                headless[mode].append(in_thread(lambda: _headless(engine, mode, args.n_predict)))
            for mode, tps in asyncio.run(_tui(backend, args.n_predict, (width, height))).items():
                tui[mode].append(tps)
            print(f"rep {rep + 1}: headless plain {headless['plain'][-1]:.2f} spec {headless['spec'][-1]:.2f} | "
                  f"TUI plain {tui['plain'][-1]:.2f} spec {tui['spec'][-1]:.2f} t/s", file=sys.stderr)
    finally:
        in_thread(engine.close)
    rows = []
    for mode in ("plain", "spec"):
        h, t = statistics.median(headless[mode]), statistics.median(tui[mode])
        paired = statistics.median(b / a for a, b in zip(headless[mode], tui[mode]) if a)
        rows.append({"mode": mode, "headless_tps": h, "tui_tps": t, "ratio": paired, "ratio_of_medians": t / h,
                     "headless_runs": headless[mode], "tui_runs": tui[mode]})
    if args.json:
        print(json.dumps({"n_predict": args.n_predict, "reps": args.reps, "threads": engine.n_threads,
                          "terminal": args.size, "rows": rows}, indent=2))
    else:
        print(f"| mode | headless t/s (median of {args.reps}) | TUI t/s (median) | TUI / headless, median of the "
              "per-repetition ratios |")
        print("|---|---:|---:|---:|")
        for r in rows:
            print(f"| {r['mode']} | {r['headless_tps']:.2f} | {r['tui_tps']:.2f} | {r['ratio']:.3f} |")
    return 0 if all(r["ratio"] is not None and r["ratio"] >= 0.97 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
