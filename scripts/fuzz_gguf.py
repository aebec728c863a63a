#!/usr/bin/env python3
"""Fuzz speclocal's GGUF header reader with mutated headers derived from the real model files.

Every case must end as "ok" or as one clean SpeclocalError line, within a time and memory bound.
Usage: scripts/fuzz_gguf.py [--cases 100000] [--seed 0]   (records a summary; see docs/hardening.md)
"""

from __future__ import annotations

import argparse
import collections
import random
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "app"), str(ROOT / "tests")]

from gguf_fuzz import EXTREMES, OPS, check_one, mini_seed, mutate  # noqa: E402
from speclocal.locations import models_dir
from speclocal.models.catalogue import load_catalogue  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cat = load_catalogue()
    reals = [models_dir() / cat.model(m).file for m in ("qwen2.5-coder-0.5b-q4km", "smollm2-135m")]
    seeds = [(mini_seed(p), p.stat().st_size) for p in reals]
    outcomes: collections.Counter = collections.Counter()
    slowest = 0.0
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.gguf"
        for i in range(args.cases):
            seed, size = seeds[i % len(seeds)]
            ops = [(rng.choice(OPS), rng.randrange(2**31), rng.choice(EXTREMES), rng.randrange(256))
                   for _ in range(rng.randint(1, 6))]
            t0 = time.perf_counter()
            msg = check_one(path, mutate(seed, ops), size)
            slowest = max(slowest, time.perf_counter() - t0)
            outcomes[re.sub(r"[\d,]+", "N", msg.split(":")[0])[:70]] += 1
            if (i + 1) % 10_000 == 0:
                print(f"{i + 1:,} cases, {time.perf_counter() - t_start:.0f} s", file=sys.stderr)
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(f"{args.cases:,} mutated headers from {', '.join(p.name for p in reals)} (random seed {args.seed})")
    print(f"time {time.perf_counter() - t_start:.0f} s, slowest case {slowest * 1000:.0f} ms, peak RSS growth {grown:.0f} MiB")
    print("outcomes (all clean; the first words of each error line, digits as N):")
    for what, n in outcomes.most_common():
        print(f"  {n:7,}  {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
