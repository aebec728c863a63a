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
from polling import wait_for

from speclocal import options
from speclocal.cli import main
from speclocal.engine.types import GenerationRequest, GenerationResult, MemoryParts, StepEvent
from speclocal.errors import SpeclocalError
from speclocal.serve.protocol import (ApiError, Chunks, ServerInfo, StreamText, parse_body, parse_chat,
                                      parse_completion, response, timings)

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
    # what the server cannot do is refused, not answered as plain text as if it had been done
    (_chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]), 400, "tools"),
    (_chat(tool_choice="required"), 400, "tool_choice"),
    (_chat(response_format={"type": "json_object"}), 400, "response_format"),
    (_chat(logprobs=True, top_logprobs=2), 400, "logprobs"),
    (_chat(logit_bias={"1": -100}), 400, "logit_bias"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, 400,
     "messages[1].tool_calls"),
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


def test_what_clients_send_by_default_for_features_they_do_not_use_is_accepted():
    defaults = dict(tools=[], tool_choice="auto", response_format={"type": "text"}, logprobs=False, logit_bias={},
                    top_logprobs=0, parallel_tool_calls=True, frequency_penalty=0, presence_penalty=0, user="u")
    assert parse_chat(_chat(**defaults), INFO).req.messages[-1]["content"] == "hi"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]  # given, not to be called
    assert parse_chat(_chat(tools=tools, tool_choice="none", response_format={"type": "text", "x": 1}), INFO)
    assert parse_chat(_chat(logprobs=None, top_logprobs=None, tool_choice=None, response_format=None), INFO)
    assert parse_completion({"prompt": "x", "logprobs": None, "tools": None}, INFO).req.prompt == "x"


@pytest.mark.parametrize("raw", [b"", b"{bad", b"[1, 2]", b'{"temperature": NaN}', b"\xff\xfe", b"[" * 100_000])
def test_a_body_that_is_not_a_json_object_is_a_400(raw):
    with pytest.raises(ApiError) as e:
        parse_body(raw)
    assert e.value.status == 400 and e.value.code == "invalid_json"


def test_spec_on_a_server_without_a_draft_model_is_a_400_and_auto_is_fine():
    from dataclasses import replace

    no_draft = replace(INFO, has_draft=False)
    with pytest.raises(ApiError) as e:
        parse_chat(_chat(speclocal={"mode": "spec"}), no_draft)
    assert e.value.status == 400 and e.value.param == "speclocal.mode" and "draft model" in e.value.message
    assert parse_chat(_chat(speclocal={"mode": "auto"}), no_draft).req.mode == "auto"


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


def test_a_stream_sends_the_engines_pieces_then_what_the_final_text_adds():
    """The engine's pieces never pass a stop string (tests/test_engine.py); the stream relays them and, at the
    end, whatever of the final text they did not carry (a character the last token completed)."""
    st = StreamText()
    assert "".join(st.add(p) for p in ["ab", "", "c"]) == "abc"
    assert st.finish("abc€") == "€" and StreamText().finish("xyz") == "xyz"
    st.add("ab")
    assert st.finish("a") == ""  # never more than the final text


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
    assert final["usage"] is None  # usage once (clients that sum the chunks' would count it twice)
    assert final["timings"]["predicted_n"] == 4 == len(tokens) and final["timings"]["draft_n_accepted"] == 3
    assert final["timings"]["prompt_n"] == 6 and final["timings"]["cache_n"] == 4
    assert usage_only["choices"] == [] and usage_only["usage"]["completion_tokens"] == 4
    assert {c["id"] for c in chunks} == {"chatcmpl-1"}


def test_auto_without_a_draft_model_answers_strict_json():
    """Non-finite numbers in auto's explanation go out as null: JSON has no Infinity or NaN."""
    auto = {"task": "chat", "decisions": {"plain": 3}, "draft_cost": float("inf"), "sentence": "s.",
            "break_even_k4": {"model": None, "lookup": float("nan")}}
    p = parse_chat(_chat(stream=True), INFO)
    body = response(p, _result("x", [1], mode="auto", auto=auto), "chatcmpl-1", 0, "fake")
    assert json.loads(json.dumps(body, allow_nan=False))["speclocal"]["auto"]["draft_cost"] is None
    final = Chunks(p, "chatcmpl-1", 0, "fake").finish(_result("x", [1], mode="auto", auto=auto))
    assert b"Infinity" not in final and b"NaN" not in final


