#!/usr/bin/env python3
"""The Python-side time per decode step: a step's wall time minus the time spent inside llama.cpp's
`llama_decode` and `llama_synchronize` (both models'), by mode, at a short and a longer context.

    python scripts/step_budget.py                  # the tiny pair, prompts of 512 and 3072 tokens, greedy
    python scripts/step_budget.py --contexts 512 --temp 0.8 --json
    python scripts/step_budget.py --contexts 512 --backend-sampling    # rows' top-k selected by llama.cpp
    python scripts/step_budget.py --contexts 512 --stand-in none       # plain steps' Python work, hot

`--stand-in none|spin` (plain mode only) replaces each single-token decode after the prompt by a stand-in that
computes nothing (the rows read are the last real decode's): `none` returns at once, so the steps run back to back
with the CPU's caches and branch predictors warm, the Python work's own cost; `spin` loops in Python for as long as
a decode takes here, touching no model memory: whatever runs between two steps leaves them cold.

Modes: plain; spec k=3; lookup, suffix and auto at k=16 (the defaults of --draft-max and --lookup-max), the
suffix store off. The prompt asks for a rewrite of the first tokens of Python's `argparse.py` (the same text on
every checkout), so the model-free drafters find matches. A step is the time between two `on_step` callbacks;
its llama.cpp time is what the wrapped calls took between them. The share is the step's Python time over this
context's single-token decode (plain mode's llama.cpp time per step). Medians and means over the steps of
--reps generations per mode; one prompt-processing pass per context (later generations reuse the cache).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import llama_cpp

from speclocal.drafts import MODES
from speclocal.engine import Engine, GenerationRequest, Sampling
from speclocal.models.catalogue import resolve_pair
from speclocal.policy import auto_drafter

LABELS = {"plain": "plain", "spec": "spec-k3", "lookup": "lookup-k16", "suffix": "suffix-k16", "auto": "auto-k16"}


class DecodeClock:
    """Wraps llama.cpp's decode and synchronize calls and adds up the seconds spent inside them."""

    def __init__(self) -> None:
        self.inside = 0.0
        self.stand_in: float | None = None  # seconds a single-token decode is replaced by (0: none); None: real
        self._decode, self._sync = llama_cpp.llama_decode, llama_cpp.llama_synchronize

        def decode(ctx, batch):
            t0 = time.perf_counter()
            try:
                if self.stand_in is not None and batch.n_tokens == 1:
                    while time.perf_counter() - t0 < self.stand_in:
                        pass
                    return 0
                return self._decode(ctx, batch)
            finally:
                self.inside += time.perf_counter() - t0

        def sync(ctx):
            t0 = time.perf_counter()
            try:
                return self._sync(ctx)
            finally:
                self.inside += time.perf_counter() - t0

        llama_cpp.llama_decode, llama_cpp.llama_synchronize = decode, sync


def prompt_text(engine: Engine, n_tokens: int) -> str:
    """A rewrite request whose chat prompt is about `n_tokens` long."""
    code = Path(argparse.__file__).read_text()
    ask = "Rewrite this code with type hints on every function; keep everything else as it is:\n\n"
    overhead = len(engine.main.tokenize(ask)) + 30  # the chat template's tokens, roughly
    ids = engine.main.tokenize(code, add_special=False)[: max(0, n_tokens - overhead)]
    return ask + b"".join(engine.main.piece(t) for t in ids).decode("utf-8", "ignore")


def run_mode(engine: Engine, clock: DecodeClock, req: GenerationRequest) -> tuple[list[float], list[float], int]:
    """One generation: per step (after the first), its Python seconds and its llama.cpp seconds; the tokens."""
    marks: list[tuple[float, float]] = []
    r = engine.generate(req, on_step=lambda e: marks.append((time.perf_counter(), clock.inside)))
    py, c = [], []
    for (t0, c0), (t1, c1) in zip(marks, marks[1:]):
        c.append(c1 - c0)
        py.append(t1 - t0 - (c1 - c0))
    return py, c, r.n_generated


def measure(engine: Engine, clock: DecodeClock, contexts: list[int], n: int, reps: int, temp: float,
            stand_in: str | None = None) -> list[dict]:
    rows = []
    for ctx in contexts:
        messages = ({"role": "user", "content": prompt_text(engine, ctx)},)
        req = lambda mode, k=n: GenerationRequest(messages=messages, mode=mode, n_predict=k,  # noqa: E731
                                                 sampling=Sampling(temp=temp, seed=1), store="off")
        for mode in ("plain", "spec", "auto"):  # prompt processing, the draft model's, auto's cost curve
            engine.generate(req(mode, 2))
        single = None
        if stand_in is not None:  # as long as a real decode takes here, or nothing
            t0 = time.perf_counter()
            engine.generate(req("plain", 8))
            clock.stand_in = 0.0 if stand_in == "none" else (time.perf_counter() - t0) / 8
        for mode in MODES if stand_in is None else ("plain",):
            py, c, toks = [], [], 0
            for _ in range(reps):
                p, d, t = run_mode(engine, clock, req(mode))
                py, c, toks = py + p, c + d, toks + t
            if mode == "plain":
                single = statistics.median(c)
            row = {"context": ctx, "n_prompt": len(engine.prompt_tokens(req(mode))), "mode": LABELS[mode],
                   "steps": len(py), "tokens_per_step": toks / (len(py) + reps),
                   "python_ms_median": 1e3 * statistics.median(py), "python_ms_mean": 1e3 * statistics.fmean(py),
                   "llama_ms_median": 1e3 * statistics.median(c), "single_decode_ms": 1e3 * single}
            row["share_of_decode"] = row["python_ms_median"] / row["single_decode_ms"]
            rows.append(row)
        clock.stand_in = None
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", default="tiny")
    ap.add_argument("--contexts", default="512,3072", help="prompt lengths in tokens, comma-separated")
    ap.add_argument("-n", "--n-predict", type=int, default=48)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("-bs", "--backend-sampling", action=argparse.BooleanOptionalAction, default=None,
                    help="as speclocal's flag (default: on where every layer runs on a GPU)")
    ap.add_argument("--stand-in", choices=("none", "spin"), help="plain only: single decodes replaced (see above)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    contexts = [int(x) for x in args.contexts.split(",")]
    main_path, draft_path = resolve_pair(args.pair)
    engine = Engine(main_path, draft_path, n_ctx=max(contexts) + args.n_predict + 512, n_threads=args.threads,
                    auto_drafter=auto_drafter, backend_sampling=args.backend_sampling)
    clock = DecodeClock()
    rows = measure(engine, clock, contexts, args.n_predict, args.reps, args.temp, args.stand_in)
    out = {"pair": args.pair, "compute": engine.compute, "threads": engine.n_threads, "temp": args.temp,
           "stand_in": args.stand_in,
           "n_predict": args.n_predict, "reps": args.reps, "rows": rows}
    engine.close()
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"{out['compute']}, {out['threads']} threads, pair {args.pair}, temp {args.temp}, -n {args.n_predict}")
    print(f"{'prompt':>6} {'mode':<11} {'steps':>5} {'tok/step':>8} {'py ms med':>9} {'py ms mean':>10} "
          f"{'llama ms':>8} {'share':>6}")
    for r in rows:
        print(f"{r['n_prompt']:>6} {r['mode']:<11} {r['steps']:>5} {r['tokens_per_step']:>8.2f} "
              f"{r['python_ms_median']:>9.3f} {r['python_ms_mean']:>10.3f} {r['llama_ms_median']:>8.2f} "
              f"{100 * r['share_of_decode']:>5.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
