#!/usr/bin/env python3
"""Greedy verification with the argmax taken by llama.cpp (a greedy sampler attached to the context with
`llama_set_sampler`, the "backend sampling" of the pinned llama.cpp) against the logits copied out and argmaxed in
numpy, as speclocal's loop does: the time of a main-model pass over n tokens plus its argmaxes, both ways
alternating, medians. The tokens must agree.

    python scripts/device_greedy.py [--reps 8] [-m MODEL] [-t THREADS]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import llama_cpp as ll
import numpy as np

from speclocal.engine.llama import LoadedModel
from speclocal.models.catalogue import resolve_model


def greedy_sampler():
    chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
    return chain


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-q4km")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=8)
    args = ap.parse_args()

    default = ll.llama_context_default_params

    def params():  # one sampled output per sequence is llama.cpp's default: a verify pass needs up to n_batch
        p = default()
        p.n_outputs_max_per_seq = 0
        return p

    ll.llama_context_default_params = params
    try:
        m = LoadedModel(resolve_model(args.model), 1024, args.threads)
    finally:
        ll.llama_context_default_params = default
    m.eval(m.tokenize("def f(x):\n    return x * 2\n" * 20)[:-1], outputs="none")
    base = len(m.tokens)
    probe = m.tokenize(" x = 1\n" * 20, add_special=False)[:17]

    def host(n: int) -> np.ndarray:
        out = m.eval(probe[:n], outputs="all").argmax(axis=1)
        m.truncate(base)
        return out

    def device(n: int) -> np.ndarray:
        m.eval(probe[:n], outputs="all")  # with the sampler attached, llama.cpp copies no logits
        out = np.array([ll.llama_get_sampled_token_ith(m._ctx, i) for i in range(n)])
        m.truncate(base)
        return out

    def timed(fn, n: int, sampler: bool) -> tuple[float, np.ndarray]:
        chain = greedy_sampler() if sampler else None  # a chain can be attached once: a new one each time
        if chain is not None:
            ll.llama_set_sampler(m._ctx, 0, chain)
        fn(n)  # the first pass after attaching or detaching re-reserves the graph: not timed
        t0 = time.perf_counter()
        out = fn(n)
        t = time.perf_counter() - t0
        if chain is not None:
            ll.llama_set_sampler(m._ctx, 0, None)
            ll.llama_sampler_free(chain)
        return t, out

    print(f"{m.path.name}, {args.threads} threads, layout {m.layout}, medians of {args.reps}")
    for n in (1, 4, 17):
        th, td = [], []
        for _ in range(args.reps):
            t, a = timed(host, n, False)
            th.append(t)
            t, b = timed(device, n, True)
            td.append(t)
            if not (a == b).all():
                print(f"error: the two argmaxes differ at n={n}: {a} against {b}", file=sys.stderr)
                return 1
        h, d = statistics.median(th), statistics.median(td)
        print(f"pass over {n:2d} tokens: numpy argmax {1e3 * h:7.2f} ms, llama.cpp's greedy sampler {1e3 * d:7.2f} ms, "
              f"ratio {d / h:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
