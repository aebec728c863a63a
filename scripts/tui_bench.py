"""Does drawing slow decoding? The TUI's decode tokens/s against the headless engine's, same prompt.

    python scripts/tui_bench.py [-n 128] [--reps 3] [--control] [--pair tiny | -m MAIN -md DRAFT]

The engine is loaded once, in its own process, as the App loads it (`ProcessBackend`). A headless
run is the prompt in plain and in spec mode with no step callback, exactly what `speclocal run`
does; a TUI run is the same through the real App (headless Textual, tokens streamed into the panes,
stats redrawn). Each repetition is headless, TUI, TUI, headless (the next one TUI, headless, headless,
TUI), so a steady speed drift of a shared machine cancels, and so does any effect of a run's position
in the repetition; it gives TUI t/s / headless t/s (sums over its two runs each); printed are the median
over repetitions and the pooled ratio (exit 0 when both modes reach 0.97). `--control` runs headless in the
TUI's places: how far from 1.0 that lands is the noise of the method on this machine.
Also printed: how often the UI drew token batches and stats while decoding, and the CPU the UI process
(Textual and the thread receiving the steps) used meanwhile, as a share of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from pathlib import Path

N_PREDICT = 128
SPEC_K = 3  # the draft length this benchmark's spec runs use, whatever the default
PROMPT = ("Write a Python class `LRUCache` with `get(key)` and `put(key, value)` methods, O(1) each, "
          "using an OrderedDict. Include a docstring and type hints.")


def _headless(backend, mode: str, n: int) -> float:
    from speclocal.engine.types import GenerationRequest
    from speclocal.options import Settings

    backend.reset()
    req = GenerationRequest.from_settings(Settings(n_predict=n, draft_max=SPEC_K), mode, PROMPT)
    return backend.generate(req, None, threading.Event()).decode_tps


def _max_gap(times: list[float]) -> float:
    return max((b - a for a, b in zip(times, times[1:])), default=0.0)


async def _tui(backend, n: int, size: tuple[int, int], ui: list[dict], batch_interval: float | None) -> dict[str, float]:
    """One TUI run (plain, then spec); appends to `ui` when, in each mode, token batches and stats were drawn."""
    from textual.widgets import TextArea

    from speclocal.options import Settings
    from speclocal.tui.app import OutputPane, SpeclocalApp

    backend.reset()
    app = SpeclocalApp(Settings(n_predict=n, draft_max=SPEC_K, order="plain-first"), backend=backend)
    if batch_interval is not None:
        app.batch_interval = batch_interval
    batches: dict[str, list[float]] = {"plain": [], "spec": []}
    cpu: dict[str, list[float]] = {"plain": [], "spec": []}  # the UI process's CPU seconds at each batch
    stats: list[float] = []
    async with app.run_test(size=size) as pilot:
        for mode in ("plain", "spec"):
            pane = app.query_one("#pane-plain" if mode == "plain" else "#pane-spec", OutputPane)
            pane.append = lambda *a, _a=pane.append, _t=batches[mode], _c=cpu[mode]: (
                _t.append(time.monotonic()), _c.append(time.process_time()), _a(*a))[2]
        refresh = app._refresh_stats
        app._refresh_stats = lambda: (stats.append(time.monotonic()), refresh())[1]
        app.query_one("#prompt", TextArea).insert(PROMPT)
        await pilot.pause(0.5)  # a user presses run after the app has started and the prompt is typed
        await pilot.press("ctrl+r")
        # a plain sleep, not pilot.pause: pilot.pause makes every widget process a message on each call,
        # UI work that a user's terminal never asks for
        while not app.history:
            if not app.is_running or (app.current_run is None and app.last_run is not None and app.last_run.failed):
                raise SystemExit("the TUI run failed (see the log)")
            await asyncio.sleep(0.25)
    for mode, times in batches.items():
        if len(times) > 1 and times[-1] - times[0] >= 1.0:  # while this mode streamed: batches and stats redraws
            drawn = [t for t in stats if times[0] <= t <= times[-1]]
            ui.append({"mode": mode, "batch_gap_max": _max_gap(times), "stats_gap_max": _max_gap(drawn),
                       "stats_per_s": (len(drawn) - 1) / (drawn[-1] - drawn[0]) if len(drawn) > 1 else 0.0,
                       "ui_cpu_share": (cpu[mode][-1] - cpu[mode][0]) / (times[-1] - times[0])})
    return {m: o.decode_tps for m, o in app.last_run.results.items()}


def _parse(argv: list[str] | None) -> tuple[argparse.Namespace, tuple[int, int]]:
    """The command line, checked before any model loads, and the terminal size it names."""
    from speclocal.options import add_options

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_options(p, "models")
    add_options(p, "generation", ("n_predict",), n_predict=N_PREDICT)
    p.set_defaults(n_predict=N_PREDICT)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--size", default="120x40", help="terminal size of the headless TUI (default 120x40)")
    p.add_argument("--log", help="file for the engine process's llama.cpp log (default: discarded)")
    p.add_argument("--batch-interval", type=float, default=None,
                   help="seconds between the token batches a run posts to the UI (default: the App's)")
    p.add_argument("--control", action="store_true",
                   help="run headless where the TUI would run: the ratio then shows the noise of the method")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.reps < 1 or args.n_predict < 1:
        p.error("--reps and -n/--n-predict must be at least 1")
    try:
        width, height = (int(x) for x in args.size.lower().split("x"))
    except ValueError:
        p.error(f"--size must be COLUMNSxROWS, e.g. 120x40, not {args.size!r}")
    return args, (width, height)


def _load(args: argparse.Namespace):
    """The engine in its own process, as the App loads it."""
    from speclocal.engine_process import LoadSpec, ProcessBackend
    from speclocal.models.catalogue import resolve_pair
    from speclocal.options import settings_from_args

    s = settings_from_args(args)
    main_path, draft_path = resolve_pair(s.pair or None, s.main or None, s.draft or None, s.models_dir or None)
    t0 = time.monotonic()
    backend = ProcessBackend(LoadSpec(main_path, draft_path, s),
                             log_file=Path(args.log) if args.log else None)
    print(f"loaded {backend.describe()} in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return backend


def _repetitions(backend, args: argparse.Namespace, size: tuple[int, int], label: str):
    """Runs the repetitions; returns headless and TUI t/s per mode, each repetition's ratio, and UI records."""
    headless: dict[str, list[float]] = {"plain": [], "spec": []}
    tui: dict[str, list[float]] = {"plain": [], "spec": []}
    ratios: dict[str, list[float]] = {"plain": [], "spec": []}
    ui: list[dict] = []

    def run_headless() -> dict[str, float]:
        return {mode: _headless(backend, mode, args.n_predict) for mode in ("plain", "spec")}

    def run_tui() -> dict[str, float]:
        if args.control:
            return run_headless()
        return asyncio.run(_tui(backend, args.n_predict, size, ui, args.batch_interval))

    for rep in range(args.reps):
        # headless, TUI, TUI, headless, then the other way round in the next repetition: a steady speed
        # drift cancels within a repetition, an effect of the position in it over two
        if rep % 2 == 0:
            h1, t1, t2, h2 = run_headless(), run_tui(), run_tui(), run_headless()
        else:
            t1, h1, h2, t2 = run_tui(), run_headless(), run_headless(), run_tui()
        for mode in ("plain", "spec"):
            headless[mode] += [h1[mode], h2[mode]]
            tui[mode] += [t1[mode], t2[mode]]
            ratios[mode].append((t1[mode] + t2[mode]) / (h1[mode] + h2[mode]))
        print(f"rep {rep + 1}: " + " | ".join(
            f"{mode}: headless {h1[mode]:.2f} {h2[mode]:.2f}, {label} {t1[mode]:.2f} {t2[mode]:.2f} t/s, "
            f"ratio {ratios[mode][-1]:.3f}" for mode in ("plain", "spec")), file=sys.stderr)
    return headless, tui, ratios, ui


