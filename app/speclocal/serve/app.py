"""The HTTP side of `speclocal serve`: a Starlette app whose handlers parse, submit a job to the engine worker
and answer from its events; streaming answers are server-sent events.

Every failure a client can cause is an OpenAI-style error with a 4xx status (401 without the key, 403 a page of
another site, 404 unknown model or path, 405, 413 body too large, 400 everything else, 503 + Retry-After when the
queue is full); a request that fails is a 500 with `x-should-retry: false`; an
unexpected exception is a 500 with a one-line message (the traceback goes to the log with -v), never a traceback
to the client, and the server keeps serving. A client that disconnects sets its job's cancel Event: waiting, its
job is skipped; generating, the engine stops before its next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import re
import socket
import time

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from speclocal.serve.protocol import (ApiError, Chunks, Parsed, ServerInfo, new_id, parse_body, parse_chat,
                                      parse_completion, prompt_error, response)
from speclocal.serve.worker import Busy, EngineWorker, Job

log = logging.getLogger("speclocal.serve")

MAX_BODY = 8 * 1024 * 1024  # bytes; a long prompt is well under 1 MB
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def shutting_down() -> ApiError:
    """A generation cancelled while its client is still there: only shutdown does that."""
    return ApiError(503, "the server is shutting down: the generation was cancelled", type="server_error",
                    code="shutting_down")


class EventStream(StreamingResponse):
    """Server-sent events of a job; however the response ends (done, the client gone before or during the
    stream), the job's generation is told to stop: a generator never started would not run its `finally`."""

    def __init__(self, job: Job, content):
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel.set()


def crashed(message: str) -> ApiError:
    return ApiError(500, f"{message}; the server starts a new engine for the next request", type="server_error",
                    code="engine_crashed")


def error_response(e: ApiError) -> Response:
    """ASCII JSON: a message may quote the request's text, lone surrogates included, which UTF-8 cannot encode."""
    return Response(json.dumps(e.body()), status_code=e.status, headers=e.headers, media_type="application/json")


def local_host(header: str) -> bool:
    """Does a Host header name this machine (with or without a port): localhost, a loopback address, this
    machine's host name, or a name no public DNS gives out (*.internal, as Docker's host.docker.internal for a
    UI in a container; *.local, mDNS), as Ollama allows?"""
    h = header.strip().lower()
    if h.startswith("["):  # [::1]:8080
        host = h[1:h.find("]")]
    elif h.count(":") == 1:  # localhost:8080, 127.0.0.1:8080
        host = h.partition(":")[0]
    else:  # no port (or a bare IPv6 address)
        host = h
    if host == "localhost" or host.endswith((".localhost", ".internal", ".local")):  # RFC 6761, ICANN, RFC 6762
        return True
    if host and host.rstrip(".") == socket.gethostname().lower():
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# the origins of web pages on this machine (a chat UI at http://localhost:3000) and of desktop apps' pages (VS Code
# webviews, Tauri, Electron): they may call the API from a browser (CORS); a page of any other site (and "null",
# which any site can send from a sandboxed frame) may not make the server generate without an API key, unless
# --allow-origin names it
LOCAL_ORIGIN = (r"https?://(localhost|[a-z0-9.-]+\.localhost|127(\.\d{1,3}){3}|\[::1\])(:\d+)?"
                r"|vscode-webview://[a-z0-9-]+|vscode-file://vscode-app|tauri://localhost|app://[a-z0-9.-]+")


def origin_pattern(allowed: tuple[str, ...] = ()) -> str:
    """The origins allowed: this machine's pages, and `allowed` (--allow-origin; "*" every one)."""
    if "*" in allowed:
        return ".*"
    return "|".join([LOCAL_ORIGIN, *(re.escape(o.rstrip("/").lower()) for o in allowed)])


