"""`speclocal profile`: measure (or show the cached) cost curve of this machine for a pair."""

from __future__ import annotations

import argparse
import json
import time

from speclocal.errors import SpeclocalError
from speclocal.options import add_options, settings_from_args
from speclocal.policy import open_engine
from speclocal.policy.auto import load_priors
from speclocal.policy.profile import cost_curve, load_file, measure
from speclocal.policy.sweep import KS, RATES, synthetic_sweep
from speclocal.policy.costmodel import (
    K_MAX,
    PLAUSIBLE_ACCEPTANCE,
    best_k,
    break_even_acceptance,
    can_pay,
    memory_bound_curve,
    what_if,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--refresh", action="store_true", help="measure again even if a cached profile exists")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--what-if", metavar="PROFILE",
                   help="also predict speedups per task type on another machine: a saved profile JSON file, "
                        "or 'memory-bound' (a GPU / unified-memory machine, V(n) ~ 1)")
    sw = p.add_argument_group("synthetic acceptance (checks the cost model at acceptances real prompts never give)")
    sw.add_argument("--sweep", action="store_true",
                    help="after profiling afresh, measure speedup with a synthetic drafter over acceptance x k and set "
                         "it against the cost model's prediction (from a profile measured again before each k)")
    sw.add_argument("--sweep-rates", default=",".join(str(r) for r in RATES), metavar="A[,A...]",
                    help=f"acceptance rates (default {','.join(str(r) for r in RATES)})")
    sw.add_argument("--sweep-k", default=",".join(str(k) for k in KS), metavar="K[,K...]",
                    help=f"draft lengths (default {','.join(str(k) for k in KS)})")
    sw.add_argument("--sweep-n", type=int, default=48, metavar="N", help="tokens per run (default 48)")
    sw.add_argument("--sweep-charge", action="store_true",
                    help="each synthetic step also runs the real draft model, paying its decode time")
    add_options(p, "models")


def _floats(text: str, flag: str, lo: float, hi: float) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpeclocalError(f"{flag} takes comma-separated numbers, got {text!r}") from None
    if not values or any(not lo <= v <= hi for v in values):
        raise SpeclocalError(f"{flag} values must be in [{lo:g}, {hi:g}], got {text!r}")
    return values


def _what_if_curve(spec: str):
    return memory_bound_curve() if spec == "memory-bound" else load_file(spec)


def run(args: argparse.Namespace) -> int:
    other = _what_if_curve(args.what_if) if args.what_if else None
    rates = _floats(args.sweep_rates, "--sweep-rates", 0, 1)
    sweep_ks = [int(k) for k in _floats(args.sweep_k, "--sweep-k", 1, K_MAX)]
    if args.sweep_n < 1:
        raise SpeclocalError(f"--sweep-n must be >= 1, got {args.sweep_n}")
    settings = settings_from_args(args)
    engine = open_engine(settings)
    sweep = None
    try:
        t0 = time.perf_counter()
        curve = cost_curve(engine, refresh=args.refresh or args.sweep)  # the sweep's first cells: a fresh curve
        seconds = time.perf_counter() - t0
        if args.sweep:
            if args.sweep_charge and engine.draft is None:
                raise SpeclocalError("--sweep-charge needs a draft model (-md or a pair)")
            sweep = synthetic_sweep(engine, curve, rates, sweep_ks, args.sweep_n, args.sweep_charge,
                                    remeasure=lambda: measure(engine))
    finally:
        engine.close()
    report = _report(curve, seconds, other, args.what_if, sweep)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    _print_curve(curve, seconds, report)
    if other is not None:
        _print_what_if(report["what_if"])
    if sweep is not None:
        _print_sweep(sweep)
    if not report["draft_model_can_pay"]:
        print(f"\nThe draft model cannot pay on this machine even at {PLAUSIBLE_ACCEPTANCE:.0%} acceptance: "
              "auto mode never runs it.")
    return 0


