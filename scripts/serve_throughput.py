"""Decode speed through `speclocal serve` against the engine's headless decode speed, on the same prompt.

One run: load the engine here (headless) and start `speclocal serve` with the same model and settings in a
child process; then, alternating which goes first, generate the same greedy prompt headless and through the
server (streamed, read with the official `openai` client), never both at once. A rate is tokens after the
first step over the time from the first step's tokens to the last's: headless from the engine's step callback,
served from the arrival of the chunks at the client (what a user of the server sees). Prints each pair, the
median of each and their ratio, and the server's own `timings.predicted_per_second` against headless
decode_tps.

On a shared machine, two decode threads on two cores collapse whenever another process takes a core (rates
swing 10x), so every run also records the CPU other processes used meanwhile (the whole machine's busy time
minus this process's and the server's), and the summary counts only pairs whose two runs both had less than
`--quiet` (default 5 %) of the machine taken by others; it says how many pairs that left.

    python scripts/serve_throughput.py [-m MAIN] [-n 128] [--reps 6] [--mode plain] [-t N] [--quiet 0.05]
                                       [--wait-idle S]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from speclocal.drafts import needs_draft_model
from speclocal.engine.types import GenerationRequest
from speclocal.models.cpu import cpu_name
from speclocal.options import add_options, settings_from_args
from speclocal.policy import open_engine

PROMPT = "Write a Python function that parses a CSV file into a list of dictionaries, with a docstring."


class Foreign:
    """The share of the machine's CPU that processes other than `pids` used between start() and stop()."""

    def __init__(self, pids: list[int]):
        self.procs = [psutil.Process(pid) for pid in pids]

    @staticmethod
    def _busy() -> float:
        t = psutil.cpu_times()
        return t.user + t.system + getattr(t, "nice", 0) + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + \
            getattr(t, "steal", 0)

    def _own(self) -> float:
        return sum(sum(p.cpu_times()[:2]) for p in self.procs)

    def start(self) -> None:
        self.t0, self.busy0, self.own0 = time.perf_counter(), self._busy(), self._own()

    def stop(self) -> float:
        wall = time.perf_counter() - self.t0
        foreign = (self._busy() - self.busy0) - (self._own() - self.own0)
        return max(0.0, foreign) / (wall * (psutil.cpu_count() or 1)) if wall > 0 else 0.0


def rate(times: list[float], counts: list[int]) -> float:
    """Tokens after the first batch over the time from the first batch to the last."""
    if len(times) < 2 or times[-1] <= times[0]:
        return 0.0
    return (sum(counts) - counts[0]) / (times[-1] - times[0])


