"""`speclocal run`: one prompt, in one mode or as a plain-vs-speculative comparison."""

from __future__ import annotations

import argparse
import io
import json
import sys
import threading
from collections import Counter
from pathlib import Path

from speclocal.compare import compare, report_json
from speclocal.engine import GenerationRequest, GenerationResult
from speclocal.drafts import MODES, Source, needs_draft_model
from speclocal.engine.types import same_seed
from speclocal.engine.equivalence import NEAR_TIE
from speclocal.errors import SpeclocalError
from speclocal.formatting import fmt_bytes
from speclocal.interrupt import cancel_on_signals
from speclocal.options import add_options, settings_from_args
from speclocal.policy import open_engine

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", metavar="PROMPT", help="the prompt; '-' reads standard input, '@FILE' a file")
    add_options(p, "mode", choices=(*MODES, "compare"), mode="compare: plain then --against")
    p.add_argument("--against", choices=[m for m in MODES if m != "plain"], default="spec",
                   help="the mode compare runs after plain (default spec)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_options(p, "models")
    add_options(p, "generation")


def read_prompt(arg: str) -> str:
    """PROMPT as given, '-' for standard input, '@FILE' for a file's text."""
    if arg == "-":
        try:  # text mode (Windows line ends read as \n), a UTF-8 byte order mark dropped
            return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8-sig").read()
        except UnicodeDecodeError as e:
            raise SpeclocalError(f"standard input is not UTF-8 text: {e}") from None
    if arg.startswith("@"):
        try:
            return Path(arg[1:]).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise SpeclocalError(f"cannot read prompt file {arg[1:]}: {e}") from None
    return arg


def run(args: argparse.Namespace) -> int:
    prompt = read_prompt(args.prompt)
    # validate everything cheap before loading gigabytes
    settings = settings_from_args(args, mode="compare")
    mode = settings.mode
    modes = ("plain", args.against) if mode == "compare" else (mode,)
    requests = same_seed([GenerationRequest.from_settings(settings, m, prompt) for m in modes])
    engine = open_engine(settings, need_draft=any(map(needs_draft_model, modes)))
    try:
        stream = None if args.json or mode == "compare" else _stream_text
        with cancel_on_signals(threading.Event()) as cancel:
            if mode == "compare":
                report = compare(engine, *requests, cancel=cancel)
            else:
                report = {"runs": [engine.generate(requests[0], on_step=stream, cancel=cancel)]}
        if args.json:
            print(json.dumps(report_json(report, engine), indent=2))
        else:
            _print_report(report, show_text=mode == "compare")
    finally:
        engine.close()
    if report["runs"][-1].stop_reason == "cancelled":
        print("speclocal: interrupted: the partial result is above", file=sys.stderr)
        return 130
    return 0


def _stream_text(event) -> None:
    sys.stdout.write("".join(event.pieces))
    sys.stdout.flush()


def _print_report(report: dict, show_text: bool) -> None:
    runs: list[GenerationResult] = report["runs"]
    if show_text:
        for r in runs:
            print(f"── {r.mode} ──")
            print(r.text)
    else:
        print()
    _print_table(runs, runs[0].n_prompt)
    if report.get("speedup") is not None:
        print(f"speedup {runs[1].mode} vs plain: {report['speedup']:.2f}x decoding, "
              f"{report['speedup_e2e']:.2f}x end to end (prompt processing included)")
    _print_drafting(runs)
    eq = report.get("equivalence")
    if eq is not None:
        _print_equivalence(eq)


ROWS = (
    ("generated tokens", lambda r: f"{r.n_generated} ({r.stop_reason})"),
    ("decode tokens/s", lambda r: f"{r.decode_tps:.2f}"),
    ("end-to-end tokens/s", lambda r: f"{r.e2e_tps:.2f}"),
    ("prompt processing", lambda r: f"{r.t_prompt:.2f} s"),
    ("draft model's prompt", lambda r: f"{r.draft_prompt_tokens} tok {r.t_draft_prompt:.2f} s"),
    ("time to first token", lambda r: f"{r.ttft:.2f} s"),
    ("acceptance", lambda r: "-" if r.acceptance is None else f"{r.acceptance:.0%} ({r.n_accepted}/{r.n_drafted})"),
    ("tokens per main pass", lambda r: f"{r.tokens_per_pass:.2f}"),
    ("draft time share", lambda r: f"{r.draft_share:.0%}"),
    ("peak RSS", lambda r: fmt_bytes(r.peak_rss, binary=True)),
)


def _print_table(runs: list[GenerationResult], n_prompt: int) -> None:
    """One column per run, one row per number, then the memory the last run used."""
    print(f"\nprompt: {n_prompt} tokens")
    print(f"{'':22}" + "".join(f"{r.mode:>16}" for r in runs))
    for label, fmt in ROWS:
        print(f"{label:22}" + "".join(f"{fmt(r):>16}" for r in runs))
    mem = runs[-1].memory
    size = lambda n: fmt_bytes(n, binary=True)  # noqa: E731
    print(f"memory: main weights {size(mem.main_weights)}, KV {size(mem.main_kv)}"
          + (f"; draft weights {size(mem.draft_weights)}, KV {size(mem.draft_kv)}" if mem.draft_weights else ""))
    held = mem.per_device()
    if held:  # every buffer llama.cpp allocated (compute and output too), where it is
        print("held by llama.cpp: " + "; ".join(
            f"{where} {size(m + d)}" + (f" (draft {size(d)})" if d else "") for where, (m, d) in held.items()))


def _print_drafting(runs: list[GenerationResult]) -> None:
    """Auto's reasoning, the steps each draft source drafted, and the suffix store's size."""
    for r in runs:
        if r.auto:
            print(f"auto ({r.auto['task']} prompt): {r.auto['sentence']}")
        used = Counter(src for src, (_, drafted, _, _) in zip(r.step_sources, r.steps) if src and drafted)
        if used and (r.mode == "auto" or "store" in used):
            print(f"{r.mode} drafts by source: " + ", ".join(f"{Source(k).label} {n} steps"
                                                             for k, n in used.most_common()))
    store = next((r.store for r in reversed(runs) if r.store), None)
    if store:
        print(f"suffix store: {store['generations']} generations, {store['tokens']:,} tokens, "
              f"{fmt_bytes(store['bytes'], binary=True)}" + (f"; this run added {store['added']:,} tokens"
                                                             if store["added"] else ""))


def _print_equivalence(eq) -> None:
    if eq.identical:
        print(f"equivalence: identical over {eq.compared} tokens")
        return
    verdict = "a near tie (float rounding of batched verification)" if eq.near_tie else "NOT a near tie"
    print(f"equivalence: identical for the first {eq.tokens_match_until} tokens; plain's top-2 logit "
          f"margin there is {eq.margin:.3f}, this machine's rounding of that gap {eq.noise:.3f}: {verdict} "
          f"(a near tie: below {NEAR_TIE} or twice the rounding)")