def _summaries(headless, tui, ratios, ui) -> tuple[list[dict], dict]:
    """One row per mode (medians, pooled ratio, each run) and what the UI drew while decoding."""
    rows = [{"mode": mode, "headless_tps": statistics.median(headless[mode]),
             "tui_tps": statistics.median(tui[mode]), "ratio": statistics.median(ratios[mode]),
             "ratio_pooled": sum(tui[mode]) / sum(headless[mode]), "rep_ratios": ratios[mode],
             "headless_runs": headless[mode], "tui_runs": tui[mode]} for mode in ("plain", "spec")]
    drawn = {"batch_gap_max": max((u["batch_gap_max"] for u in ui), default=None),
             "stats_gap_max": max((u["stats_gap_max"] for u in ui), default=None),
             "stats_per_s_min": min((u["stats_per_s"] for u in ui), default=None),
             "ui_cpu_share": {m: statistics.median(shares) for m in ("plain", "spec")
                              if (shares := [u["ui_cpu_share"] for u in ui if u["mode"] == m])}}
    return rows, drawn


def _print_table(rows: list[dict], drawn: dict, reps: int, label: str) -> None:
    print(f"| mode | headless t/s (median of {2 * reps}) | {label} t/s (median) | {label} / headless, "
          f"median of {reps} repetitions | pooled | repetitions |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['headless_tps']:.2f} | {r['tui_tps']:.2f} | {r['ratio']:.3f} | "
              f"{r['ratio_pooled']:.3f} | {' '.join(f'{x:.2f}' for x in r['rep_ratios'])} |")
    if drawn["batch_gap_max"] is not None:
        print(f"\nwhile decoding: token batches drawn at most {drawn['batch_gap_max']:.2f} s "
              f"apart, stats at most {drawn['stats_gap_max']:.2f} s apart, at least "
              f"{drawn['stats_per_s_min']:.1f} stats redraws per second; the UI process used "
              + ", ".join(f"{share:.1%} of a core while {m} decoded" for m, share in drawn["ui_cpu_share"].items())
              + " (median over TUI runs)")


def main(argv: list[str] | None = None) -> int:
    args, size = _parse(argv)
    label = "control (headless again)" if args.control else "TUI"
    backend = _load(args)
    try:
        rows, drawn = _summaries(*_repetitions(backend, args, size, label))
    finally:
        backend.close()
    if args.json:
        print(json.dumps({"n_predict": args.n_predict, "reps": args.reps, "models": backend.describe(),
                          "terminal": args.size, "control": args.control, "rows": rows,
                          "ui": drawn}, indent=2))
    else:
        _print_table(rows, drawn, args.reps, label)
    return 0 if all(r["ratio"] is not None and r["ratio"] >= 0.97 for r in rows) else 1


def cli(argv: list[str] | None = None) -> int:
    """`main` with bad input (a missing or malformed model, ...) as one line, not a traceback."""
    from speclocal.errors import SpeclocalError

    try:
        return main(argv)
    except SpeclocalError as e:
        print(f"tui_bench.py: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(cli())
