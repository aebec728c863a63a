#!/usr/bin/env python3
"""Plain decoding speed of speclocal's loop vs llama.cpp's own counters, vs Llama.create_completion, and (with
`--llama-bench PATH`) vs llama.cpp's `llama-bench` tg, built from the llama.cpp the pinned binding vendors.

Same model, threads, prompt and greedy sampling; runs alternate (never concurrent); medians of --reps.
Decode tokens/s is measured the same way for both Python loops: (tokens - 1) / (time of last - time of first
token). llama-bench generates -n tokens after a context of the chat prompt's length (`-d`), one repetition per
call, in the weight layout speclocal uses: `--repack|--no-repack` pass through (llama-bench's `--repack 1|0`);
the layout without AMX that speclocal finds on AMX machines has no llama-bench flag (its `-ot` knows no
CPU_REPACK), so give `--no-repack` there.

    python scripts/bench_plain_overhead.py --no-repack --llama-bench /path/to/build/bin/llama-bench --reps 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from speclocal.engine import Engine, GenerationRequest
from speclocal.models.catalogue import resolve_model

PROMPT = "Write a Python class for a bank account with deposit, withdraw and a transaction history."


def ours(engine: Engine, n: int) -> dict:
    engine.reset()
    engine.main.perf_reset()
    times = []
    req = GenerationRequest(messages=({"role": "user", "content": PROMPT},), mode="plain", n_predict=n)
    r = engine.generate(req, on_step=lambda e: times.append(time.perf_counter()))
    perf = engine.main.perf()
    return {
        "tokens": r.n_generated,
        "tps": (len(times) - 1) / (times[-1] - times[0]),
        "decode_tps": r.decode_tps,
        "llama_perf_tps": perf.n_eval / (perf.t_eval_ms / 1000),
        "llama_perf_n_eval": perf.n_eval,
    }


def theirs(llm, prompt_text: str, n: int) -> dict:
    llm.reset()
    times = []
    for _ in llm.create_completion(prompt_text, max_tokens=n, temperature=0.0, stream=True):
        times.append(time.perf_counter())
    return {"tokens": len(times), "tps": (len(times) - 1) / (times[-1] - times[0])}


def high_level(path, threads: int, extra_bufts: bool):
    """llama-cpp-python's `Llama` for `path`, with llama.cpp's extra weight layouts (AMX, CPU_REPACK) or without:
    its constructor takes no such argument, so the default model parameters it starts from are set for it."""
    import llama_cpp.llama_cpp as low
    from llama_cpp import Llama

    default = low.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = extra_bufts
        return p

    low.llama_model_default_params = params
    try:
        return Llama(str(path), n_ctx=2048, n_threads=threads, n_threads_batch=threads, verbose=False)
    finally:
        low.llama_model_default_params = default


def llama_bench(binary: str, path, threads: int, n: int, depth: int, repack: bool) -> dict:
    """One llama-bench tg run: `n` tokens generated after `depth` tokens of context."""
    cmd = [binary, "-m", str(path), "-t", str(threads), "-p", "0", "-n", str(n), "-d", str(depth), "-r", "1",
           "--repack", str(int(repack)), "-o", "json"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    row = json.loads(out)[0]
    return {"tokens": row["n_gen"], "tps": row["avg_ts"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-q4km")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--llama-bench", metavar="PATH", help="also time this llama-bench binary's tg, side by side")
    ap.add_argument("--repack", action=argparse.BooleanOptionalAction, default=None,
                    help="the weight layout (default: the one speclocal finds on this machine)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    path = resolve_model(args.model)
    engine = Engine(path, None, n_ctx=2048, n_threads=args.threads, repack=args.repack)
    if args.llama_bench and engine.layout.layout not in ("default", "stored"):
        print(f"error: llama-bench cannot run speclocal's {engine.layout.layout!r} layout: give --no-repack",
              file=sys.stderr)
        return 2
    from speclocal.engine.chat import render_chat

    prompt_text = render_chat(engine.main, [{"role": "user", "content": PROMPT}])
    depth = len(engine.main.tokenize(prompt_text, add_special=False))
    llm = high_level(path, args.threads, extra_bufts=engine.layout.layout == "default")
    theirs(llm, prompt_text, 8)  # warm-up
    a, b, c = [], [], []
    for i in range(args.reps):
        runs = [lambda: a.append(ours(engine, args.n_predict)), lambda: b.append(theirs(llm, prompt_text, args.n_predict))]
        if args.llama_bench:
            runs.append(lambda: c.append(llama_bench(args.llama_bench, path, args.threads, args.n_predict, depth,
                                                     engine.layout.layout == "default")))
        for f in runs if i % 2 == 0 else reversed(runs):
            f()
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    out = {
        "model": path.name, "threads": args.threads, "n_predict": args.n_predict, "reps": args.reps,
        "layout": engine.layout.layout, "prompt_tokens": depth,
        "speclocal_tps": med(a, "tps"), "speclocal_decode_tps": med(a, "decode_tps"),
        "llama_perf_tps": med(a, "llama_perf_tps"), "create_completion_tps": med(b, "tps"),
        "runs": {"speclocal": a, "create_completion": b},
    }
    out["ratio_vs_llama_perf"] = out["speclocal_decode_tps"] / out["llama_perf_tps"]
    out["ratio_vs_create_completion"] = out["speclocal_tps"] / out["create_completion_tps"]
    if c:
        out["llama_bench_tps"] = med(c, "tps")
        out["runs"]["llama_bench"] = c
        out["ratio_vs_llama_bench"] = out["speclocal_decode_tps"] / out["llama_bench_tps"]
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{path.name}, {args.threads} threads, {args.n_predict} tokens, layout {engine.layout.layout}, "
              f"median of {args.reps}")
        print(f"speclocal plain decode t/s      {out['speclocal_decode_tps']:7.2f}")
        print(f"llama_perf_context eval t/s     {out['llama_perf_tps']:7.2f}   ratio {out['ratio_vs_llama_perf']:.3f}")
        print(f"speclocal first->last t/s       {out['speclocal_tps']:7.2f}")
        print(f"create_completion first->last   {out['create_completion_tps']:7.2f}   ratio {out['ratio_vs_create_completion']:.3f}")
        if c:
            print(f"llama-bench tg{args.n_predict} @ d{depth}        {out['llama_bench_tps']:7.2f}   "
                  f"ratio {out['ratio_vs_llama_bench']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