def test_timings_are_llama_servers():
    t = timings(_result("x", [1, 2, 3, 4, 5], drafted=6, accepted=2))
    assert t["predicted_n"] == 5 and t["predicted_per_second"] == pytest.approx(10.0)
    assert t["draft_n"] == 6 >= t["draft_n_accepted"] == 2
    assert t["predicted_ms"] == pytest.approx(500.0) and t["prompt_ms"] == pytest.approx(100.0)
    assert t["total_ms"] == pytest.approx(600.0) and t["draft_prompt_n"] == 0 and t["draft_prompt_ms"] == 0.0
    t = timings(_result("x", [1], draft_prompt_tokens=5, t_draft_prompt=0.04))  # what the draft model's prompt cost
    assert t["draft_prompt_n"] == 5 and t["draft_prompt_ms"] == pytest.approx(40.0)


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
        if text == "fail to tokenize":
            raise ValueError("cannot tokenize")
        return list(range(len(text) + 1))

    def generate(self, req, on_step=None, cancel=None) -> GenerationResult:
        self.thread_ids.add(threading.get_ident())
        if (req.prompt or req.last_user_text) == "fail to generate":
            raise RuntimeError("cannot generate")
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
                on_step(StepEvent(tokens=[i], pieces=[f"w{i} "], from_draft=[False], drafted=0, accepted=0, t_draft=0.0,
                                  t_verify=self.step_s, t_sample=0.0, n_generated=len(tokens), elapsed=0.0))
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
        assert wait_for(lambda: _health(self.url) is not None, 10)

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


def _fake(step_s: float):
    server = FakeServer(FakeEngine(step_s))
    yield server
    server.close()
    assert server.engine.closed


@pytest.fixture
def fake():
    """A fake engine of 0.1 s steps behind a real server on loopback, queue 2."""
    yield from _fake(0.1)


@pytest.fixture
def slow_fake():
    """The same with 0.2 s steps."""
    yield from _fake(0.2)


def _stream_words(url: str, n: int, **kw):
    return httpx.stream("POST", url + "/v1/completions", json={"prompt": "x", "max_tokens": n, "stream": True, **kw},
                        timeout=10)


def test_past_the_queue_requests_get_503_with_retry_after_and_the_rest_are_served(slow_fake):
    """Queue 2: one generating (1.2 s) + two waiting; the fourth and fifth are refused at once."""
    with ThreadPoolExecutor(5) as pool:
        futures = []
        for _ in range(5):
            futures.append(pool.submit(httpx.post, slow_fake.url + "/v1/completions",
                                       json={"prompt": "x", "max_tokens": 6}, timeout=30))
            time.sleep(0.15)  # in order: the first three are admitted before the rest arrive
        answers = [f.result() for f in futures]
    assert [a.status_code for a in answers] == [200, 200, 200, 503, 503]
    assert all(a.json()["choices"][0]["text"] == "w0 w1 w2 w3 w4 w5 " for a in answers[:3])
    for a in answers[3:]:
        assert int(a.headers["retry-after"]) >= 1 and a.json()["error"]["code"] == "server_busy"
    assert len(slow_fake.engine.thread_ids) == 1 and threading.get_ident() not in slow_fake.engine.thread_ids
    assert slow_fake.status.refused_busy == 2


def test_a_client_that_disconnects_mid_stream_cancels_within_one_step(fake):
    with _stream_words(fake.url, 1000) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any("w2" in line for line in got)
        t_close = time.monotonic()
    assert wait_for(lambda: not _health(fake.url)["busy"], 2.0)
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
    assert wait_for(lambda: not _health(fake.url)["busy"], 5.0)
    assert len(fake.engine.step_times) < 40  # the abandoned 500-token job never ran


def test_a_prompt_over_the_context_is_a_400_before_any_stream_starts(fake):
    r = httpx.post(fake.url + "/v1/completions", json={"prompt": "x" * 300, "stream": True}, timeout=10)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["code"] == "context_length_exceeded" and r.json()["error"]["param"] == "prompt"


def test_shutdown_ends_running_streams_with_an_error_event(fake):
    with _stream_words(fake.url, 1000) as r:
        lines = r.iter_lines()
        next(lines)
        fake.worker.cancel_all()
        rest = [line for line in lines if line]
    assert '"shutting_down"' in rest[-2] and rest[-1] == "data: [DONE]"


@pytest.mark.parametrize("host, ok", [("127.0.0.1:8080", True), ("localhost", True), ("[::1]:80", True),
                                      ("127.0.0.2", True), ("app.localhost:1", True), ("evil.example:8080", False),
                                      ("host.docker.internal:8080", True), ("box.local", True),
                                      (socket.gethostname() + ":8080", True), ("internal.example.com", False),
                                      ("10.0.0.1", False), ("", False), ("[::1", False)])