class Server:
    def __init__(self, argv: list[str]):
        self.proc = subprocess.Popen([sys.executable, "-m", "speclocal.cli", "serve", "--port", "0", *argv],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[str] = []
        self.url: str | None = None
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                m = re.search(r" at (http://\S+)/v1 ", line)
                if m:
                    self.url = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        ready.wait(600)
        if self.url is None:
            raise SystemExit("the server did not start:\n" + "\n".join(self.lines))

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-n", "--n-predict", dest="n", type=int, default=128)
    p.add_argument("--reps", type=int, default=6, help="pairs (headless + served), alternating which goes first")
    p.add_argument("--mode", default="plain", choices=("plain", "spec", "lookup", "auto"))
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--quiet", type=float, default=0.05,
                   help="count only pairs where other processes used less than this share of the CPU (default 0.05)")
    p.add_argument("--wait-idle", type=float, default=0.0, metavar="S",
                   help="before each pair, wait up to S seconds for a second in which the machine is idle")
    p.add_argument("--json", metavar="FILE", help="also write the measurements here")
    add_options(p, "models")
    args = p.parse_args()
    settings = settings_from_args(args, temperature=0.0)
    model_flags = [f for flag, value in (("--pair", settings.pair), ("-m", settings.main), ("-md", settings.draft),
                                         ("--dir", settings.models_dir)) if value for f in (flag, value)]
    model_flags += ["-c", str(settings.ctx_size), "-ngl", str(settings.n_gpu_layers)]
    if settings.threads:
        model_flags += ["-t", str(settings.threads)]
    need_draft = needs_draft_model(args.mode)

    engine = open_engine(settings, need_draft=need_draft)
    server = Server([*model_flags, "--mode", args.mode, "--temp", "0"])
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)
    req = GenerationRequest.from_settings(settings, args.mode, args.prompt)
    req = GenerationRequest(messages=req.messages, mode=args.mode, n_predict=args.n, sampling=req.sampling,
                            draft=req.draft)

    def headless() -> dict:
        times, counts = [], []

        def on_step(ev) -> None:
            times.append(time.perf_counter())
            counts.append(len(ev.tokens))

        r = engine.generate(req, on_step=on_step)
        return {"tps": rate(times, counts), "engine_tps": r.decode_tps, "n": r.n_generated, "text": r.text}

    def served() -> dict:
        times, counts, texts, final = [], [], [], None
        stream = client.chat.completions.create(model=Path(engine.main.path).stem, messages=list(req.messages),
                                                max_tokens=args.n, temperature=0, stream=True,
                                                extra_body={"speclocal": {"mode": args.mode}})
        for chunk in stream:
            now = time.perf_counter()
            c = chunk.choices[0] if chunk.choices else None
            if c is not None and c.finish_reason is None and c.delta.role is None:
                if times and now - times[-1] < 2e-3:  # tokens of one step arrive together: one batch
                    counts[-1] += 1
                else:
                    times.append(now)
                    counts.append(1)
            if c is not None and c.delta.content:
                texts.append(c.delta.content)
            if c is not None and c.finish_reason is not None:
                final = chunk
        t = final.model_extra["timings"]
        return {"tps": rate(times, counts), "engine_tps": t["predicted_per_second"], "n": t["predicted_n"],
                "text": "".join(texts)}

    meter = Foreign([os.getpid(), server.proc.pid])
    try:
        headless(), served()  # warm-up: page the weights in, fill both KV caches with the prompt
        pairs = []
        for i in range(args.reps):
            order = ("headless", "served") if i % 2 == 0 else ("served", "headless")
            end = time.monotonic() + args.wait_idle
            while time.monotonic() < end and psutil.cpu_percent(interval=1.0) > 5:
                pass
            got = {}
            for what in order:
                time.sleep(0.5)  # let the other process's threads go idle
                meter.start()
                got[what] = headless() if what == "headless" else served()
                got[what]["foreign"] = meter.stop()
            if got["headless"]["text"] != got["served"]["text"]:
                print("warning: the served text differs from the headless one", file=sys.stderr)
            pairs.append(got)
            h, s = got["headless"], got["served"]
            print(f"rep {i + 1} ({order[0]} first): headless {h['tps']:.2f} t/s, served {s['tps']:.2f} t/s "
                  f"(ratio {s['tps'] / h['tps']:.3f}); engine decode_tps {h['engine_tps']:.2f} vs server's "
                  f"timings {s['engine_tps']:.2f}; {h['n']} / {s['n']} tokens; others used "
                  f"{h['foreign']:.0%} / {s['foreign']:.0%} of the CPU", flush=True)
    finally:
        server.stop()
        engine.close()

    quiet = [p for p in pairs if max(p["headless"]["foreign"], p["served"]["foreign"]) < args.quiet]
    summary = {"cpu": cpu_name(), "cores": os.cpu_count(), "main": str(engine.main.path), "mode": args.mode,
               "n": args.n, "reps": args.reps, "threads": engine.n_threads, "quiet_threshold": args.quiet,
               "all": _summary(pairs), "quiet": _summary(quiet) if quiet else None}
    print(f"\n{summary['cpu']}, {engine.n_threads} threads, {Path(summary['main']).name}, mode {args.mode}, "
          f"{args.n} tokens, {args.reps} alternating pairs:")
    print(f"all {len(pairs)} pairs: {_line(summary['all'])}")
    if quiet:
        print(f"the {len(quiet)} quiet pairs (others < {args.quiet:.0%} of the CPU in both runs): "
              f"{_line(summary['quiet'])}")
    else:
        print(f"no pair was quiet (others < {args.quiet:.0%} of the CPU in both runs): the ratio above is noise")
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "pairs": [
            {k: {kk: vv for kk, vv in v.items() if kk != "text"} for k, v in p.items()} for p in pairs]}, indent=1))
    return 0


def _summary(pairs: list[dict]) -> dict:
    med = statistics.median
    h_tps, s_tps = med([p["headless"]["tps"] for p in pairs]), med([p["served"]["tps"] for p in pairs])
    ratios = [p["served"]["tps"] / p["headless"]["tps"] for p in pairs]
    return {"pairs": len(pairs), "headless_tps": h_tps, "served_tps": s_tps, "ratio_of_medians": s_tps / h_tps,
            "median_ratio": med(ratios), "min_ratio": min(ratios), "max_ratio": max(ratios),
            "engine_decode_tps_headless": med([p["headless"]["engine_tps"] for p in pairs]),
            "engine_decode_tps_served": med([p["served"]["engine_tps"] for p in pairs])}


def _line(s: dict) -> str:
    return (f"headless {s['headless_tps']:.2f} t/s, through the server {s['served_tps']:.2f} t/s: ratio "
            f"{s['ratio_of_medians']:.3f} (median of pair ratios {s['median_ratio']:.3f}, range "
            f"{s['min_ratio']:.3f}-{s['max_ratio']:.3f}); the server's own timings {s['engine_decode_tps_served']:.2f}"
            f" vs headless decode_tps {s['engine_decode_tps_headless']:.2f} "
            f"({s['engine_decode_tps_served'] / s['engine_decode_tps_headless']:.3f})")


if __name__ == "__main__":
    sys.exit(main())
