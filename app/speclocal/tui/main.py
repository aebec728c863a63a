"""`speclocal` / `speclocal tui`: read the saved settings, lay the command line's flags over them, run the App."""

from __future__ import annotations

import sys
from dataclasses import replace

from speclocal import locations
from speclocal.errors import SpeclocalError
from speclocal.options import Settings, settings_from_args
from speclocal.tui.config import load_settings
from speclocal.tui.terminal import QuietStderr


def settings_from_cli(saved: Settings, args) -> Settings:
    """The saved settings with every flag the user typed laid over them (flags left alone change nothing);
    `-m` alone means no draft model, so the speculative run uses prompt lookup (as `speclocal run -m`)."""
    if args is None:
        return saved
    s = settings_from_args(args, saved)
    main, draft, pair = (getattr(args, k, None) for k in ("main", "draft", "pair"))
    if pair or main or draft:
        s = replace(s, pair=pair or "", main=main or "", draft=draft or "")
        if main and not draft and not pair:
            s = replace(s, draft_source="lookup")
    return s.validated()


def require_terminal() -> None:
    """The TUI draws on a terminal and reads keys from one: refuse at once, in one line, without one."""
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise SpeclocalError("the TUI needs a terminal (standard input and output are not one); "
                             "for one prompt without it use `speclocal run PROMPT`")


def run_tui(args=None) -> int:
    """Open the TUI; `args` is the CLI's argparse namespace (model/generation flags, all optional).
    Returns the exit code."""
    require_terminal()
    from speclocal.tui.app import SpeclocalApp

    path = locations.config_path()
    settings, warning = load_settings(path)
    settings = settings_from_cli(settings, args)
    with QuietStderr(locations.tui_log_path()):
        app = SpeclocalApp(settings, config_path=path, config_warning=warning)
        try:
            app.run()
        finally:
            app.close_backend()
    return app.return_code or 0