def test_a_loopback_server_answers_only_requests_that_name_this_machine(host, ok):
    """A web page cannot reach the loopback server by DNS rebinding: its requests carry the attacker's name."""
    from speclocal.serve.app import local_host

    assert local_host(host) is ok


def test_a_foreign_host_header_is_refused(fake):
    for path in ("/health", "/v1/models"):
        r = httpx.get(fake.url + path, headers={"Host": "rebound.example.com"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"
    assert httpx.get(fake.url + "/v1/models").status_code == 200


def test_a_model_is_found_by_its_id_and_the_routes_answer_without_v1_too(fake):
    """The openai client's models.retrieve, and a base URL given without /v1 (as llama-server answers both)."""
    model = httpx.get(fake.url + "/v1/models").json()["data"][0]
    assert httpx.get(fake.url + f"/v1/models/{model['id']}").json() == model
    r = httpx.get(fake.url + "/v1/models/gpt-4")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert httpx.get(fake.url + "/models").json()["data"] == [model] == httpx.get(fake.url + "/v1/models/").json()["data"]
    r = httpx.post(fake.url + "/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_pages_on_this_machine_may_call_it_from_a_browser_and_other_sites_may_not(fake):
    """CORS for a chat UI at localhost (its preflight answered); a page of another site cannot make the server
    generate (a no-cors POST needs no preflight, but carries its Origin)."""
    pre = httpx.options(fake.url + "/v1/chat/completions", headers={
        "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://localhost:3000"
    body = {"prompt": "x", "max_tokens": 2}
    r = httpx.post(fake.url + "/v1/completions", json=body, headers={"Origin": "http://localhost:3000"}, timeout=10)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
    r = httpx.post(fake.url + "/v1/completions", content=json.dumps(body), timeout=10,
                   headers={"Origin": "https://evil.example", "Content-Type": "text/plain"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "invalid_origin"
    assert "access-control-allow-origin" not in r.headers
    assert httpx.post(fake.url + "/v1/completions", json=body, timeout=10).status_code == 200  # no Origin: a client


def test_a_request_that_fails_is_answered_not_retried_and_the_server_goes_on(fake):
    """An exception tokenizing or generating (not a crash) is a 500 the openai client does not retry, and the
    next request is served (a failure while tokenizing used to end the worker thread: every request hung)."""
    client = openai.OpenAI(base_url=fake.url + "/v1", api_key="none", max_retries=2)
    for prompt in ("fail to tokenize", "fail to generate"):
        with pytest.raises(openai.InternalServerError) as e:
            client.completions.create(model="fake", prompt=prompt, max_tokens=2)
        assert e.value.response.headers["x-should-retry"] == "false" and prompt.split()[-1] in e.value.message
    assert client.completions.create(model="fake", prompt="x", max_tokens=2).usage.completion_tokens == 2
    assert httpx.get(fake.url + "/health").json()["served"] == 1 and fake.status.failed == 2  # not retried


@pytest.mark.parametrize("origin, allowed, ok", [
    ("http://localhost:3000", (), True), ("http://127.0.0.1:8080", (), True), ("vscode-webview://abc123", (), True),
    ("https://evil.example", (), False), ("null", (), False), ("http://localhost.evil.example", (), False),
    ("https://chat.example.com", ("https://chat.example.com/",), True), ("chrome-extension://abc", ("*",), True),
])
def test_which_web_pages_may_use_the_server(origin, allowed, ok):
    from speclocal.serve.app import origin_pattern

    assert bool(re.fullmatch(origin_pattern(allowed), origin)) is ok


def test_an_error_quoting_a_lone_surrogate_is_still_json(fake):
    r = httpx.post(fake.url + "/v1/completions", content=json.dumps({"prompt": "x", "model": "m\ud83d"}),
                   headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_an_unknown_path_and_a_wrong_method_are_json_errors(fake):
    for r, status in ((httpx.get(fake.url + "/v1/nope"), 404), (httpx.get(fake.url + "/v1/chat/completions"), 405)):
        assert r.status_code == status and "message" in r.json()["error"]


# ---- a real `speclocal serve` process on loopback ------------------------------------------------------
class ServeProcess:
    """`speclocal serve --port 0 ARGS` in a child process; its stderr collected line by line."""

    def __init__(self, args: list[str], dirs: dict[str, Path], timeout: float = 240):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([APP, os.environ.get("PYTHONPATH", "")]),
               "SPECLOCAL_CACHE_DIR": str(dirs["cache"]), "SPECLOCAL_CONFIG_DIR": str(dirs["config"]),
               "SPECLOCAL_LOG_DIR": str(dirs["logs"])}
        self.proc = subprocess.Popen([sys.executable, "-m", "speclocal.cli", "serve", "--port", "0", *args],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env=env)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        url = None

        def started() -> bool:
            nonlocal url
            m = next((re.search(r" at (http://\S+)/v1 ", line) for line in self.lines if " at http://" in line), None)
            url = m.group(1) if m else None
            return url is not None or self.proc.poll() is not None

        assert wait_for(started, timeout, 0.1), "server did not start:\n" + self.stderr
        assert url is not None, "server exited:\n" + self.stderr
        self.url = url

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    def status_lines(self) -> list[str]:
        return [line for line in self.lines if re.match(r"speclocal: #\d+ ", line)]

    def client(self, api_key: str = "none", **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120, **kw)

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


@pytest.fixture(scope="module")
def serve_dirs(tmp_path_factory, _session_cache) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve")
    return {"cache": _session_cache, "config": root / "config", "logs": root / "logs"}


@pytest.fixture(scope="module")
def smol(smollm2, serve_dirs):
    """SmolLM2 drafting for itself (fast; every mode works), the draft model by default, four may wait; one
    thread (a 135M model needs no more, and on a shared 2-core machine one thread never waits at a barrier
    for a descheduled partner)."""
    server = ServeProcess(["-m", str(smollm2), "-md", str(smollm2), "-c", "1024", "-t", "1", "--mode", "spec",
                           "--queue", "4"], serve_dirs)
    yield server
    server.stop(signal.SIGKILL if server.proc.poll() is None else signal.SIGTERM)


COPY = "Copy the code.\nCode: 1234\nCopy: 1234\nCode: 9876\nCopy: 9876\nCode: {code}\nCopy:"


def _run_json(capsys, args: list[str]) -> dict:
    rc = main(["run", *args, "--json"])
    out = capsys.readouterr().out
    assert rc == 0
    return json.loads(out)["runs"][0]


def _extra(obj, name: str):
    return (obj.model_extra or {}).get(name)


def test_answers_equal_speclocal_run_streaming_or_not_chat_or_completion(smol, smollm2, capsys):
    common = ["--mode", "spec", "-m", str(smollm2), "-md", str(smollm2), "-n", "24", "-c", "1024", "-t", "1"]
    chat_prompt, raw_prompt = "Name three colours of the rainbow.", "def fibonacci(n):"
    want_chat = _run_json(capsys, [chat_prompt, *common])
    want_raw = _run_json(capsys, [raw_prompt, "--raw", *common])
    c = smol.client()
    messages = [{"role": "user", "content": chat_prompt}]
    for stream in (False, True):
        if stream:
            chunks = list(c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=messages,
                                                    max_tokens=24, temperature=0, stream=True))
            tokens = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason is None
                      and ch.choices[0].delta.role is None]
            text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            final = chunks[-1]
            t, usage = _extra(final, "timings"), final.usage
            assert t["predicted_n"] == len(tokens) == usage.completion_tokens  # one chunk per token
            assert final.choices[0].finish_reason in ("stop", "length")
            assert len({ch.id for ch in chunks}) == 1
        else:
            r = c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=messages, max_tokens=24,
                                          temperature=0)
            text, t, usage = r.choices[0].message.content, _extra(r, "timings"), r.usage
            assert _extra(r, "speclocal")["mode"] == "spec" and _extra(r, "speclocal")["drafter"] == "spec"
        assert text == want_chat["text"], f"stream={stream}"
        assert t["predicted_n"] == want_chat["n_generated"] == usage.completion_tokens
        assert t["draft_n"] >= t["draft_n_accepted"] and t["draft_n"] > 0
        assert t["predicted_per_second"] > 0 and t["prompt_n"] + t["cache_n"] == usage.prompt_tokens
    # the conversation continues: its history is already in both KV caches (longest common prefix)
    follow = c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", max_tokens=4, temperature=0, messages=[
        *messages, {"role": "assistant", "content": want_chat["text"]}, {"role": "user", "content": "And two more?"}])
    assert _extra(follow, "timings")["cache_n"] >= usage.prompt_tokens
    assert follow.usage.prompt_tokens_details.cached_tokens == _extra(follow, "timings")["cache_n"]
    for stream in (False, True):
        if stream:
            chunks = list(c.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=raw_prompt, max_tokens=24,
                                               temperature=0, stream=True, stream_options={"include_usage": True}))
            assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == want_raw["n_generated"]
            text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
            tokens = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason is None]
            t = _extra(chunks[-2], "timings")
            assert t["predicted_n"] == len(tokens)
        else:
            r = c.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=raw_prompt, max_tokens=24,
                                     temperature=0, extra_body={"speclocal": {"mode": "plain"}})
            text, t = r.choices[0].text, _extra(r, "timings")
            assert _extra(r, "speclocal")["mode"] == "plain" and t["draft_n"] == 0
        assert text == want_raw["text"], f"stream={stream}"
        assert t["draft_n"] >= t["draft_n_accepted"]
    lines = smol.status_lines()
    assert len(lines) >= 4 and all("tokens" in x and "t/s" in x and "acceptance" in x for x in lines[-4:])


