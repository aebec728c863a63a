"""`speclocal serve`: the OpenAI-compatible endpoint.

Without models: the wire format (every malformed field a 4xx naming its parameter, stop strings never streamed),
the address/key rules, and the queue, cancellation and shutdown against a fake engine behind a real uvicorn on
loopback. With models: a real `speclocal serve` process on loopback driven by the official `openai` client:
the text equals `speclocal run`'s, timings add up, auto decides per request, load and faults (concurrent
streams, killed clients, malformed requests, RSS over 200 requests), the API key, and SIGTERM / Ctrl-C.
Every server and client here is bounded by timeouts and stops itself.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from speclocal import options
from speclocal.cli import main
from speclocal.engine.types import GenerationRequest, GenerationResult, MemoryParts, StepEvent
from speclocal.errors import SpeclocalError
from speclocal.serve.protocol import (ApiError, Chunks, ServerInfo, StreamText, parse_body, parse_chat,
                                      parse_completion, timings)

APP = str(Path(__file__).resolve().parents[1] / "app")
INFO = ServerInfo(model="fake", aliases=frozenset({"fake.gguf"}), n_ctx=256, has_draft=True, mode="auto",
                  settings=options.Settings(), n_predict=None)


# ---- the wire format (no server) -----------------------------------------------------------------------
def _chat(**kw) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], **kw}


@pytest.mark.parametrize("body, status, param", [
    (_chat(max_tokens=0), 400, "max_tokens"),
    (_chat(max_tokens="ten"), 400, "max_tokens"),
    (_chat(max_tokens=True), 400, "max_tokens"),
    (_chat(temperature=-1), 400, "temperature"),
    (_chat(top_p=0), 400, "top_p"),
    (_chat(seed=-5), 400, "seed"),
    (_chat(model="gpt-4"), 404, "model"),
    (_chat(stream="yes"), 400, "stream"),
    (_chat(stop=5), 400, "stop"),
    (_chat(n=2), 400, "n"),
    (_chat(speclocal={"mode": "turbo"}), 400, "speclocal.mode"),
    (_chat(mode="turbo"), 400, "mode"),
    (_chat(speclocal={"draft_max": 0}), 400, "speclocal.draft_max"),
    (_chat(**{"speculative.n_max": 1000}), 400, "speculative.n_max"),
    (_chat(speclocal={"colour": 1}), 400, "speclocal.colour"),
    (_chat(speclocal={"task": "poetry"}), 400, "speclocal.task"),
    (_chat(stream_options=1), 400, "stream_options"),
    ({"messages": "hi"}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 3}]}, 400, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400,
     "messages[0].content[0]"),
])
def test_a_bad_chat_field_is_a_4xx_naming_it(body, status, param):
    with pytest.raises(ApiError) as e:
        parse_chat(body, INFO)
    assert e.value.status == status and e.value.param == param
    assert set(e.value.body()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("body, param", [
    ({}, "prompt"), ({"prompt": 3}, "prompt"), ({"prompt": [1, 2, 3]}, "prompt"), ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": "x", "echo": True}, "echo"), ({"prompt": "x", "max_tokens": -3}, "max_tokens"),
])
def test_a_bad_completion_field_is_a_400_naming_it(body, param):
    with pytest.raises(ApiError) as e:
        parse_completion(body, INFO)
    assert e.value.status == 400 and e.value.param == param


@pytest.mark.parametrize("raw", [b"", b"{bad", b"[1, 2]", b'{"temperature": NaN}', b"\xff\xfe", b"[" * 100_000])
def test_a_body_that_is_not_a_json_object_is_a_400(raw):
    with pytest.raises(ApiError) as e:
        parse_body(raw)
    assert e.value.status == 400 and e.value.code == "invalid_json"


def test_requests_map_onto_the_engine_with_extensions_and_llama_server_names():
    p = parse_chat(_chat(max_tokens=7, temperature=0.5, top_p=0.9, seed=3, stop=["\n\n"], stream=True,
                         stream_options={"include_usage": True}, speclocal={"mode": "lookup", "draft_max": 8},
                         top_k=5, min_p=0.1, **{"speculative.n_min": 2}), INFO)
    r = p.req
    assert (r.mode, r.n_predict, r.stop, r.draft.max, r.draft.min) == ("lookup", 7, ("\n\n",), 8, 2)
    assert (r.sampling.temp, r.sampling.top_p, r.sampling.seed, r.sampling.top_k, r.sampling.min_p) == \
        (0.5, 0.9, 3, 5, 0.1)
    assert p.stream and p.include_usage and p.mode_source == "request"
    d = parse_chat({"messages": [{"role": "developer", "content": [{"type": "text", "text": "be "},
                                                                   {"type": "text", "text": "brief"}]},
                                 {"role": "user", "content": "hi"}], "model": "fake.gguf"}, INFO)
    assert d.req.messages[0] == {"role": "system", "content": "be brief"}
    assert d.req.mode == "auto" and d.mode_source == "server"
    assert d.req.n_predict == INFO.n_ctx  # no max_tokens: until the model stops or the context is full
    c = parse_completion({"prompt": ["def f():"], "mode": "spec", "n_predict": 5}, INFO)
    assert c.req.prompt == "def f():" and c.req.messages is None and c.req.n_predict == 5 and c.task == "code"


@pytest.mark.parametrize("stops, pieces", [
    (("END",), ["a", "b", "E", "N", "D", "c"]),
    (("END",), ["ab", "EN", "x", "E", "ND"]),
    (("\n\n", "###"), ["x", "\n", "y", "#", "#", "z", "\n", "\n", "w"]),
    ((), ["a", "", "b"]),
])
def test_streamed_text_never_passes_a_stop_string_and_adds_up_to_the_final_text(stops, pieces):
    full = "".join(pieces)
    cut = min([i for i in (full.find(s) for s in stops) if i >= 0], default=len(full))
    st = StreamText(stops)
    streamed = "".join(st.add(p) for p in pieces)
    assert full[:cut].startswith(streamed)
    assert streamed + st.finish(full[:cut]) == full[:cut]


def _result(text="", tokens=(), mode="spec", stop_reason="length", drafted=4, accepted=3, **kw) -> GenerationResult:
    n = len(tokens)
    fields = dict(mode=mode, text=text, tokens=list(tokens), from_draft=[False] * n, stop_reason=stop_reason,
                  n_prompt=10, n_prompt_cached=4, t_prompt=0.1, ttft=0.2, n_generated=n, t_decode=0.5,
                  decode_tps=n / 0.5, n_drafted=drafted, n_accepted=accepted,
                  acceptance=accepted / drafted if drafted else None, n_passes=max(1, n - accepted),
                  tokens_per_pass=1.5, t_draft=0.1, t_verify=0.3, t_sample=0.01, draft_share=0.2, peak_rss=1,
                  memory=MemoryParts(1, 1, 1, 1))
    fields.update(kw)
    return GenerationResult(**fields)


def test_a_stream_has_one_chunk_per_token_then_usage_timings_and_done():
    p = parse_chat(_chat(stream=True, stream_options={"include_usage": True}), INFO)
    ch = Chunks(p, "chatcmpl-1", 0, "fake")
    data = ch.start() + ch.tokens(["He", "llo"]) + ch.tokens([" wor", "ld"]) + \
        ch.finish(_result("Hello world", [1, 2, 3, 4]))
    events = [e[len("data: "):] for e in data.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    tokens = chunks[1:5]
    assert "".join(c["choices"][0]["delta"]["content"] for c in tokens) == "Hello world"
    final, usage_only = chunks[5], chunks[6]
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["timings"]["predicted_n"] == 4 == len(tokens) and final["timings"]["draft_n_accepted"] == 3
    assert final["timings"]["prompt_n"] == 6 and final["timings"]["cache_n"] == 4
    assert usage_only["choices"] == [] and usage_only["usage"]["completion_tokens"] == 4
    assert {c["id"] for c in chunks} == {"chatcmpl-1"}


def test_timings_are_llama_servers():
    t = timings(_result("x", [1, 2, 3, 4, 5], drafted=6, accepted=2))
    assert t["predicted_n"] == 5 and t["predicted_per_second"] == pytest.approx(10.0)
    assert t["draft_n"] == 6 >= t["draft_n_accepted"] == 2
    assert t["predicted_ms"] == pytest.approx(500.0) and t["prompt_ms"] == pytest.approx(100.0)


# ---- address and key rules (the CLI, no model is loaded) -----------------------------------------------
def test_a_non_loopback_address_without_a_key_is_refused_before_loading(capsys):
    rc = main(["serve", "--host", "0.0.0.0", "-m", "no/such/model.gguf"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "not a loopback address" in err and "--api-key" in err


def test_a_port_in_use_is_one_clean_line(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        rc = main(["serve", "--port", str(s.getsockname()[1]), "-m", "no/such/model.gguf"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "cannot listen on 127.0.0.1" in err


def test_a_bad_key_file_is_one_clean_line(capsys, tmp_path):
    (tmp_path / "key").write_text("\n")
    rc = main(["serve", "--api-key-file", str(tmp_path / "key"), "-m", "no/such/model.gguf"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "is empty" in err


# ---- queue, cancellation and shutdown: a fake engine behind a real uvicorn on loopback ----------------
class FakeEngine:
    """Steps of `step_s` seconds producing the words w0 w1 ...; records when each step started."""

    def __init__(self, step_s: float = 0.05):
        self.step_s = step_s
        self.step_times: list[float] = []
        self.thread_ids: set[int] = set()
        self.closed = False

    def prompt_tokens(self, req: GenerationRequest) -> list[int]:
        self.thread_ids.add(threading.get_ident())
        text = req.prompt if req.prompt is not None else req.last_user_text
        if len(text) > 200:
            raise SpeclocalError(f"prompt is {len(text)} tokens, context is 256: shorten it or raise -c/--ctx-size")
        return list(range(len(text) + 1))

    def generate(self, req, on_step=None, cancel=None) -> GenerationResult:
        self.thread_ids.add(threading.get_ident())
        tokens, text, reason = [], "", "length"
        for i in range(req.n_predict):
            if cancel is not None and cancel.is_set():
                reason = "cancelled"
                break
            self.step_times.append(time.monotonic())
            time.sleep(self.step_s)
            tokens.append(i)
            text += f"w{i} "
            if on_step:
                on_step(StepEvent([i], [f"w{i} "], [False], 0, 0, 0.0, self.step_s, 0.0, len(tokens), 0.0))
        return _result(text, tokens, mode=req.mode, stop_reason=reason, drafted=0, accepted=0)

    def reset(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeServer:
    def __init__(self, engine: FakeEngine, queue_size: int = 2):
        import uvicorn

        from speclocal.serve.app import build_app
        from speclocal.serve.status import StatusLog
        from speclocal.serve.worker import EngineWorker

        self.engine = engine
        self.status = StatusLog(out=open(os.devnull, "w"))
        self.worker = EngineWorker(lambda: engine, queue_size, self.status)
        self.worker.start()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(build_app(self.worker, INFO), log_config=None, lifespan="off"))
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])))
        self.thread.start()
        assert _wait_for(lambda: _health(self.url) is not None, 10)

    def close(self) -> None:
        self.worker.cancel_all()
        self.server.should_exit = True
        self.thread.join(10)
        self.worker.stop()
        self.sock.close()


def _health(url: str) -> dict | None:
    try:
        return httpx.get(url + "/health", timeout=2).json()
    except httpx.HTTPError:
        return None


def _wait_for(predicate, timeout: float, poll: float = 0.02) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(poll)
    return False


@pytest.fixture
def fake():
    server = FakeServer(FakeEngine())
    yield server
    server.close()
    assert server.engine.closed


def _stream_words(url: str, n: int, **kw):
    return httpx.stream("POST", url + "/v1/completions", json={"prompt": "x", "max_tokens": n, "stream": True, **kw},
                        timeout=10)


def test_past_the_queue_requests_get_503_with_retry_after_and_the_rest_are_served(fake):
    """Queue 2: one generating + two waiting; the fourth and fifth are refused at once."""
    with ThreadPoolExecutor(5) as pool:
        futures = []
        for _ in range(5):
            futures.append(pool.submit(httpx.post, fake.url + "/v1/completions",
                                       json={"prompt": "x", "max_tokens": 6}, timeout=20))
            time.sleep(0.05)  # in order: the first three are admitted before the rest arrive
        answers = [f.result() for f in futures]
    assert [a.status_code for a in answers] == [200, 200, 200, 503, 503]
    assert all(a.json()["choices"][0]["text"] == "w0 w1 w2 w3 w4 w5 " for a in answers[:3])
    for a in answers[3:]:
        assert int(a.headers["retry-after"]) >= 1 and a.json()["error"]["code"] == "server_busy"
    assert len(fake.engine.thread_ids) == 1 and threading.get_ident() not in fake.engine.thread_ids
    assert fake.status.refused_busy == 2


def test_a_client_that_disconnects_mid_stream_cancels_within_one_step(fake):
    with _stream_words(fake.url, 1000) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any("w2" in line for line in got)
        t_close = time.monotonic()
    assert _wait_for(lambda: not _health(fake.url)["busy"], 2.0)
    later = [t for t in fake.engine.step_times if t > t_close]
    assert len(later) <= 2  # the step under way when it left, and at most one the disconnect raced
    assert len(fake.engine.step_times) < 20
    answer = httpx.post(fake.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
    assert answer.json()["choices"][0]["text"] == "w0 w1 "


def test_a_client_that_leaves_while_waiting_is_skipped(fake):
    with _stream_words(fake.url, 30) as first:
        lines = first.iter_lines()
        next(lines)
        with pytest.raises(httpx.ReadTimeout):  # waits behind the first, gives up
            httpx.post(fake.url + "/v1/completions", json={"prompt": "x", "max_tokens": 500}, timeout=0.3)
        time.sleep(0.1)
    assert _wait_for(lambda: not _health(fake.url)["busy"], 3.0)
    assert len(fake.engine.step_times) < 40  # the abandoned 500-token job never ran


def test_a_prompt_over_the_context_is_a_400_before_any_stream_starts(fake):
    r = httpx.post(fake.url + "/v1/completions", json={"prompt": "x" * 300, "stream": True}, timeout=10)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_shutdown_ends_running_streams_with_an_error_event(fake):
    with _stream_words(fake.url, 1000) as r:
        lines = r.iter_lines()
        next(lines)
        fake.worker.cancel_all()
        rest = [line for line in lines if line]
    assert '"shutting_down"' in rest[-2] and rest[-1] == "data: [DONE]"


def test_an_unknown_path_and_a_wrong_method_are_json_errors(fake):
    for r, status in ((httpx.get(fake.url + "/v1/nope"), 404), (httpx.get(fake.url + "/v1/chat/completions"), 405)):
        assert r.status_code == status and "message" in r.json()["error"]
