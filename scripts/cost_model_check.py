#!/usr/bin/env python3
"""The bench's cost-model check, again from a run's results.json: each fixed-k run's speedup predicted from its
own acceptance and the profiles measured around it, against the measured one, by category and by context depth
(as the report's "The cost model against the fixed-k runs"). `--shallow-v`: as if the profiles had measured V(n)
only 64 tokens deep (before profile version 5), c still at every depth: what V(n) at depth changes.
`--one-depth`: as if they had measured only 64 and 1,024 deep (before version 6): what the deeper depth changes.

    python scripts/cost_model_check.py docs/bench-suite-xeon/results.json [--shallow-v | --one-depth] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from speclocal.bench.metrics import prediction_check
from speclocal.policy.costmodel import CostCurve


def shallow_v(curve: CostCurve) -> CostCurve:
    """As if V(n) had been measured only at CONTEXT_POS (c still at every depth)."""
    return replace(curve, deep=tuple(replace(d, verify=()) for d in curve.deep))


def one_depth(curve: CostCurve) -> CostCurve:
    """As if only the shallowest of the deeper depths had been measured."""
    return replace(curve, deep=curve.deep[:1])


def altered(profile: dict, how) -> dict:
    """A stored profile with its curve altered, its other keys (the sitting it was measured in) kept."""
    return profile | how(CostCurve.from_dict(profile)).to_dict()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path)
    what_if = ap.add_mutually_exclusive_group()
    what_if.add_argument("--shallow-v", action="store_true")
    what_if.add_argument("--one-depth", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    try:
        data = json.loads(args.results.read_text())
        suite = [r for r in data["runs"] if r.get("phase") == "suite"]
        profile, profiles = data["profile"], data.get("profiles")
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"cost_model_check: error: {args.results} is not a bench results.json ({e})", file=sys.stderr)
        return 2
    how = shallow_v if args.shallow_v else one_depth if args.one_depth else None
    if how is not None:
        profile, profiles = altered(profile, how), [altered(p, how) for p in profiles] if profiles else profiles
    check = prediction_check(suite, list(dict.fromkeys(r["category"] for r in suite)), profile, profiles)
    if check is None:
        print("cost_model_check: error: the run has no profile", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(check, indent=2))
        return 0
    pct = lambda x: "-" if x is None else f"{x:.1%}"  # noqa: E731 - no runs, or a measured speedup of 0
    print(f"median error over categories and methods {pct(check['median_error'])}, run by run "
          f"{pct(check['median_run_error'])} ({check['runs']} runs)")
    for r in check["rows"]:
        print(f"  {r['category']:<16} {r['method']:<11} predicted {r['predicted']:.3f}x  measured {r['measured']:.3f}x  "
              f"error {pct(r['error'])}")
    for b in check["by_context"]:
        lo, hi = b["context"]
        print(f"  context {lo:>5}-{'' if hi >= 1 << 30 else hi - 1:<5} {b['method']:<11} {b['runs']:>3} runs  "
              f"median error {b['median_error']:.1%}, signed {b['median_signed_error']:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