def build_app(worker: EngineWorker, info: ServerInfo, api_key: str | None = None, loopback: bool = True,
              allow_origins: tuple[str, ...] = ()) -> Starlette:
    """`loopback`: the server listens on a loopback address only, so every request must name this machine in its
    Host header: a web page cannot reach it by DNS rebinding (a name that resolves to 127.0.0.1). `allow_origins`:
    web pages' origins allowed besides this machine's (`origin_pattern`)."""
    origins = origin_pattern(allow_origins)
    api = Api(worker, info, api_key.encode() if api_key else None, loopback, origins)
    return Starlette(
        routes=[
            *(Route(prefix + path, api.endpoint(handler), methods=[method])  # with /v1 or without (a base URL
              for prefix in ("/v1", "") for path, handler, method in (  # given without it), as llama-server
                  ("/chat/completions", api.chat, "POST"), ("/completions", api.completions, "POST"),
                  ("/models", api.models, "GET"), ("/models/{model:path}", api.model, "GET"))),
            Route("/health", api.health, methods=["GET"]),
        ],
        middleware=[Middleware(CORSMiddleware, allow_origin_regex=origins, allow_methods=["GET", "POST"],
                               allow_headers=["*"], expose_headers=["x-should-retry", "retry-after"])],
        exception_handlers={HTTPException: not_found},
    )


class Api:
    """The handlers of the routes, over one engine worker."""

    def __init__(self, worker: EngineWorker, info: ServerInfo, key: bytes | None, loopback: bool, origins: str):
        self.worker, self.info, self.key, self.loopback, self.origins = worker, info, key, loopback, origins

    def authorize(self, request: Request) -> None:
        if self.loopback and not local_host(request.headers.get("host", "")):
            raise ApiError(400, "the Host header must name this machine (localhost, a loopback address, its host "
                                "name, or a *.internal or *.local name)",
                           code="invalid_host")
        if self.key is None:
            origin = request.headers.get("origin")
            if origin is not None and not re.fullmatch(self.origins, origin.strip().lower()):
                raise ApiError(403, f"a web page of another site ({origin}) may not use this server: only pages "
                                    "on this machine (localhost) and the origins --allow-origin names",
                               code="invalid_origin")
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.key):
            raise ApiError(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY' with the key "
                                "the server was started with (--api-key)", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})

    def endpoint(self, handler):
        """Auth, then the handler; every exception becomes an OpenAI-style error response."""
        async def endpoint(request: Request) -> Response:
            try:
                self.authorize(request)
                return await handler(request)
            except ApiError as e:
                return error_response(e)
            except ClientDisconnect:
                return Response(status_code=499)  # nobody is left to read it
            except Exception as e:  # noqa: BLE001
                log.debug("internal error", exc_info=True)
                self.worker.status.failure(f"internal error: {type(e).__name__}: {e}")
                return error_response(ApiError(500, f"internal error: {type(e).__name__}", type="server_error"))
        return endpoint

    def _model(self) -> dict:
        info = self.info
        return {"id": info.model, "object": "model", "created": info.created, "owned_by": "speclocal",
                "meta": {"n_ctx": info.n_ctx, "draft_model": info.has_draft, "mode": info.mode}}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model()]})

    async def model(self, request: Request) -> Response:
        """GET /v1/models/{id} (the openai client's models.retrieve): the model, under its id or an alias."""
        name = request.path_params["model"]
        if not name:  # /v1/models/
            return await self.models(request)
        if name != self.info.model and name not in self.info.aliases:
            raise ApiError(404, f"the model '{name}' does not exist here: this server runs '{self.info.model}'",
                           param="model", code="model_not_found")
        return JSONResponse(self._model())

    async def health(self, request: Request) -> Response:
        if self.loopback and not local_host(request.headers.get("host", "")):
            return error_response(ApiError(400, "the Host header must name this machine", code="invalid_host"))
        w = self.worker
        return JSONResponse({"status": "restarting" if w.restarting else "ok", "busy": w.busy, "waiting": w.waiting,
                             "queue_size": w.queue_size, "served": w.served, "crashes": w.crashes})

    async def chat(self, request: Request) -> Response:
        return await self.complete(request, parse_chat)

    async def completions(self, request: Request) -> Response:
        return await self.complete(request, parse_completion)

    async def complete(self, request: Request, parse) -> Response:
        parsed: Parsed = parse(parse_body(await read_body(request)), self.info)
        job = Job(parsed, asyncio.get_running_loop())
        self.submit(job)
        rid, created = new_id(parsed.kind), int(time.time())
        watcher = asyncio.create_task(cancel_on_disconnect(request, job))
        streaming = False
        try:
            kind, payload = await next_event(job, watcher)
            if kind == "rejected":
                raise prompt_error(payload, parsed, self.info.n_ctx)
            if kind == "crashed":
                raise crashed(payload)
            if kind == "error":
                raise failed(payload)
            if kind != "started":  # cancelled while waiting: its client left, or the server is shutting down
                raise shutting_down()
            if not parsed.stream:
                return JSONResponse(response(parsed, await finished(job), rid, created, self.info.model))
            streaming = True
        finally:
            watcher.cancel()  # a stream watches for the disconnect itself (StreamingResponse) from here on
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            if not streaming:
                job.cancel.set()  # whatever ended this request, nothing more is to be generated for it
        return EventStream(job, stream(job, Chunks(parsed, rid, created, self.info.model)))

    def submit(self, job: Job) -> None:
        """Queue the job, or refuse with a 503 and Retry-After when the queue is full."""
        try:
            self.worker.submit(job)
        except Busy:
            self.worker.status.refused()
            raise ApiError(503, f"the server is busy: one generation runs and {self.worker.queue_size} wait; "
                                "retry later", type="server_error", code="server_busy",
                           headers={"Retry-After": str(self.worker.retry_after())}) from None


