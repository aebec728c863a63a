"""`speclocal profile`: measure (or show the cached) cost curve of this machine for a pair."""

from __future__ import annotations

import argparse
import json
import time

from speclocal.options import add_model_args, engine_from_args
from speclocal.policy.costmodel import PLAUSIBLE_ACCEPTANCE, best_k, break_even_acceptance, can_pay


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--refresh", action="store_true", help="measure again even if a cached profile exists")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_model_args(p)


def run(args: argparse.Namespace) -> int:
    engine = engine_from_args(args)
    try:
        t0 = time.perf_counter()
        curve = engine.cost_curve(refresh=args.refresh)
        seconds = time.perf_counter() - t0
    finally:
        engine.close()
    ks = range(1, curve.k_max + 1)
    report = {
        "curve": curve.to_dict(),
        "seconds": round(seconds, 2),
        "break_even": {
            "model": {k: break_even_acceptance(k, curve.draft_cost, curve) for k in ks},
            "lookup": {k: break_even_acceptance(k, curve.lookup_cost, curve) for k in ks},
        },
        "draft_model_can_pay": can_pay(curve.draft_cost, curve),
        "best_k_at_full_acceptance": {"model": best_k(1.0, curve.draft_cost, curve), "lookup": best_k(1.0, curve.lookup_cost, curve)},
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"machine: {curve.meta.get('machine')}  threads {curve.meta.get('threads')}  "
          f"({'cached' if seconds < 1 else f'measured in {seconds:.0f} s'})")
    print(f"single-token decode: {curve.t_single * 1000:.1f} ms;  draft token cost c = {curve.draft_cost:.3f};  "
          f"prompt lookup cost = {curve.lookup_cost:.4f}  (units: one main-model decode)")
    print("\n  k   V(k+1)   break-even acceptance: draft model   prompt lookup")
    for k in ks:
        bm, bl = report["break_even"]["model"][k], report["break_even"]["lookup"][k]
        fmt = lambda x: "never" if x is None else f"{x:.0%}"  # noqa: E731
        print(f"{k:3d}   {curve.V(k + 1):6.2f}   {fmt(bm):>28}   {fmt(bl):>13}")
    if not report["draft_model_can_pay"]:
        print(f"\nThe draft model cannot pay on this machine even at {PLAUSIBLE_ACCEPTANCE:.0%} acceptance: "
              "auto mode never runs it.")
    return 0