def test_8_concurrent_streaming_clients_get_their_own_answers_or_503(smol):
    c = smol.client()
    codes = {(i, j): f"{(i * 5 + j) * 173 % 9000 + 1000}" for i in range(8) for j in range(5)}
    assert len(set(codes.values())) == 40

    def client(i: int) -> list[tuple[str, str, object]]:
        out = []
        for j in range(5):
            code = codes[i, j]
            try:
                chunks = list(c.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=COPY.format(code=code),
                                                   max_tokens=6, temperature=0, stream=True))
            except openai.APIStatusError as e:
                out.append((code, "refused", e))
                continue
            out.append((code, "answered", chunks))
        return out

    with ThreadPoolExecutor(8) as pool:
        results = [r for rs in pool.map(client, range(8)) for r in rs]
    assert len(results) == 40  # none lost
    answered = [(code, chunks) for code, how, chunks in results if how == "answered"]
    refused = [e for _, how, e in results if how == "refused"]
    assert all(e.status_code == 503 and int(e.response.headers["retry-after"]) >= 1 for e in refused)
    assert len(answered) >= 8
    others = set(codes.values())
    for code, chunks in answered:
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        assert text.strip().startswith(code), (code, text)  # its own prompt's answer ...
        assert not any(o in text for o in others - {code})  # ... and nobody else's
        assert len({ch.id for ch in chunks}) == 1
        assert _extra(chunks[-1], "timings")["predicted_n"] == len(chunks) - 1
    assert _health(smol.url)["status"] == "ok"


