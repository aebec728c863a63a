"""Per-step cost of the suffix drafter against the size of its store (and of the live history).

    python scripts/suffix_cost.py [--sizes 1,10,50] [--steps 400] [--history 4000]

For each store size (MB of int32 tokens: 1 MB = 262,144 tokens) it builds a synthetic store (a
Zipf-distributed vocabulary of 151,936 ids, generations of 300-1500 tokens that re-use chunks of
earlier ones, as an editing session re-emits code), times building its suffix array, writing it and
loading it back, then replays a generation against it: a history that copies from the store with
edits, one `draft()` per step with k = 16 (auto's cap), appending 1-4 tokens per step as a decode loop
does. Prints ms per draft() call (wall: mean, median, p99, max; and the thread's CPU time, which
leaves out waiting for a core), the share that finds a store match, the machine's own noise (a fixed
workload as long as the median call, timed as often) and the CPU. No model is loaded.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from speclocal.engine.drafting.base import DraftParams
from speclocal.engine.drafting.suffix import SuffixDrafter
from speclocal.engine.store import file_format
from speclocal.engine.store.store import SuffixStore
from speclocal.models.cpu import cpu_name, cpu_signature

VOCAB = 151_936


def zipf_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.minimum(rng.zipf(1.2, n), VOCAB - 1).astype(np.int64)


def synthetic_generations(rng: np.random.Generator, n_tokens: int) -> list[np.ndarray]:
    """Generations where ~60 % of the text copies chunks of 20-200 tokens of earlier ones."""
    gens: list[np.ndarray] = []
    pool = zipf_tokens(rng, 4096)
    total = 0
    while total < n_tokens:
        length = int(rng.integers(300, 1500))
        parts, got = [], 0
        while got < length:
            if gens and rng.random() < 0.6:
                src = gens[int(rng.integers(max(0, len(gens) - 200), len(gens)))]
                a = int(rng.integers(0, max(1, len(src) - 20)))
                chunk = src[a : a + int(rng.integers(20, 200))]
            else:
                chunk = zipf_tokens(rng, int(rng.integers(5, 60)))
            parts.append(chunk)
            got += len(chunk)
        g = np.concatenate(parts)[:length]
        gens.append(g)
        total += len(g)
    del pool
    return gens


def replay(drafter: SuffixDrafter, prompt: list[int], target: np.ndarray, steps: int, rng):
    """Decode-loop shaped replay: draft, then append 1-4 tokens of `target` (what the model 'says').
    Returns the times, the calls answered from the store, and the drafted tokens that were right."""
    history = list(prompt)
    drafter.prepare(history)
    times, store_hits, right, pos = [], 0, 0, 0
    cpu = replay.cpu = []
    for _ in range(steps):
        c0, t0 = time.thread_time(), time.perf_counter()
        proposal = drafter.draft(history, 16, None, None)
        toks = proposal.tokens
        times.append((time.perf_counter() - t0) * 1000)
        cpu.append((time.thread_time() - c0) * 1000)
        store_hits += proposal.source == "store"
        for a, b in zip(toks, target[pos:]):
            if a != b:
                break
            right += 1
        n = int(rng.integers(1, 5))
        history.extend(int(x) for x in target[pos : pos + n])
        pos += n
        if pos >= len(target):
            pos = 0
    return times, store_hits, right


def control(times: list[float]) -> str:
    """The same number of calls of a fixed pure-Python workload as long as the median call: its tail
    is the machine's (preemption by other processes, interrupts), not the drafter's."""
    def work(n):
        s = 0
        for i in range(n):
            s += i * i
        return s

    t0 = time.perf_counter()
    work(100_000)
    per = (time.perf_counter() - t0) / 100_000
    n = max(1, int(statistics.median(times) / 1000 / per))
    out = []
    for _ in range(len(times)):
        t0 = time.perf_counter()
        work(n)
        out.append((time.perf_counter() - t0) * 1000)
    return "control (fixed work): " + summary(out)


def cpu_summary() -> str:
    """The same calls' CPU time (this thread's; excludes waiting for a core)."""
    return "CPU time ms " + summary(replay.cpu)


def summary(times: list[float]) -> str:
    s = sorted(times)
    p99 = s[min(len(s) - 1, int(0.99 * len(s)))]
    return f"mean {statistics.fmean(s):.3f}  median {statistics.median(s):.3f}  p99 {p99:.3f}  max {s[-1]:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,10,50", help="store sizes, MB of int32 tokens")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--history", type=int, default=4000, help="live prompt length in tokens")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"CPU: {cpu_name()} ({cpu_signature()}); Python {platform.python_version()}, numpy {np.__version__}")
    print(f"replay: {args.steps} draft() calls, k=16, live prompt {args.history} tokens\n")

    # live context only, as the history grows (no store)
    for hist in (1000, args.history, 100_000):
        gens = synthetic_generations(rng, hist + 4000)
        seq = np.concatenate(gens)
        d = SuffixDrafter(DraftParams())
        t0 = time.perf_counter()
        d.prepare(seq[:hist].tolist())
        t_prep = time.perf_counter() - t0
        times, _, _ = replay(d, seq[:hist].tolist(), seq[hist:], args.steps, rng)
        print(f"no store, history {hist:>7,} tokens: draft() ms {summary(times)}  (prepare {t_prep * 1000:.0f} ms)")
        print(f"    {cpu_summary()}\n    {control(times)}")
    print()

    for mb in [float(x) for x in args.sizes.split(",") if x]:
        n_tokens = int(mb * 2**20 / 4)
        gens = synthetic_generations(rng, n_tokens)
        with tempfile.TemporaryDirectory() as tmp:
            where = Path(tmp) / "s"
            store = SuffixStore(where, "bench", max_bytes=10**12)
            t0 = time.perf_counter()
            rec = file_format.Records.of(gens)
            rec.index()
            t1 = time.perf_counter()
            file_format.write_store_file(store.base_path, "base", store.fingerprint, rec)
            t2 = time.perf_counter()
            del rec
            store = SuffixStore(where, "bench", max_bytes=10**12)
            t3 = time.perf_counter()
            store.add([], gens[-1][:600].tolist())
            t4 = time.perf_counter()
            # a tail just under its limit (the most an add rebuilds and rewrites without compacting)
            tail = file_format.Records.of(synthetic_generations(rng, store.tail_max_tokens - 1000), first_seq=10**6).index()
            file_format.write_store_file(store.tail_path, "tail", store.fingerprint, tail)
            store = SuffixStore(where, "bench", max_bytes=10**12)
            t5 = time.perf_counter()
            store.add([], gens[-2][:600].tolist(), compact=False)
            t6 = time.perf_counter()
            size = store.bytes_on_disk
            # the live generation: a fresh prompt, then an answer that re-emits a stored generation
            src = gens[int(rng.integers(len(gens) // 2, len(gens)))]
            prompt = zipf_tokens(rng, args.history).tolist()
            target = np.concatenate([src, zipf_tokens(rng, 200), gens[int(rng.integers(0, len(gens)))]])
            d = SuffixDrafter(DraftParams(), store=store)
            times, hits, right = replay(d, prompt, target, args.steps, rng)
            t7 = time.perf_counter()
            store.compact()
            t8 = time.perf_counter()
        print(f"store {mb:g} MB of tokens ({store.n_tokens:,} tokens, {len(gens):,} generations, "
              f"{size / 2**20:.1f} MB on disk):")
        print(f"  draft() ms {summary(times)}; from the store in {hits}/{len(times)} calls, "
              f"{right / len(times):.1f} right tokens a call")
        print(f"  {cpu_summary()}\n  {control(times)}")
        print(f"  build + sort {t1 - t0:.2f} s, write {t2 - t1:.2f} s, load {1000 * (t3 - t2):.0f} ms (CRC checked); "
              f"add 600 tokens: {1000 * (t4 - t3):.0f} ms (empty tail), {1000 * (t6 - t5):.0f} ms (tail of "
              f"{store.tail_max_tokens - 1000:,}); compact (merge the tail into the base) {t8 - t7:.2f} s")
    print("\n(a main-model decode is ~60-100 ms on the development machines)")


if __name__ == "__main__":
    main()
