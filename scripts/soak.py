#!/usr/bin/env python3
"""Soak test: one loaded pair generating for a long time, chat turns growing to the context limit.

Alternates plain / speculative / prompt lookup / auto; long chats are trimmed by the engine's
drop-oldest-turns policy; after every generation both KV caches are checked against the token
history; RSS is sampled every 10 s. Pass: no error, and RSS after warm-up grows by at most 5 %.
Usage: scripts/soak.py [--minutes 30] [--pair tiny] [-c 1024] [--out docs/soak.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import psutil

from speclocal.drafts import MODES
from speclocal.engine import Engine, GenerationRequest
from speclocal.models.catalogue import resolve_pair
from speclocal.policy import auto_drafter

QUESTIONS = [
    "Write a Python function that parses an ISO date and returns the weekday.",
    "Explain in a few sentences why the sky is blue.",
    "Now add type hints and a docstring to that function and show it again.",
    "Give me three tips for a good night's sleep.",
    'Return JSON with keys "city" and "country" for: I live in Lyon, France.',
    "Summarise our conversation so far in two sentences.",
]
WARM_UP_S = 120


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--pair", default=None)
    ap.add_argument("-c", "--ctx-size", type=int, default=1024)
    ap.add_argument("-n", "--n-predict", type=int, default=96)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("--out", default=None, help="write the samples and summary as JSON here")
    args = ap.parse_args()

    main_path, draft_path = resolve_pair(args.pair)
    engine = Engine(main_path, draft_path, n_ctx=args.ctx_size, n_threads=args.threads, auto_drafter=auto_drafter)
    proc = psutil.Process()
    t0 = time.monotonic()
    samples: list[tuple[float, int]] = []
    done = threading.Event()

    def sampler() -> None:
        while not done.wait(10):
            samples.append((time.monotonic() - t0, proc.memory_info().rss))

    threading.Thread(target=sampler, daemon=True).start()
    messages: list[dict] = [{"role": "system", "content": "You are a helpful, concise assistant."}]
    runs, dropped, errors, by_mode = 0, 0, [], {m: [] for m in MODES}
    try:
        while time.monotonic() - t0 < args.minutes * 60:
            messages.append({"role": "user", "content": QUESTIONS[runs % len(QUESTIONS)]})
            messages, n = engine.fit_chat(messages, reserve=args.n_predict)
            dropped += n
            mode = MODES[runs % len(MODES)]
            req = GenerationRequest(messages=tuple(messages), mode=mode, n_predict=args.n_predict)
            try:
                prompt = engine.prompt_tokens(req)
                r = engine.generate(req)
                engine.check_kv()
                if engine.main.tokens != (prompt + r.tokens)[: len(engine.main.tokens)]:
                    raise AssertionError("main KV cache does not hold the prompt + generated tokens")
            except Exception as e:  # a soak records every failure and goes on
                errors.append(f"run {runs} ({mode}): {type(e).__name__}: {e}")
                messages.pop()
                continue
            by_mode[mode].append(r.decode_tps)
            messages.append({"role": "assistant", "content": r.text})
            runs += 1
            if runs % 20 == 0:
                print(f"{(time.monotonic() - t0) / 60:5.1f} min  {runs} generations  {len(messages)} messages  "
                      f"{dropped} turns dropped  RSS {proc.memory_info().rss >> 20} MiB", file=sys.stderr)
    finally:
        done.set()
        engine.close()
    after = [rss for t, rss in samples if t >= WARM_UP_S] or [rss for _, rss in samples]
    growth = (max(after) - after[0]) / after[0] if after else 0.0
    summary = {
        "minutes": round((time.monotonic() - t0) / 60, 1), "generations": runs, "turns_dropped": dropped,
        "errors": errors, "rss_first_after_warmup_mib": after[0] >> 20 if after else None,
        "rss_max_after_warmup_mib": max(after) >> 20 if after else None, "rss_growth": round(growth, 4),
        "median_decode_tps": {m: round(statistics.median(v), 2) for m, v in by_mode.items() if v},
        "ctx_size": args.ctx_size, "n_predict": args.n_predict, "threads": engine.n_threads, "main": main_path.name,
        "draft": draft_path.name if draft_path else None,
        "passed": not errors and growth <= 0.05,
    }
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps({"summary": summary, "rss_samples": samples}, indent=1))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