KILLED_CLIENT = """
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key="none", max_retries=0)
for i, chunk in enumerate(c.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="1, 2, 3, 4, 5,",
                                               max_tokens=900, temperature=0, stream=True)):
    if i == 3:
        print("streaming", flush=True)
"""


def test_killed_clients_stop_their_generation_within_a_step_and_the_next_is_served(smol):
    before = len(smol.status_lines())
    for how in ("kill", "close"):
        if how == "kill":  # a client process killed mid-stream
            client = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, smol.url + "/v1"], stdout=subprocess.PIPE,
                                      text=True)
            assert client.stdout.readline().strip() == "streaming"
            assert _health(smol.url)["busy"]
            client.kill()
            client.wait(10)
        else:  # a client that closes its stream
            with _stream_words(smol.url, 900, prompt="1, 2, 3, 4, 5,", temperature=0) as r:
                lines = r.iter_lines()
                for _ in range(8):
                    next(lines)
                assert _health(smol.url)["busy"]
        t_gone = time.monotonic()
        assert wait_for(lambda: not _health(smol.url)["busy"], 3.0), smol.stderr
        print(f"{how}: generation stopped {time.monotonic() - t_gone:.3f} s after the client left")
        assert wait_for(lambda: len(smol.status_lines()) > before, 3.0)
        line = smol.status_lines()[-1]
        assert "(cancelled)" in line, line
        assert int(re.search(r"; (\d+) tokens", line).group(1)) < 900
        before = len(smol.status_lines())
        r = smol.client().completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=COPY.format(code="4242"),
                                             max_tokens=6, temperature=0)
        assert r.choices[0].text.strip().startswith("4242")
        before += 1


