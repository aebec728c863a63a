"""The demo: one code prompt and one chat prompt, plain then speculative, ending on a comparison, either
printed as text (live tokens, then the table) or typed into the TUI, whose history panel gets the comparison.
The command is `speclocal.cli.demo`.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from speclocal.compare import compare, report_json
from speclocal.drafts import Source
from speclocal.engine import Engine, GenerationRequest, GenerationResult
from speclocal.engine.equivalence import Equivalence
from speclocal.formatting import fmt_num
from speclocal.interrupt import cancel_on_signals
from speclocal.options import Settings

DEMO_N = 128
PROMPTS: list[tuple[str, str]] = [
    ("code", "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring "
             "and a short usage example."),
    ("chat", "Why is the sky blue during the day but red at sunset? Answer in one short paragraph."),
]
GREEN, RESET = "\x1b[32m", "\x1b[0m"


# prompt's task, plain, other, agreement (None where sampled: outputs then differ by design)
Compared = tuple[str, GenerationResult, GenerationResult, Equivalence | None]


def run_headless(engine: Engine, settings: Settings, other: str, out, color: bool, as_json: bool = False) -> int:
    """Each demo prompt plain then in mode `other` (`compare`), streamed to `out` (accepted drafts in green when
    `color`), then the comparison table; or, `as_json`, nothing streamed and one JSON object at the end (each
    prompt's `report_json`). Closes `engine`. The exit code: 130 when interrupted (what finished is printed)."""
    rows: list[Compared] = []
    reports: list[dict] = []
    cancel = threading.Event()
    write = (lambda text: None) if as_json else out.write

    def before(req: GenerationRequest) -> None:
        write(f"\n--- {Source.of_mode(req.mode).mode_label} ---\n")
        out.flush()

    def after(res: GenerationResult) -> None:
        write("\n" + _stats_line(res) + "\n")
        out.flush()

    def finish(interrupted: bool) -> None:
        if as_json:
            out.write(json.dumps({"prompts": reports, "interrupted": interrupted}, indent=2) + "\n")
        else:
            table = "\n" + comparison_table(rows) + "\n" if rows else ""
            out.write(("\n(interrupted)\n" if interrupted else "") + table)
        out.flush()

    try:
        with cancel_on_signals(cancel):
            for task, prompt in PROMPTS:
                write(f"\n=== {task}: {prompt}\n")
                plain_req, other_req = (GenerationRequest.from_settings(settings, m, prompt) for m in ("plain", other))
                report = compare(engine, plain_req, other_req, None if as_json else _streamer(out, color), cancel,
                                 before, after)
                if len(report["runs"]) < 2:
                    raise KeyboardInterrupt
                rows.append((task, *report["runs"], report.get("equivalence")))
                reports.append({"task": task, "prompt": prompt, **report_json(report, engine)})
    except KeyboardInterrupt:
        finish(interrupted=True)
        return 130
    finally:
        engine.close()
    finish(interrupted=False)
    return 0


def _streamer(out, color: bool):
    def on_step(ev) -> None:
        for piece, drafted in zip(ev.pieces, ev.from_draft):
            out.write(f"{GREEN}{piece}{RESET}" if color and drafted and piece else piece)
        out.flush()

    return on_step


def _stats_line(r: GenerationResult) -> str:
    acc = "" if r.acceptance is None else f" · acceptance {r.acceptance:.0%} ({r.n_accepted}/{r.n_drafted})"
    return (f"[{r.mode}] {r.n_generated} tokens · {r.decode_tps:.1f} t/s · TTFT {r.ttft:.2f} s · "
            f"{r.tokens_per_pass:.2f} tokens/pass{acc}")


def comparison_table(rows: list[Compared]) -> str:
    """Two lines per prompt: plain, then the other mode with its speedup and its agreement with plain."""
    header = ["prompt", "mode", "tokens", "t/s", "speedup", "acceptance", "tokens/pass", "TTFT s", "output vs plain",
              "e2e speedup"]
    body = []
    for task, plain, other, eq in rows:
        match = ("- (sampled)" if eq is None else "identical" if eq.identical
                 else f"first {eq.tokens_match_until}/{eq.compared}" + (" (near tie)" if eq.near_tie else ""))
        speedup = other.decode_tps / plain.decode_tps if plain.decode_tps else None
        e2e = other.e2e_speedup_over(plain)
        for r, sp, sp_e2e, m in ((plain, 1.0, 1.0, "-"), (other, speedup, e2e, match)):
            body.append([task, r.mode, str(r.n_generated), f"{r.decode_tps:.2f}", fmt_num(sp, suffix="x"),
                         fmt_num(r.acceptance, ".0%"), f"{r.tokens_per_pass:.2f}", f"{r.ttft:.2f}", m,
                         fmt_num(sp_e2e, suffix="x")])
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(header)]
    lines = ["Comparison (decode tokens/s; speedup = speculative ÷ plain on the same prompt; e2e: prompt processing "
             "included)",
             "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(b, widths)).rstrip() for b in body]
    return "\n".join(lines)


# ---- the TUI version ------------------------------------------------------------------------------
def build_demo_app(settings: Settings | None = None, backend=None, prompts=None, pause: float = 1.5):
    """A SpeclocalApp that types the demo prompts itself, one after the other, in a new chat each, plain first.

    `settings`: the TUI's (default: the declared ones, DEMO_N tokens); `backend` (tests): a ready
    GenerationBackend instead of loading the configured models."""
    from dataclasses import replace

    settings = replace(settings or Settings(n_predict=DEMO_N), order="plain-first", task="auto")
    return _demo_app_class()(settings, backend, list(prompts or PROMPTS), pause)


def _demo_app_class():
    """The demo's App class (built on first use: importing this module loads no Textual)."""
    from textual.widgets import TextArea

    import speclocal.tui.app as tui_app
    from speclocal.tui.app import SpeclocalApp

    class DemoApp(SpeclocalApp):
        SUB_TITLE = "demo: plain vs speculative"
        # Textual resolves a relative CSS_PATH against the subclass's module: anchor it to the TUI's
        CSS_PATH = str((Path(tui_app.__file__).parent / SpeclocalApp.CSS_PATH).resolve())

        def __init__(self, settings: Settings, backend, prompts: list[tuple[str, str]], pause: float) -> None:
            super().__init__(settings, backend=backend, config_path=None)
            self.demo_queue = prompts
            self.demo_pause = pause
            self.demo_done: list[str] = []
            self._demo_active = False

        def on_mount(self) -> None:
            self.set_interval(0.2, self._demo_poll)

        def _demo_poll(self) -> None:
            if self.backend is None or self.running or len(self.screen_stack) > 1:
                return
            if self._demo_active:  # the last demo run just ended
                self._demo_active = False
                self._demo_wait = self.demo_pause
                return
            if getattr(self, "_demo_wait", 0) > 0:
                self._demo_wait -= 0.2
                return
            if not self.demo_queue:
                if self.demo_done and not getattr(self, "_demo_told", False):
                    self._demo_told = True
                    self.notify("Demo finished: the comparison is in the history panel. ctrl+q quits.", timeout=30)
                return
            task, prompt = self.demo_queue.pop(0)
            self.action_new_chat()
            self.query_one("#prompt", TextArea).load_text(prompt)
            self._demo_active = True
            self.demo_done.append(task)
            self.action_run()

    return DemoApp