def failed(message: str) -> ApiError:
    """A request that failed (not a crash): the same request would fail again, and the openai client retries a
    500 unless told not to."""
    return ApiError(500, f"generation failed: {message}", type="server_error", headers={"x-should-retry": "false"})


async def finished(job: Job):
    """The started job's result (its done event's payload); an error or a crash raises its ApiError."""
    while True:
        kind, payload = await job.events.get()
        if kind == "done":
            if payload.stop_reason == "cancelled":
                raise shutting_down()
            return payload
        if kind == "error":
            raise failed(payload)
        if kind == "crashed":
            raise crashed(payload)


async def stream(job: Job, chunks: Chunks):
    """The started job's events as server-sent event chunks, to its done, error or crash."""
    try:
        if start := chunks.start():
            yield start
        while True:
            kind, payload = await job.events.get()
            if kind == "step":
                yield chunks.tokens(payload.pieces)
            elif kind == "done":
                yield chunks.error(shutting_down()) if payload.stop_reason == "cancelled" else chunks.finish(payload)
                return
            elif kind == "error":
                yield chunks.error(failed(payload))
                return
            elif kind == "crashed":
                yield chunks.error(crashed(payload))
                return
    finally:
        job.cancel.set()  # finished, or the client is gone (the send failed / it disconnected): stop now


async def not_found(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        return error_response(ApiError(404, f"no such endpoint: {request.method} {request.url.path}",
                                       code="not_found"))
    if exc.status_code == 405:
        return error_response(ApiError(405, f"{request.method} is not allowed on {request.url.path}",
                                       code="method_not_allowed"))
    return error_response(ApiError(exc.status_code, str(exc.detail)))


async def read_body(request: Request) -> bytes:
    """The request body, refused with a 413 past MAX_BODY (before reading it all)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise ApiError(413, f"the request body is over {MAX_BODY // 2**20} MiB", code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise ApiError(413, f"the request body is over {MAX_BODY // 2**20} MiB", code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


async def cancel_on_disconnect(request: Request, job: Job) -> None:
    """Set the job's cancel Event when the client disconnects (the body has been read: the next ASGI message
    is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel.set()
            return


async def next_event(job: Job, watcher: asyncio.Task) -> tuple[str, object]:
    """The job's next event, or ("cancelled", None) as soon as its client is gone."""
    getter = asyncio.ensure_future(job.events.get())
    done, _ = await asyncio.wait({getter, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if getter in done:
        return getter.result()
    getter.cancel()
    return "cancelled", None