def _report(curve, seconds: float, other, other_name: str | None, sweep: dict | None) -> dict:
    """The curve, what it implies for each draft source, and the what-if and sweep results when asked for."""
    ks = range(1, curve.k_max + 1)
    report = {
        "curve": curve.to_dict(),
        "seconds": round(seconds, 2),
        "break_even": {
            src: {k: break_even_acceptance(k, curve.cost_of(src), curve) for k in ks} for src in ("model", "lookup")
        },
        "draft_model_can_pay": can_pay(curve.cost_of("model"), curve),
        "best_k_at_full_acceptance": {src: best_k(1.0, curve.cost_of(src), curve) for src in ("model", "lookup")},
    }
    if other is not None:
        acceptance = {task: p["model"] for task, p in load_priors().items()}
        report["what_if"] = {
            "profile": other.meta.get("kind") or other.meta.get("machine") or other_name,
            "here": what_if(acceptance, curve),
            "there": what_if(acceptance, other),
        }
    if sweep is not None:
        report["sweep"] = sweep
    return report


def _print_curve(curve, seconds: float, report: dict) -> None:
    print(f"machine: {curve.meta.get('machine')}  on {curve.meta.get('compute', 'CPU')}  "
          f"weight layout {curve.meta.get('layout', 'default')}  "
          f"threads {curve.meta.get('threads')}  ({'cached' if seconds < 1 else f'measured in {seconds:.0f} s'})")
    print(f"single-token decode: {curve.t_single * 1000:.1f} ms;  draft token cost c = {curve.draft_cost:.3f};  "
          f"prompt lookup cost = {curve.lookup_cost:.4f}, suffix {curve.cost_of('suffix').per_step:.4f} per proposal  "
          "(units: one main-model decode)")
    for d in curve.deep:
        deep = ", ".join(f"V({n}) {v:.2f}" for n, v in d.verify)
        print(f"{d.pos} tokens deep: single-token decode {d.t_single * 1000:.1f} ms, {deep}"
              + (f", c = {d.draft_cost:.3f}" if d.draft_cost is not None else ""))
    if curve.draft_cost != float("inf"):
        print(f"the draft model's prompt processing: {curve.draft_prefill_cost:.3f} per token (what bringing it in costs)")
    print("\n  k   V(k+1)   break-even acceptance: draft model   prompt lookup")
    for k in range(1, curve.k_max + 1):
        bm, bl = report["break_even"]["model"][k], report["break_even"]["lookup"][k]
        fmt = lambda x: "never" if x is None else f"{x:.0%}"  # noqa: E731
        print(f"{k:3d}   {curve.V(k + 1):6.2f}   {fmt(bm):>28}   {fmt(bl):>13}")


def _print_what_if(wi: dict) -> None:
    print(f"\nwhat if: predicted draft-model speedup per task type, here vs {wi['profile']}\n"
          f"  (acceptance: priors learnt from your runs and bench results, defaults where none yet)")
    for task, here in wi["here"].items():
        there = wi["there"][task]
        print(f"  {task:9} a={here['acceptance']:.2f}   here k={here['k']:2d} {here['predicted_speedup']:.2f}x"
              f"   there k={there['k']:2d} {there['predicted_speedup']:.2f}x")


def _print_sweep(sweep: dict) -> None:
    what = "the real draft model's decode time charged" if sweep["charge_draft_model"] else "drafting free"
    print(f"\nsynthetic acceptance ({what}, {sweep['n_predict']} tokens a run, plain before and after each; "
          "each k predicted from a profile measured just before its cells):")
    print("    k   set a   measured a   tokens   measured   predicted   error")
    for r in sweep["rows"]:
        a = "-" if r["acceptance_mle"] is None else f"{r['acceptance_mle']:.2f}"
        if r["error"] is None:  # the output parted from plain's at its first token
            print(f"  {r['k']:3d}   {r['rate']:5.2f}   {a:>10}   {r['tokens']:6d}          -           -       -")
            continue
        print(f"  {r['k']:3d}   {r['rate']:5.2f}   {a:>10}   {r['tokens']:6d}   {r['measured']:7.2f}x   "
              f"{r['predicted']:8.2f}x   {r['error']:+6.1%}")
    if sweep["median_abs_error"] is not None:
        print(f"  median |error| {sweep['median_abs_error']:.1%}, largest {sweep['max_abs_error']:.1%}")
    print("  (tokens: those before the run's greedy output parted from plain's at a near tie; both speeds over them)")
