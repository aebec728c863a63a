#!/usr/bin/env python3
"""Sampling on the device against sampling on the host, per verify pass: the time of one main-model pass over n
tokens plus the sampling of every row, either with each row's logits copied out and sampled in numpy (speclocal's
host path) or with llama.cpp's backend top-k handing back each row's 40 best candidates (`-bs`), greedy and at
temperature 0.8; both ways alternating, medians. The greedy tokens must agree.

    python scripts/device_sampling.py [--reps 8] [-m MODEL] [-t THREADS] [-ngl N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from speclocal.engine.llama import LoadedModel
from speclocal.engine.sampling import Sampling, device_top_k, distribution
from speclocal.models.catalogue import resolve_model
from speclocal.models.devices import resolve_gpu_layers


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-q4km")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-ngl", "--n-gpu-layers", default="0")
    ap.add_argument("--reps", type=int, default=8)
    args = ap.parse_args()

    m = LoadedModel(resolve_model(args.model), 1024, args.threads, resolve_gpu_layers(args.n_gpu_layers),
                    backend_sampling=True)
    m.eval(m.tokenize("def f(x):\n    return x * 2\n" * 20)[:-1], outputs="none")
    base = len(m.tokens)
    probe = m.tokenize(" x = 1\n" * 20, add_special=False)[:17]

    def one_pass(n: int, s: Sampling) -> list[int]:
        rows = m.eval(probe[:n], outputs="all")
        out = [int(distribution(rows[i], s).ids[0]) if s.greedy else len(distribution(rows[i], s).ids)
               for i in range(n)]
        m.truncate(base)
        return out

    def timed(n: int, s: Sampling, on_device: bool) -> tuple[float, list[int]]:
        m.sample_on_device(device_top_k(s) if on_device else None)
        one_pass(n, s)  # the first pass after a change re-reserves llama.cpp's graph: not timed
        t0 = time.perf_counter()
        out = one_pass(n, s)
        return time.perf_counter() - t0, out

    print(f"{m.path.name}, {args.threads} threads, -ngl {args.n_gpu_layers}, layout {m.layout}, medians of {args.reps}")
    for s in (Sampling(), Sampling(temp=0.8, seed=1)):
        for n in (1, 4, 17):
            th, td = [], []
            for _ in range(args.reps):
                t, a = timed(n, s, False)
                th.append(t)
                t, b = timed(n, s, True)
                td.append(t)
                if s.greedy and a != b:
                    print(f"error: the greedy tokens differ at n={n}: {a} against {b}", file=sys.stderr)
                    return 1
            h, d = statistics.median(th), statistics.median(td)
            print(f"temp {s.temp:.1f}, pass over {n:2d} tokens: host {1e3 * h:7.2f} ms, device top-k "
                  f"{1e3 * d:7.2f} ms, ratio {d / h:.3f}, {1e3 * (h - d) / n:+.3f} ms saved per row")
    m.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
