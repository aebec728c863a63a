"""Does the thread that calls llama.cpp matter? Plain decode t/s with every call on one thread kind.

    python scripts/openmp_pools.py main|fresh|persistent|mixed [-n 128] [--runs 4]

main: every generation on the main thread; fresh: each in a new thread that then ends; persistent:
all in one long-lived worker; mixed: alternating main thread and fresh threads, so two OpenMP pools
are alive at once. One mode per process, since a pool outlives the run that made it; compare the modes'
t/s across runs.
"""

from __future__ import annotations

import argparse
import statistics
import threading

from speclocal.engine import DraftParams, Engine, GenerationRequest, Sampling
from speclocal.models.catalogue import resolve_pair


def in_fresh_thread(fn):
    """Run `fn` in a new thread (its OpenMP pool goes when the thread ends) and return its result."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join()
    if not out:
        raise SystemExit("the call failed in its thread (traceback above)")
    return out[0]

PROMPT = "Write a Python class `LRUCache` with `get` and `put`, O(1) each, using an OrderedDict."


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("main", "fresh", "persistent", "mixed"))
    p.add_argument("-n", type=int, default=128)
    p.add_argument("--runs", type=int, default=4)
    args = p.parse_args()
    main_path, _ = resolve_pair(None, None, None, None)
    engine = Engine(main_path, None, n_ctx=4096) if args.mode == "main" else \
        in_fresh_thread(lambda: Engine(main_path, None, n_ctx=4096))

    def one() -> float:
        engine.reset()
        req = GenerationRequest(messages=({"role": "user", "content": PROMPT},), mode="plain", n_predict=args.n,
                                sampling=Sampling(), draft=DraftParams())
        return engine.generate(req).decode_tps

    if args.mode == "persistent":
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            tps = [pool.submit(one).result() for _ in range(args.runs)]
    elif args.mode == "mixed":
        tps = [one() if i % 2 == 0 else in_fresh_thread(one) for i in range(args.runs)]
    else:
        tps = [one() if args.mode == "main" else in_fresh_thread(one) for _ in range(args.runs)]
    print(f"{args.mode}: " + ", ".join(f"{x:.1f}" for x in tps) + f" t/s (median {statistics.median(tps):.2f})")
    if args.mode == "main":
        engine.close()
    else:
        in_fresh_thread(engine.close)


if __name__ == "__main__":
    main()
