"""`speclocal serve`: an OpenAI-compatible local endpoint (chat and text completions, streaming or not) that
speculates per request, only where it pays: `--mode auto` (the default) lets the measured cost model pick
plain, prompt lookup or the draft model before every step, and each request may ask for a mode of its own.

Threads and processes: uvicorn's event loop on the main thread; every engine call on one engine worker thread
(`worker.py`); the engine itself in a process of its own, so a native crash in llama.cpp costs one request (a
500 naming it) and a reload, not the server. Bound to 127.0.0.1 by default; another address needs `--api-key`. SIGTERM stops it (exit 0),
Ctrl-C too (exit 130, as the CLI reports an interrupt); either way running generations stop within one step and
a summary per task type goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import signal
import socket
import sys
import threading
from pathlib import Path

from speclocal.drafts import MODES
from speclocal.errors import SpeclocalError
from speclocal.options import add_options, settings_from_args

GENERATION = ("draft_max", "draft_min", "draft_p_min", "temperature", "top_k", "top_p", "min_p", "seed",
              "n_predict", "system_prompt", "stop")
DEFAULT_QUEUE = 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; any other needs --api-key)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 = any free port)")
    p.add_argument("--mode", choices=MODES, default="auto",
                   help="default mode of a request (default auto: speculate per step where it pays); a request "
                        "may choose its own with {\"speclocal\": {\"mode\": ...}}")
    p.add_argument("--api-key", metavar="KEY", help="require 'Authorization: Bearer KEY' on /v1/ requests")
    p.add_argument("--api-key-file", metavar="FILE", help="read the key from the first line of FILE (not visible "
                                                          "in the process list)")
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


def is_loopback(sock: socket.socket) -> bool:
    return ipaddress.ip_address(sock.getsockname()[0].split("%")[0]).is_loopback


def listen(host: str, port: int, key: str | None) -> socket.socket:
    """A listening socket on host:port; a non-loopback address without a key is refused first."""
    if not 0 <= port <= 65535:
        raise SpeclocalError(f"--port must be in 0..65535, got {port}")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise SpeclocalError(f"cannot resolve --host {host}: {e.strerror}") from None
    if not ipaddress.ip_address(addr[0].split("%")[0]).is_loopback and key is None:
        raise SpeclocalError(f"--host {host} is not a loopback address, so other machines could use the models: "
                             "give --api-key KEY (or --api-key-file FILE), or bind 127.0.0.1")
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise SpeclocalError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def run(args: argparse.Namespace) -> int:
    # everything cheap first: settings, key, address (refused before gigabytes are loaded)
    settings = settings_from_args(args)
    key = api_key(args)
    if args.queue < 0:
        raise SpeclocalError(f"--queue must be >= 0, got {args.queue}")
    sock = listen(args.host, args.port, key)
    try:
        return _serve(args, settings, key, sock)
    finally:
        sock.close()


def _serve(args, settings, key, sock) -> int:
    import uvicorn

    from speclocal import locations
    from speclocal.engine_process import LoadSpec, ProcessBackend
    from speclocal.models.catalogue import resolve_pair
    from speclocal.serve.app import build_app
    from speclocal.serve.protocol import ServerInfo
    from speclocal.serve.status import StatusLog
    from speclocal.serve.worker import EngineWorker

    mode = args.mode
    need_draft = mode in ("auto", "spec") or bool(settings.draft)
    main, draft = resolve_pair(settings.pair or None, settings.main or None, settings.draft or None,
                               settings.models_dir or None)
    # auto's cost curve is measured (once per machine and setup, then cached) right after loading, so the first
    # request does not pay for it
    spec = LoadSpec(main, draft if need_draft else None, n_ctx=settings.ctx_size, threads=settings.threads,
                    n_gpu_layers=settings.n_gpu_layers, force=settings.force, repack=settings.repack,
                    store_dir=locations.suffix_store_dir(), check_pair=True, measure_curve=mode == "auto")
    log_file = locations.log_dir() / "serve.log"
    status = StatusLog()
    print("speclocal: loading the models" + (" and this machine's cost curve (measured once, then cached)"
                                              if mode == "auto" else "") + f"; the engine's log: {log_file}",
          file=sys.stderr, flush=True)
    worker = EngineWorker(lambda: ProcessBackend(spec, log_file=log_file), args.queue, status)
    try:
        worker.start()
        facts = worker.engine.facts
        if facts.layout_note:
            print(f"speclocal: {facts.layout_note}", file=sys.stderr, flush=True)
        path: Path = facts.main_path
        info = ServerInfo(model=path.stem, aliases=frozenset({path.name, settings.main, settings.pair} - {""}),
                          n_ctx=facts.n_ctx, has_draft=facts.draft_name is not None, mode=mode, settings=settings,
                          n_predict=args.n_predict)
        server = _Server(uvicorn.Config(build_app(worker, info, key, loopback=is_loopback(sock)), log_config=None,
                                        access_log=False,
                                        lifespan="off", server_header=False, timeout_graceful_shutdown=10),
                         worker.cancel_all)
        draft_text = f" + draft {facts.draft_name}" if facts.draft_name else ""
        print(f"speclocal: serving {info.model}{draft_text} (mode {mode}, context {info.n_ctx}) at {_url(sock)}/v1 "
              f"(one generation at a time, {args.queue} may wait){'; API key required' if key else ''}; "
              "Ctrl-C stops", file=sys.stderr, flush=True)
        import asyncio

        asyncio.run(server.serve(sockets=[sock]))
    finally:
        worker.stop()
        print(status.summary(), file=sys.stderr, flush=True)
    return 130 if server.stop_signal == signal.SIGINT else 0


def _uvicorn_server():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, except: a signal cancels every generation (they stop within one step) and is not
        re-raised after the graceful shutdown; `stop_signal` says which one stopped it."""

        def __init__(self, config, on_stop):
            super().__init__(config)
            self.on_stop = on_stop
            self.stop_signal: int | None = None

        @contextlib.contextmanager
        def capture_signals(self):
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

        def handle_exit(self, sig, frame) -> None:
            if self.stop_signal is None:
                self.stop_signal = sig
                with contextlib.suppress(Exception):  # a signal may land inside another print
                    print("speclocal: stopping: running generations stop within one step (Ctrl-C again to "
                          "force)", file=sys.stderr, flush=True)
            self.on_stop()
            super().handle_exit(sig, frame)

    return Server


def _Server(config, on_stop):  # noqa: N802 - a class built on first use, so --help never imports uvicorn
    return _uvicorn_server()(config, on_stop)
