#!/usr/bin/env python3
"""Plain decoding speed of speclocal's loop vs llama.cpp's own counters and vs Llama.create_completion.

Same model, threads, prompt and greedy sampling; runs alternate (never concurrent); medians of --reps.
Decode tokens/s is measured the same way for both loops: (tokens - 1) / (time of last - time of first token).
"""

from __future__ import annotations

import argparse
import json
import statistics
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-m", "--model", default="qwen2.5-coder-1.5b-q4km")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-predict", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from llama_cpp import Llama

    path = resolve_model(args.model)
    engine = Engine(path, None, n_ctx=2048, n_threads=args.threads)
    from speclocal.engine.chat import render_chat

    prompt_text = render_chat(engine.main, [{"role": "user", "content": PROMPT}])
    llm = Llama(str(path), n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
    theirs(llm, prompt_text, 8)  # warm-up
    a, b = [], []
    for i in range(args.reps):
        pair = [lambda: a.append(ours(engine, args.n_predict)), lambda: b.append(theirs(llm, prompt_text, args.n_predict))]
        for f in pair if i % 2 == 0 else reversed(pair):
            f()
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    out = {
        "model": path.name, "threads": args.threads, "n_predict": args.n_predict, "reps": args.reps,
        "speclocal_tps": med(a, "tps"), "speclocal_decode_tps": med(a, "decode_tps"),
        "llama_perf_tps": med(a, "llama_perf_tps"), "create_completion_tps": med(b, "tps"),
        "runs": {"speclocal": a, "create_completion": b},
    }
    out["ratio_vs_llama_perf"] = out["speclocal_decode_tps"] / out["llama_perf_tps"]
    out["ratio_vs_create_completion"] = out["speclocal_tps"] / out["create_completion_tps"]
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"{path.name}, {args.threads} threads, {args.n_predict} tokens, median of {args.reps}")
        print(f"speclocal plain decode t/s      {out['speclocal_decode_tps']:7.2f}")
        print(f"llama_perf_context eval t/s     {out['llama_perf_tps']:7.2f}   ratio {out['ratio_vs_llama_perf']:.3f}")
        print(f"speclocal first->last t/s       {out['speclocal_tps']:7.2f}")
        print(f"create_completion first->last   {out['create_completion_tps']:7.2f}   ratio {out['ratio_vs_create_completion']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