def test_malformed_requests_are_4xx_json_and_the_server_keeps_serving(smol):
    url = smol.url
    chat = {"model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": "hi"}]}
    cases = [
        ("POST", "/v1/chat/completions", b"{bad json", 400),
        ("POST", "/v1/chat/completions", b"[1, 2, 3]", 400),
        ("POST", "/v1/chat/completions", b"", 400),
        ("POST", "/v1/chat/completions", b"\xff\xfe\x00", 400),
        ("POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400),
        ("POST", "/v1/chat/completions", b"[" * 50_000, 400),
        ("POST", "/v1/chat/completions", {"model": "SmolLM2-135M-Instruct.Q4_1"}, 400),
        ("POST", "/v1/chat/completions", {**chat, "messages": [{"role": "wizard", "content": "x"}]}, 400),
        ("POST", "/v1/chat/completions", {**chat, "messages": [{"role": "user", "content": 42}]}, 400),
        ("POST", "/v1/chat/completions", {**chat, "max_tokens": 0}, 400),
        ("POST", "/v1/chat/completions", {**chat, "max_tokens": "lots"}, 400),
        ("POST", "/v1/chat/completions", {**chat, "temperature": -1}, 400),
        ("POST", "/v1/chat/completions", {**chat, "top_p": 2}, 400),
        ("POST", "/v1/chat/completions", {**chat, "model": "gpt-4o"}, 404),
        ("POST", "/v1/chat/completions", {**chat, "stream": "yes"}, 400),
        ("POST", "/v1/chat/completions", {**chat, "stop": 7}, 400),
        ("POST", "/v1/chat/completions", {**chat, "n": 3}, 400),
        ("POST", "/v1/chat/completions", {**chat, "speclocal": {"mode": "warp"}}, 400),
        ("POST", "/v1/chat/completions", {**chat, "speclocal": {"draft_max": 0}}, 400),
        ("POST", "/v1/completions", {"prompt": "word " * 1500}, 400),  # over the 1024-token context
        ("POST", "/v1/completions", {"prompt": "word " * 1500, "stream": True}, 400),
        ("POST", "/v1/completions", {"prompt": [1, 2, 3]}, 400),
        ("POST", "/v1/completions", {}, 400),
        ("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", 400),
        ("POST", "/v1/completions", b"x" * (9 * 2**20), 413),
        ("GET", "/v1/chat/completions", None, 405),
        ("GET", "/v1/embeddings", None, 404),
    ]
    assert len(cases) >= 20
    with httpx.Client(base_url=url, timeout=30) as http:
        for method, path, body, status in cases:
            kw = {"json": body} if isinstance(body, dict) else {"content": body}
            r = http.request(method, path, **kw)
            assert r.status_code == status, (path, body if not isinstance(body, bytes) else body[:40], r.text[:200])
            err = r.json()["error"]
            assert err["message"] and "Traceback" not in r.text and set(err) == {"message", "type", "param", "code"}
        assert http.get("/health").json()["status"] == "ok"
    over = httpx.post(url + "/v1/completions", json={"prompt": "word " * 1500}, timeout=30).json()["error"]
    assert over["code"] == "context_length_exceeded" and "context is 1024" in over["message"]
    r = smol.client().completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=COPY.format(code="5151"),
                                         max_tokens=6, temperature=0)
    assert r.choices[0].text.strip().startswith("5151")
    assert smol.proc.poll() is None


def test_200_requests_in_a_row_keep_rss_flat(smol):
    """Streaming and not, plain and prompt lookup, each prompt new at its end (so the KV cache's prefix reuse
    keeps every request cheap)."""
    c = smol.client()
    rss = {}
    for i in range(1, 201):
        prompt = f"A list of colours, item {i}:"
        mode = {"speclocal": {"mode": "plain" if i % 4 < 2 else "lookup"}}
        if i % 2:
            r = c.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=prompt, max_tokens=2, temperature=0,
                                     extra_body=mode)
            assert r.usage.completion_tokens >= 1
        else:
            chunks = list(c.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=prompt, max_tokens=2,
                                               temperature=0, stream=True, extra_body=mode))
            assert chunks[-1].choices[0].finish_reason in ("stop", "length")
        if i in (10, 200):
            rss[i] = smol.rss()
    print(f"server RSS after request 10: {rss[10] / 2**20:.1f} MiB, after 200: {rss[200] / 2**20:.1f} MiB")
    assert rss[200] <= 1.05 * rss[10]


# This VM's cost curve for the tiny pair as docs/benchmarks.md records it (V at n = 10, 11, 13-16 interpolated):
# the draft model cannot pay here, prompt lookup pays above 67 % acceptance at k = 3.
DOCUMENTED_V = (1.00, 1.57, 2.06, 2.42, 3.11, 3.49, 4.35, 6.19, 6.34, 6.60, 6.86, 7.12, 7.24, 7.36, 7.47, 7.59, 7.71)


