"""Do two `speclocal bench` runs agree? Per category and method, the median speedups side by side.

    python scripts/compare_bench_runs.py RUN_A/results.json RUN_B/results.json [--tolerance 0.10] [--json]

Difference = |b - a| / a on the category medians (the report's speedup column). Exit 0 when every
category and method agrees within the tolerance, 1 when some do not, 2 on bad input.

A side may pool runs of the same code and settings, joined with "+" (`R7/results.json+R8/results.json`):
its medians are then over every pair ratio of those runs, as if they were repetitions of one run (they must
share models, prompts and settings but the number of repetitions). `PATH@N` takes repetition N (from 0) of
a run alone, so a run's repetitions can be compared with each other (`R9/results.json@0 R9/results.json@1`).

Also printed, per run, the noise floor of one measured pair: auto runs that drafted nothing did exactly
plain's work, so their speed ratio to plain is 1 but for the machine's drift between the two runs; and,
for a bracketed run, plain's second run of each turn over its first (the drift across one turn).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

from speclocal.bench.metrics import pair_key, plain_baselines, plain_drift, suite_records


def setup(data: dict) -> str:
    """What must match for runs to be pooled: models, prompts and settings other than the repetitions."""
    settings = {k: v for k, v in data["settings"].items() if k != "reps"}
    models = {role: m["sha256"] for role, m in data["models"].items() if m}
    return json.dumps([models, data["questions"], settings], sort_keys=True)


def side(arg: str) -> list[tuple[Path, int | None]]:
    """One side of the comparison: a results.json, or several joined with "+"; PATH@N is repetition N of it."""
    parts = []
    for part in arg.split("+"):
        m = re.fullmatch(r"(.+)@(\d+)", part)
        parts.append((Path(m[1]), int(m[2])) if m else (Path(part), None))
    return parts


def load(path: Path, rep: int | None) -> dict:
    """A run's results.json with its suite records only, and of repetition `rep` only when given."""
    data = json.loads(path.read_text(encoding="utf-8"))
    data["runs"] = [r for r in suite_records(data["runs"]) if rep is None or r["rep"] == rep]
    if not data["runs"]:
        raise ValueError(f"{path} has no suite runs" + (f" in repetition {rep}" if rep is not None else ""))
    return data


def medians(runs: dict[str, dict]) -> dict[tuple[str, str], float]:
    """Per category and method, the median of the pair ratios (speedups) over all `runs` (label -> data)."""
    (first, first_data), *_ = runs.items()
    ratios: dict[tuple[str, str], list[float]] = {}
    for label, data in runs.items():
        if setup(data) != setup(first_data):
            raise ValueError(f"{label} and {first} differ in models, prompts or settings; they cannot be pooled")
        for r in data["runs"]:
            if r["method"] != "plain" and r.get("speedup") is not None:
                ratios.setdefault((r["category"], r["method"]), []).append(r["speedup"])
    return {key: statistics.median(xs) for key, xs in ratios.items()}


def noise_floor(data: dict) -> dict | None:
    """Auto runs that drafted nothing against plain on the same prompt and turn: their t/s ratios, and
    auto's own cost per step (t_draft per pass, ms); plain against itself when bracketed."""
    drift = plain_drift(data["runs"])
    plain = plain_baselines(data["runs"])
    pairs = [(r, plain[pair_key(r)]) for r in data["runs"]
             if r["mode"] == "auto" and r["n_drafted"] == 0 and pair_key(r) in plain]
    if not pairs:
        return {"plain_drift": drift} if drift else None
    ratios = [a["decode_tps"] / p for a, p in pairs]
    return {"pairs": len(ratios), "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
            "auto_ms_per_step": statistics.median(a["t_draft"] / a["n_passes"] * 1e3 for a, _ in pairs),
            "plain_drift": drift}


def compare(a: dict, b: dict, tolerance: float) -> list[dict]:
    rows = []
    for key in a:
        if key in b and a[key]:
            diff = abs(b[key] - a[key]) / a[key]
            rows.append({"category": key[0], "method": key[1], "a": a[key], "b": b[key], "difference": diff,
                         "agrees": diff <= tolerance})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=side, help="results.json, or several joined with + (pooled)")
    p.add_argument("b", type=side, help="results.json, or several joined with + (pooled)")
    p.add_argument("--tolerance", type=float, default=0.10)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        a, b = ({f"{path}@{rep}" if rep is not None else str(path): load(path, rep) for path, rep in parts}
                for parts in (args.a, args.b))
        rows = compare(medians(a), medians(b), args.tolerance)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"compare_bench_runs: {e}", file=sys.stderr)
        return 2
    if not rows:
        print("compare_bench_runs: the two runs share no category and method", file=sys.stderr)
        return 2
    floors = {label: noise_floor(data) for label, data in (a | b).items()}
    diffs = [r["difference"] for r in rows]
    median_diff, rms_diff = statistics.median(diffs), math.sqrt(statistics.fmean(d * d for d in diffs))
    ok = sum(r["agrees"] for r in rows)
    if args.json:
        print(json.dumps({"tolerance": args.tolerance, "rows": rows, "agree": ok, "total": len(rows),
                          "median_difference": median_diff, "rms_difference": rms_diff, "noise_floor": floors},
                         indent=1))
    else:
        print("| category | method | run A | run B | difference |")
        print("|---|---|---:|---:|---:|")
        for r in rows:
            mark = "" if r["agrees"] else " **"
            print(f"| {r['category']} | {r['method']} | {r['a']:.2f}x | {r['b']:.2f}x | {mark}{r['difference']:.1%}{mark.strip()} |")
        worst = max(rows, key=lambda r: r["difference"])
        print(f"\n{ok} of {len(rows)} agree within {args.tolerance:.0%}; differences: median {median_diff:.1%}, "
              f"root mean square {rms_diff:.1%}, largest {worst['difference']:.1%} ({worst['category']}, "
              f"{worst['method']}).")
        for path, f in floors.items():
            if f and f.get("pairs"):
                print(f"{path}: {f['pairs']} auto runs drafted nothing; their t/s over plain's: median "
                      f"{f['median']:.3f}, {f['min']:.2f}-{f['max']:.2f}; auto's own cost "
                      f"{f['auto_ms_per_step']:.3f} ms per step")
            if f and f.get("plain_drift"):
                d = f["plain_drift"]
                print(f"{path}: plain after the methods over plain before them, {d['n']} turns: median "
                      f"{d['median']:.3f}, {d['min']:.2f}-{d['max']:.2f}")
    return 0 if ok == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
