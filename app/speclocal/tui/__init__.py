"""The Textual TUI (`speclocal` with no subcommand). Importing this package loads neither Textual
nor llama.cpp; `run_tui` does, when it is called."""

from __future__ import annotations


def run_tui(args=None) -> int:
    """Open the TUI; `args` is the CLI's argparse namespace (model/generation flags, all optional)."""
    from speclocal.tui.app import run_tui as _run_tui

    return _run_tui(args)


__all__ = ["run_tui"]
