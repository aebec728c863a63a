#!/usr/bin/env python3
"""What sampling costs per verified row at temperature > 0, on a vocabulary the size of Qwen's.

    python scripts/sampling_cost.py [--vocab 151936] [--reps 200]

Times `distribution` (top-k, top-p, min-p, temperature) and one `accept_or_resample` against a draft
distribution, for the filter mixes people use, and prints milliseconds per row (median). No model is loaded.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from speclocal.engine.sampling import Sampling, accept_or_resample, distribution, sample

MIXES = [(40, 0.95, 0.05), (0, 0.95, 0.05), (0, 0.95, 0.0), (0, 1.0, 0.05)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    gen = np.random.default_rng(0)
    rows = gen.normal(0, 3, size=(8, args.vocab)).astype(np.float32)
    rng = np.random.default_rng(1)
    print("| top-k | top-p | min-p | distribution, ms/row | + accept/resample, ms/row | kept ids |")
    print("|---:|---:|---:|---:|---:|---:|")
    for top_k, top_p, min_p in MIXES:
        s = Sampling(temp=0.8, top_k=top_k, top_p=top_p, min_p=min_p, seed=0)
        t_dist, t_both, kept = [], [], 0
        for i in range(args.reps):
            row, other = rows[i % 8], rows[(i + 1) % 8]
            t0 = time.perf_counter()
            p = distribution(row, s)
            t1 = time.perf_counter()
            q = distribution(other, s)
            t2 = time.perf_counter()
            accept_or_resample(p, q, sample(q, rng), rng)
            t3 = time.perf_counter()
            t_dist.append(t1 - t0)
            t_both.append((t1 - t0) + (t3 - t2))
            kept = len(p.ids)
        print(f"| {top_k} | {top_p} | {min_p} | {statistics.median(t_dist) * 1e3:.2f} | "
              f"{statistics.median(t_both) * 1e3:.2f} | {kept} |")


if __name__ == "__main__":
    main()