def _known_profile(cache: Path, main_path: Path, draft_path: Path) -> None:
    """Write the documented curve where `speclocal serve` will look for this machine's profile, so what auto
    decides depends on the prompt, not on how loaded the machine was when a fresh profile was measured."""
    from types import SimpleNamespace

    from speclocal.models import layout
    from speclocal.engine.llama import default_threads
    from speclocal.models.devices import compute_label, devices, resolve_gpu_layers
    from speclocal.policy.costmodel import LONG_N, CostCurve, Depth
    from speclocal.policy.profile import DEEP_POS, profile_key

    ngl = resolve_gpu_layers("auto")  # as the server resolves its default -ngl
    compute = compute_label(ngl, devices())  # and names the weight layout it will load in (probed here)
    compute += layout.LABELS[layout.choose([main_path, draft_path], compute, ngl, None).layout]
    engine = SimpleNamespace(main=SimpleNamespace(path=main_path), draft=SimpleNamespace(path=draft_path),
                             n_threads=default_threads(), n_gpu_layers=ngl, compute=compute)
    deep = Depth(DEEP_POS[-1], 0.05, tuple((n, DOCUMENTED_V[n - 1]) for n in LONG_N), 0.52)  # as deep as serve's wants
    curve = CostCurve(DOCUMENTED_V, 0.52, 0.0015, 0.05, {"measured_at": time.time(), "source": "docs/benchmarks.md"},
                      deep=(deep,))
    (cache / "profiles").mkdir(parents=True)
    (cache / "profiles" / f"{profile_key(engine)}.json").write_text(json.dumps(curve.to_dict()))


def test_auto_decides_per_request_chat_plain_and_a_code_edit_drafts(tiny_main, tiny_draft, serve_dirs, tmp_path):
    """The tiny pair, --mode auto: a chat prompt runs plain; an edit that returns its whole input file drafts
    (prompt lookup on this machine's curve), and the response says so. Fresh priors, the documented curve."""
    cache = tmp_path / "cache"
    _known_profile(cache, tiny_main, tiny_draft)
    server = ServeProcess(["-m", str(tiny_main), "-md", str(tiny_draft), "-c", "1024"], {**serve_dirs, "cache": cache})
    try:
        c = server.client()
        chat = c.chat.completions.create(model="qwen2.5-coder-1.5b-instruct-q4_k_m", max_tokens=24, temperature=0,
                                         messages=[{"role": "user", "content": "What are three benefits of regular walks?"}])
        ext = _extra(chat, "speclocal")
        assert ext["mode"] == "auto" and ext["task"] == "chat"
        assert ext["drafter"] == "plain" and ext["decisions"]["plain"] >= 0.8 * sum(ext["decisions"].values())
        assert "single-token decodes" in ext["decision"] and "cannot pay on this machine" in ext["decision"]
        code = "\n".join(f"def f{i}(x, y):\n    total = x + y * {i}\n    return total\n" for i in range(8))
        edit = c.chat.completions.create(
            model="qwen2.5-coder-1.5b-instruct-q4_k_m", max_tokens=64, temperature=0,
            messages=[{"role": "user", "content": f"Add type hints to this code and return the whole file:\n"
                                                  f"```python\n{code}```"}])
        ext = _extra(edit, "speclocal")
        t = _extra(edit, "timings")
        print("edit:", ext["decisions"], ext["decision"])
        assert ext["task"] == "edit"
        assert ext["decisions"].get("lookup", 0) > 0 and ext["decisions"].get("spec", 0) == 0, ext
        assert t["draft_n"] > 0 and t["draft_n"] >= t["draft_n_accepted"] > 0
        assert re.search(r"Steps used: .*lookup \d+/\d+", ext["decision"])
    finally:
        rc = server.stop()
    assert rc == 0
    assert re.search(r"^chat\s+1\s", server.stderr, re.M) and re.search(r"^edit\s+1\s", server.stderr, re.M)


