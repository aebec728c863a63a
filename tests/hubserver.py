"""A loopback imitation of the Hugging Face hub's `resolve` endpoint (HEAD + ranged GET), for fetch tests."""

from __future__ import annotations

import hashlib
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """Serves files at /{repo}/resolve/main/{filename}.

    mode: "ok"; "cut-once" (the first GET sends half the body and closes, later GETs are healthy);
    "cut-then-500" (the first GET is cut, every later GET answers 500).
    """

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.mode = "ok"
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.gets = 0  # GET requests for files so far
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_port}"

    def add(self, repo: str, filename: str, data: bytes) -> None:
        self.files[f"/{repo}/resolve/main/{filename}"] = data

    def __enter__(self) -> FakeHub:
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _send(self, status: int, headers: dict[str, str], body: bytes = b"", cut: bool = False) -> None:
                """Send a response; HEAD gets the headers only; `cut` sends half the body and drops the connection."""
                self.send_response(status)
                for k, v in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command == "HEAD":
                    return
                self.wfile.write(body[: len(body) // 2] if cut else body)
                if cut:
                    self.wfile.flush()
                    self.close_connection = True

            def do_HEAD(self) -> None:
                self._serve()

            def do_GET(self) -> None:
                self._serve()

            def _serve(self) -> None:
                hub.requests.append((self.command, self.path, self.headers.get("Range")))
                if self.path == "/":
                    return self._send(200, {})
                data = hub.files.get(self.path)
                if data is None:
                    return self._send(404, {"X-Error-Code": "EntryNotFound"}, b"not found")
                headers = {"ETag": f'"{hashlib.sha256(data).hexdigest()}"', "X-Repo-Commit": COMMIT,
                           "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
                if self.command == "HEAD":
                    return self._send(200, headers, data)
                hub.gets += 1
                if hub.mode == "cut-then-500" and hub.gets > 1:
                    return self._send(500, {}, b"internal error")
                rng = self.headers.get("Range")
                start = int(rng.removeprefix("bytes=").split("-")[0]) if rng else 0
                if start:
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                cut = hub.mode in ("cut-once", "cut-then-500") and hub.gets == 1
                self._send(206 if start else 200, headers, data[start:], cut=cut)

        return Handler
