"""`speclocal demo`: one code prompt and one chat prompt, plain then speculative, ending on a comparison.

`--headless` prints it as text (live tokens, then the table) for recordings and CI, `--json` as one JSON
object; without either the TUI opens and runs the same two prompts side by side in its panes, the comparison
landing in its history panel. If the TUI cannot start (no terminal, or its module is unavailable) the headless
version runs instead, with a note.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from speclocal.demo import DEMO_N, build_demo_app, run_headless
from speclocal.drafts import MODES, Source, needs_draft_model
from speclocal.models.catalogue import names_draft
from speclocal.options import Settings, add_options, settings_from_args
from speclocal.policy import open_engine


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--headless", action="store_true",
                   help="print live text and the comparison table instead of opening the TUI (recordings, CI)")
    p.add_argument("--against", choices=[m for m in MODES if m != "plain"], default="spec",
                   help="the speculative mode shown against plain (default spec: the draft model)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (each prompt's runs, speedups and agreement) instead of text; "
                        "implies --headless")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="headless: show accepted draft tokens in green (default: when stdout is a terminal)")
    add_options(p, "models")
    add_options(p, "generation", ("n_predict", "draft_max"), n_predict=DEMO_N)


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args, n_predict=DEMO_N)  # every cheap check before loading anything
    if not (args.headless or args.json):
        note = "the TUI has no auto mode" if args.against == "auto" else _run_tui_demo(args)
        if note is None:
            return 0
        print(f"speclocal demo: {note}; running the headless demo instead", file=sys.stderr)
    out = sys.stdout
    color = args.color == "always" or (args.color == "auto" and hasattr(out, "isatty") and out.isatty())
    mode = args.against
    if mode == "spec" and not names_draft(settings.pair, settings.main, settings.draft):
        print("speclocal demo: no draft model given (-md/--pair): showing prompt lookup instead", file=sys.stderr)
        mode = "lookup"
    engine = open_engine(settings, need_draft=needs_draft_model(mode))
    return run_headless(engine, settings, mode, out, color, as_json=args.json)


def _run_tui_demo(args: argparse.Namespace) -> str | None:
    """Open the TUI and run the demo prompts in it. Returns None when it ran, else why it could not."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        return "no terminal for the TUI"
    try:
        app = build_demo_app(_tui_settings(args))
    except ImportError as e:
        return f"the TUI is not available ({e})"
    from speclocal.locations import tui_log_path
    from speclocal.tui.terminal import QuietStderr

    try:
        with QuietStderr(tui_log_path()):
            app.run()
    finally:
        app.close_backend()
    return None


def _tui_settings(args: argparse.Namespace) -> Settings:
    """The saved-settings shape of the demo: DEMO_N tokens, the flags given, drafting as --against says."""
    from speclocal.tui.main import settings_from_cli

    settings = settings_from_cli(Settings(n_predict=DEMO_N), args)
    return replace(settings, draft_source=Source.of_mode(args.against).value)
