"""`speclocal tui`: the terminal UI with model and generation flags (saved settings fill the rest)."""

from __future__ import annotations

import argparse

from speclocal.options import add_options


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, "models")
    add_options(p, "generation")


def run(args: argparse.Namespace) -> int:
    from speclocal.tui.main import run_tui

    return run_tui(args)
