"""The server of `speclocal serve`: a listening socket, the engine process and its worker, and uvicorn serving
the app on them."""

from __future__ import annotations

import contextlib
import ipaddress
import signal
import socket
import sys
import threading
from pathlib import Path

from speclocal.drafts import needs_draft_model
from speclocal.errors import SpeclocalError
from speclocal.options import Settings

DEFAULT_QUEUE = 8


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


def serve(settings: Settings, key: str | None, sock: socket.socket, queue: int, n_predict: int | None,
          allow_origins: tuple[str, ...] = ()) -> int:
    """Load the models in an engine process and answer requests on `sock` until a signal stops it; the exit code
    (130 after Ctrl-C, else 0). `settings.mode`: a request's default; `n_predict`: the command line's, None when
    not given; `allow_origins`: web pages' origins allowed besides this machine's."""
    mode = settings.mode
    import uvicorn

    from speclocal import locations
    from speclocal.engine_process import LoadSpec, ProcessBackend
    from speclocal.models.catalogue import resolve_pair
    from speclocal.serve.app import build_app
    from speclocal.serve.protocol import ServerInfo
    from speclocal.serve.status import StatusLog
    from speclocal.serve.worker import EngineWorker

    need_draft = needs_draft_model(mode) or bool(settings.draft)
    main, draft = resolve_pair(settings.pair or None, settings.main or None, settings.draft or None,
                               settings.models_dir or None)
    # auto's cost curve is measured (once per machine and setup, then cached; again where this context reaches
    # deeper than the saved one measured) right after loading, so the first request does not pay for it
    spec = LoadSpec(main, draft if need_draft else None, settings, store_dir=locations.suffix_store_dir(),
                    check_pair=True, measure_curve=mode == "auto")
    log_file = locations.log_dir() / "serve.log"
    status = StatusLog()
    print("speclocal: loading the models" + (" and this machine's cost curve (measured once, then cached)"
                                              if mode == "auto" else "") + f"; the engine's log: {log_file}",
          file=sys.stderr, flush=True)
    worker = EngineWorker(lambda: ProcessBackend(spec, log_file=log_file), queue, status)
    try:
        worker.start()
        facts = worker.engine.facts
        if facts.layout_note:
            print(f"speclocal: {facts.layout_note}", file=sys.stderr, flush=True)
        path: Path = facts.main_path
        info = ServerInfo(model=path.stem, aliases=frozenset({path.name, settings.main, settings.pair} - {""}),
                          n_ctx=facts.n_ctx, has_draft=facts.draft_name is not None, mode=mode, settings=settings,
                          n_predict=n_predict)
        server = _Server(uvicorn.Config(build_app(worker, info, key, loopback=is_loopback(sock),
                                                  allow_origins=allow_origins), log_config=None,
                                        access_log=False,
                                        lifespan="off", server_header=False, timeout_graceful_shutdown=10),
                         worker.cancel_all)
        draft_text = f" + draft {facts.draft_name}" if facts.draft_name else ""
        print(f"speclocal: serving {info.model}{draft_text} (mode {mode}, context {info.n_ctx}) at {_url(sock)}/v1 "
              f"(one generation at a time, {queue} may wait){'; API key required' if key else ''}; "
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