def test_api_key_is_required_and_ctrl_c_exits_130_with_a_summary(smollm2, serve_dirs):
    server = ServeProcess(["-m", str(smollm2), "--mode", "plain", "-c", "512", "-t", "1", "--api-key", "s3cret"],
                          serve_dirs)
    try:
        for key in ("none", "wrong"):
            with pytest.raises(openai.AuthenticationError) as e:
                server.client(api_key=key).models.list()
            assert e.value.body["code"] == "invalid_api_key"
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert _health(server.url)["status"] == "ok"  # health needs no key
        good = server.client(api_key="s3cret")
        assert [m.id for m in good.models.list()] == ["SmolLM2-135M-Instruct.Q4_1"]
        assert good.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="Hello", max_tokens=2).usage
        # auto on a request, on a server without a draft model (no draft cost: JSON null)
        r = good.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", max_tokens=4,
                                         messages=[{"role": "user", "content": "Hello"}],
                                         extra_body={"speclocal": {"mode": "auto"}})
        ext = _extra(r, "speclocal")
        assert ext["mode"] == "auto" and ext["mode_source"] == "request" and ext["auto"]["draft_cost"] is None
        # an emoji cut in half by a client (a lone surrogate, valid JSON; the openai client itself cannot send
        # one): answered, and the server goes on
        r = httpx.post(server.url + "/v1/chat/completions", timeout=60, content=json.dumps(
            {"messages": [{"role": "user", "content": "Hello \ud83d"}], "max_tokens": 2}),
            headers={"Authorization": "Bearer s3cret", "Content-Type": "application/json"})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] > 0
        assert good.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt="Hi", max_tokens=2).usage
    finally:
        rc = server.stop(signal.SIGINT)
    assert rc == 130
    assert "4 generations" in server.stderr and "Traceback" not in server.stderr


def test_sigterm_mid_stream_ends_the_stream_and_exits_0(smollm2, serve_dirs):
    server = ServeProcess(["-m", str(smollm2), "-md", str(smollm2), "--mode", "spec", "-c", "1024", "-t", "1"],
                          serve_dirs)
    try:
        with _stream_words(server.url, 900, prompt="1, 2, 3, 4, 5,", temperature=0) as r:
            lines = r.iter_lines()
            next(lines)
            server.proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            rest = [line for line in lines if line]
        assert '"shutting_down"' in rest[-2] and rest[-1] == "data: [DONE]"
        rc = server.proc.wait(30)
        print(f"exited {time.monotonic() - t0:.2f} s after SIGTERM")
    finally:
        server.stop(signal.SIGKILL)
    assert rc == 0
    assert "stopping" in server.stderr and "(cancelled)" in server.stderr and "Traceback" not in server.stderr


# ---- a native crash of the engine costs one request, not the server -------------------------------------------
def _engine_process(server: ServeProcess) -> psutil.Process:
    """The server's engine process (a multiprocessing child: not its resource tracker)."""
    found = [p for p in psutil.Process(server.proc.pid).children(recursive=True)
             if "spawn_main" in " ".join(p.cmdline())]
    assert len(found) == 1, found
    return found[0]


def test_a_native_crash_is_a_500_the_engine_restarts_and_the_next_request_is_served(smollm2, serve_dirs):
    server = ServeProcess(["-m", str(smollm2), "-c", "1024", "-t", "1", "--mode", "plain"], serve_dirs)
    c = server.client()
    story = [{"role": "user", "content": "Write a very long story about a lighthouse keeper."}]
    try:
        # mid-stream: the stream's headers have gone out (200), so the crash comes as its error event
        stream = c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=story, max_tokens=900,
                                           temperature=0, stream=True)
        chunks = iter(stream)
        next(chunks)
        next(chunks)
        first = _engine_process(server)
        first.send_signal(signal.SIGSEGV)
        with pytest.raises(openai.APIError, match=r"the llama.cpp engine crashed \(signal 11, SIGSEGV\)"):
            for _ in chunks:
                pass
        states = []
        assert wait_for(lambda: states.append(_health(server.url)) or states[-1]["status"] == "ok", 120, 0.02)
        assert any(s and s["status"] == "restarting" for s in states), states
        assert states[-1]["crashes"] == 1
        # not streamed: the request in flight gets an OpenAI-style 500 naming the crash
        out: dict = {}

        def ask() -> None:
            try:
                c.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=story, max_tokens=900,
                                          temperature=0)
            except openai.APIStatusError as e:
                out["error"] = e

        t = threading.Thread(target=ask)
        t.start()
        assert wait_for(lambda: (_health(server.url) or {}).get("busy"), 30, 0.02)
        time.sleep(0.3)
        second = _engine_process(server)
        assert second.pid != first.pid
        second.send_signal(signal.SIGSEGV)
        t.join(60)
        e = out["error"]
        assert e.status_code == 500 and e.body["code"] == "engine_crashed" and "\n" not in e.body["message"]
        assert "(signal 11, SIGSEGV)" in e.body["message"] and "serve.log" in e.body["message"]
        r = c.completions.create(model="SmolLM2-135M-Instruct.Q4_1", prompt=COPY.format(code="4242"), max_tokens=6,
                                 temperature=0)
        assert r.choices[0].text.strip().startswith("4242") and server.proc.poll() is None
        assert sum("engine restarted after a crash" in line for line in server.lines) == 2
    finally:
        rc = server.stop()
    assert rc == 0 and "2 failed" in server.stderr
