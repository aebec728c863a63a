"""`speclocal serve`: an OpenAI-compatible local endpoint that speculates per request, only where it pays."""

from __future__ import annotations

import argparse
from pathlib import Path

from speclocal.drafts import MODES
from speclocal.errors import SpeclocalError
from speclocal.options import add_options, settings_from_args
from speclocal.serve.server import DEFAULT_QUEUE, listen, serve

GENERATION = ("draft_max", "draft_min", "draft_p_min", "temperature", "top_k", "top_p", "min_p", "seed",
              "n_predict", "system_prompt", "stop")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; any other needs --api-key)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 = any free port)")
    add_options(p, "mode", choices=MODES, mode="auto: speculate per step where it pays; a request may choose its "
                "own with {\"speclocal\": {\"mode\": ...}}")
    p.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1/ requests")
    p.add_argument("--api-key-file", metavar="FILE", help="read the key from the first line of FILE (not visible "
                                                          "in the process list)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                   help="a web page's origin that may use the server from a browser besides this machine's pages "
                        "(e.g. https://chat.example.com, chrome-extension://ID; '*' any); repeatable. Without an "
                        "API key, other sites' pages are refused")
    p.add_argument("--queue", type=int, default=DEFAULT_QUEUE, metavar="N",
                   help=f"requests that may wait while one generates (default {DEFAULT_QUEUE}); more get 503 "
                        "with Retry-After")
    add_options(p, "models")
    add_options(p, "generation", GENERATION, n_predict="until the model stops or the context is full")


def api_key(args: argparse.Namespace) -> str | None:
    if args.api_key and args.api_key_file:
        raise SpeclocalError("give --api-key or --api-key-file, not both")
    if args.api_key_file:
        try:
            lines = Path(args.api_key_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise SpeclocalError(f"cannot read the API key file {args.api_key_file}: {e}") from None
        key = lines[0].strip() if lines else ""
        if not key:
            raise SpeclocalError(f"the API key file {args.api_key_file} is empty")
        return key
    if args.api_key is not None and not args.api_key.strip():
        raise SpeclocalError("--api-key is empty")
    return args.api_key.strip() if args.api_key else None


def run(args: argparse.Namespace) -> int:
    # everything cheap first: settings, key, address (refused before gigabytes are loaded)
    settings = settings_from_args(args)
    key = api_key(args)
    if args.queue < 0:
        raise SpeclocalError(f"--queue must be >= 0, got {args.queue}")
    sock = listen(args.host, args.port, key)
    try:
        return serve(settings, key, sock, args.queue, args.n_predict, tuple(args.allow_origin))
    finally:
        sock.close()
