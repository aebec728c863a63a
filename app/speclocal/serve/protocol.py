"""The OpenAI-compatible wire format, without a web framework: request JSON -> GenerationRequest (every field
checked, each problem one OpenAI-style error naming its parameter), GenerationResult -> response JSON with
OpenAI's `usage`, llama-server's `timings` and our `speclocal` object (what auto chose and why).

Extension fields pick the mode, draft length and task per request, in a `speclocal` object or at the top level
(as llama-server takes extra fields), e.g. `{"speclocal": {"mode": "auto", "draft_max": 8}}`; llama-server's
own names (`n_predict`, `top_k`, `min_p`, `speculative.n_max`, `speculative.n_min`, `speculative.p_min`) work too.
"""

from __future__ import annotations

import json
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from speclocal import options
from speclocal.engine.drafting.base import DraftParams
from speclocal.engine.sampling import Sampling
from speclocal.drafts import MODES, Source
from speclocal.engine.types import GenerationRequest, GenerationResult
from speclocal.errors import SpeclocalError
from speclocal.tasks import TASKS, detect_task

MAX_STOPS = 16
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
# extension field -> (setting it overrides, allowed types)
EXTENSION = {"mode": str, "task": str, "draft_max": int, "draft_min": int, "draft_p_min": float}
LLAMA_SERVER_ALIASES = {"speculative.n_max": "draft_max", "speculative.n_min": "draft_min",
                        "speculative.p_min": "draft_p_min"}


class ApiError(Exception):
    """An error the client gets as OpenAI's `{"error": {...}}` with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class ServerInfo:
    """What the parser and the responses need to know about the loaded engine and the server's defaults."""

    model: str  # the id /v1/models lists and responses carry
    aliases: frozenset[str]  # other names a request may use for it
    n_ctx: int
    has_draft: bool
    mode: str  # the server's --mode
    settings: options.Settings
    n_predict: int | None  # the server's -n; None = until end of text or the context is full
    created: int = field(default_factory=lambda: int(time.time()))


@dataclass(frozen=True)
class Parsed:
    """A checked request: what to generate and how to answer."""

    kind: str  # chat | completion
    req: GenerationRequest
    stream: bool
    include_usage: bool
    mode_source: str  # request | server
    task: str


# ---- reading the body ------------------------------------------------------------------------------------
def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def parse_body(raw: bytes) -> dict:
    """The request's JSON object, or a 400 saying why not."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8 text", code="invalid_json") from None
    if not text.strip():
        raise ApiError(400, "the request body is empty: send a JSON object", code="invalid_json")
    try:
        body = json.loads(text, parse_constant=_no_constants)
    except (ValueError, RecursionError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {_kind(body)}", code="invalid_json")
    return body


def _kind(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def _typed(value: Any, want: type, param: str) -> Any:
    """`value` as `want` (int, float, str, bool), or a 400; bools are never numbers, ints are floats."""
    ok = (isinstance(value, want) and not (want in (int, float) and isinstance(value, bool))) or \
         (want is float and isinstance(value, int) and not isinstance(value, bool))
    if not ok:
        name = {int: "an integer", float: "a number", str: "a string", bool: "a boolean"}[want]
        raise _bad(param, f"'{param}' must be {name}, got {_kind(value)}", code="invalid_type")
    if want is float:
        value = float(value)
        if not math.isfinite(value):
            raise _bad(param, f"'{param}' must be a finite number")
    return value


def _get(body: dict, key: str, want: type, param: str | None = None) -> Any:
    """body[key] checked as `want`; None when absent or null."""
    value = body.get(key)
    return None if value is None else _typed(value, want, param or key)


def _setting(name: str, value: Any, param: str) -> Any:
    """`value` for setting `name`, in the bounds speclocal.options declares, or a 400 naming `param`."""
    why = options.BY_NAME[name].problem(value, f"'{param}'")
    if why is not None:
        raise _bad(param, why)
    return value


# ---- requests --------------------------------------------------------------------------------------------
def _extensions(body: dict) -> tuple[dict, dict]:
    """Our per-request fields (mode, task, draft_*) and the parameter name each came from: a `speclocal`
    object over top-level fields over llama-server's names."""
    values, params = {}, {}
    for alias, name in LLAMA_SERVER_ALIASES.items():
        if body.get(alias) is not None:
            values[name], params[name] = _typed(body[alias], EXTENSION[name], alias), alias
    for name, want in EXTENSION.items():
        if body.get(name) is not None:
            values[name], params[name] = _typed(body[name], want, name), name
    ext = body.get("speclocal")
    if ext is not None:
        if not isinstance(ext, dict):
            raise _bad("speclocal", f"'speclocal' must be an object, got {_kind(ext)}", code="invalid_type")
        for key, value in ext.items():
            param = f"speclocal.{key}"
            if key not in EXTENSION:
                raise _bad(param, f"unknown field '{param}' (known: {', '.join(EXTENSION)})", code="unknown_parameter")
            if value is not None:
                values[key], params[key] = _typed(value, EXTENSION[key], param), param
    return values, params


def _stops(body: dict, info: ServerInfo) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        stops: list = []
    elif isinstance(stop, str):
        stops = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = stop
    else:
        raise _bad("stop", "'stop' must be a string or an array of strings", code="invalid_type")
    if len(stops) > MAX_STOPS:
        raise _bad("stop", f"'stop' takes at most {MAX_STOPS} strings, got {len(stops)}")
    return tuple(dict.fromkeys([*info.settings.stop, *(s for s in stops if s)]))


def _n_predict(body: dict, info: ServerInfo) -> int:
    for key in ("max_completion_tokens", "max_tokens", "n_predict"):
        n = _get(body, key, int)
        if n is None:
            continue
        if key == "n_predict" and n == -1:  # llama-server: no limit
            return info.n_ctx
        if n < 1:
            raise _bad(key, f"'{key}' must be >= 1, got {n}")
        return n
    return info.n_predict or info.n_ctx  # OpenAI: until the model stops or the context is full


def _sampling(body: dict, info: ServerInfo) -> Sampling:
    s = info.settings
    temp = _get(body, "temperature", float)
    top_k = _get(body, "top_k", int)
    top_p = _get(body, "top_p", float)
    min_p = _get(body, "min_p", float)
    seed = _get(body, "seed", int)
    if seed == -1:  # llama-server: a random seed
        seed = secrets.randbelow(2**31)
    return Sampling(
        temp=s.temperature if temp is None else _setting("temperature", temp, "temperature"),
        top_k=s.top_k if top_k is None else _setting("top_k", top_k, "top_k"),
        top_p=s.top_p if top_p is None else _setting("top_p", top_p, "top_p"),
        min_p=s.min_p if min_p is None else _setting("min_p", min_p, "min_p"),
        seed=s.seed if seed is None else _setting("seed", seed, "seed"),
    )


def _draft(ext: dict, params: dict, info: ServerInfo) -> DraftParams:
    s = info.settings
    got = {name: _setting(name, ext[name], params[name]) for name in ("draft_max", "draft_min", "draft_p_min")
           if name in ext}
    d_max, d_min = got.get("draft_max", s.draft_max), got.get("draft_min", s.draft_min)
    if d_min > d_max:
        raise _bad(params.get("draft_min", params.get("draft_max", "draft_min")),
                   f"draft_min ({d_min}) must be <= draft_max ({d_max})")
    return DraftParams(max=d_max, min=d_min, p_min=got.get("draft_p_min", s.draft_p_min))


# what this server cannot do, by request field, and the values that ask for none of it (clients send these by
# default): refused with a 400 naming the field rather than answered as if it had been done
UNSUPPORTED = {
    "tools": (None, []), "functions": (None, []), "tool_choice": (None, "none", "auto"),
    "function_call": (None, "none", "auto"), "response_format": (None, {"type": "text"}),
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "logit_bias": (None, {}),
    "grammar": (None, ""), "json_schema": (None, {}),
}


def _refuse_unsupported(body: dict) -> None:
    off = {"tools": body.get("tool_choice") == "none", "functions": body.get("function_call") == "none",
           "response_format": isinstance(body.get("response_format"), dict) and body["response_format"].get("type")
           == "text"}  # tools given but not to be called; plain text asked for in so many words
    for key, harmless in UNSUPPORTED.items():
        value = body.get(key)
        if not off.get(key) and not any(value == h and type(value) is type(h) for h in harmless):
            raise _bad(key, f"'{key}' is not supported by this server (it generates plain text; "
                            "tool calls, structured output, logprobs and logit bias are not available)",
                       code="unsupported_parameter")


def _common(body: dict, info: ServerInfo) -> dict:
    """What chat and completions requests share: model, limits, sampling, stops, mode, draft, streaming."""
    _refuse_unsupported(body)
    model = _get(body, "model", str)
    if model is not None and model != info.model and model not in info.aliases:
        raise ApiError(404, f"the model '{model}' does not exist here: this server runs '{info.model}' "
                            "(see GET /v1/models)", param="model", code="model_not_found")
    n = _get(body, "n", int)
    if n is not None and n != 1:
        raise _bad("n", f"only n=1 is supported, got {n}", code="unsupported_value")
    best_of = _get(body, "best_of", int)
    if best_of is not None and best_of != 1:
        raise _bad("best_of", f"only best_of=1 is supported, got {best_of}", code="unsupported_value")
    stream = bool(_get(body, "stream", bool))
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise _bad("stream_options", f"'stream_options' must be an object, got {_kind(stream_options)}",
                   code="invalid_type")
    include_usage = bool(_get(stream_options or {}, "include_usage", bool, "stream_options.include_usage"))

    ext, params = _extensions(body)
    mode = ext.get("mode", info.mode)
    if mode not in MODES:
        raise _bad(params["mode"], f"unknown mode '{mode}' (choose from {', '.join(MODES)})")
    if mode == "spec" and not info.has_draft:
        raise _bad(params.get("mode", "speclocal.mode"), "mode 'spec' needs a draft model, and this server was "
                   "started without one (give -md/--model-draft or a pair, or --mode auto)", code="unsupported_value")
    task = ext.get("task")
    if task is not None and task not in TASKS:
        raise _bad(params["task"], f"unknown task '{task}' (choose from {', '.join(TASKS)})")
    return dict(
        fields=dict(mode=mode, n_predict=_n_predict(body, info), sampling=_sampling(body, info),
                    draft=_draft(ext, params, info), stop=_stops(body, info), task=task),
        stream=stream, include_usage=include_usage, mode_source="request" if "mode" in ext else "server",
    )


def _text_content(content: Any, param: str) -> str:
    """A message's content: a string, or an array of text parts (joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            p = f"{param}[{i}]"
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else _kind(part)
                raise _bad(p, f"only text content parts are supported, got {kind!r}", code="unsupported_value")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(param, f"'{param}' must be a string or an array of text parts, got {_kind(content)}",
               code="invalid_type")


def parse_chat(body: dict, info: ServerInfo) -> Parsed:
    """A /v1/chat/completions body -> a chat request (through the model's chat template)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        got = "missing" if messages is None else ("empty" if messages == [] else _kind(messages))
        raise _bad("messages", f"'messages' must be a non-empty array of messages, got {got}",
                   code="invalid_type" if messages else "missing_required_parameter")
    out = []
    for i, m in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(param, f"'{param}' must be an object, got {_kind(m)}", code="invalid_type")
        role = m.get("role")
        if role not in ROLES:
            raise _bad(f"{param}.role", f"'{param}.role' must be one of {', '.join(ROLES)}, got {role!r}")
        if m.get("tool_calls") or m.get("function_call"):
            raise _bad(f"{param}.tool_calls", "tool calls are not supported by this server",
                       code="unsupported_parameter")
        content = m.get("content")
        if content is None and role == "assistant":
            content = ""
        out.append({"role": ROLES[role], "content": _text_content(content, f"{param}.content")})
    if info.settings.system_prompt and not any(m["role"] == "system" for m in out):
        out.insert(0, {"role": "system", "content": info.settings.system_prompt})
    c = _common(body, info)
    req = _request(c["fields"], messages=tuple(out))
    return Parsed("chat", req, c["stream"], c["include_usage"], c["mode_source"],
                  req.task or detect_task(req.last_user_text))


def parse_completion(body: dict, info: ServerInfo) -> Parsed:
    """A /v1/completions body -> a raw prompt (no chat template)."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        raise _bad("prompt", "prompts of token ids are not supported: send text", code="unsupported_value")
    if isinstance(prompt, list) and len(prompt) > 1:
        raise _bad("prompt", "only one prompt per request is supported", code="unsupported_value")
    if not isinstance(prompt, str):
        got = "missing" if prompt is None else _kind(prompt)
        raise _bad("prompt", f"'prompt' must be a string, got {got}",
                   code="missing_required_parameter" if prompt is None else "invalid_type")
    if _get(body, "echo", bool):
        raise _bad("echo", "echo is not supported", code="unsupported_value")
    if _get(body, "suffix", str):
        raise _bad("suffix", "suffix (fill-in-the-middle) is not supported", code="unsupported_value")
    c = _common(body, info)
    req = _request(c["fields"], prompt=prompt)
    return Parsed("completion", req, c["stream"], c["include_usage"], c["mode_source"],
                  req.task or detect_task(prompt))


def _request(fields: dict, **what) -> GenerationRequest:
    try:
        return GenerationRequest(**what, **fields)
    except SpeclocalError as e:  # every field was checked above; this is the engine's last word
        raise ApiError(400, str(e)) from None


def prompt_error(e: SpeclocalError, parsed: Parsed, n_ctx: int) -> ApiError:
    """The engine refused the prompt (over the context, empty, a chat template's refusal): a 400."""
    message = str(e)
    code = "context_length_exceeded" if f"context is {n_ctx}" in message else "invalid_prompt"
    return ApiError(400, message, param="messages" if parsed.kind == "chat" else "prompt", code=code)


# ---- responses -------------------------------------------------------------------------------------------
def finish_reason(result: GenerationResult) -> str:
    """OpenAI's names: the model ended or a stop string matched -> stop; the token limit or the context -> length."""
    return "stop" if result.stop_reason in ("eos", "stop") else "length"


def usage(result: GenerationResult) -> dict:
    return {"prompt_tokens": result.n_prompt, "completion_tokens": result.n_generated,
            "total_tokens": result.n_prompt + result.n_generated,
            "prompt_tokens_details": {"cached_tokens": result.n_prompt_cached}}


def timings(result: GenerationResult) -> dict:
    """llama-server's `timings`: prompt_n counts the prompt tokens evaluated (not those reused from the cache);
    ours beside them: what the draft model spent on the prompt (inside prompt_ms, whether it read the prompt
    first, as in spec mode, or where auto brought it in during the answer), and the whole request end to end."""
    prompt_n = result.n_prompt - result.n_prompt_cached
    prompt_ms, predicted_ms = result.t_prompt * 1000, result.t_decode * 1000
    n = result.n_generated
    return finite({
        "cache_n": result.n_prompt_cached,
        "prompt_n": prompt_n, "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / result.t_prompt if prompt_n and result.t_prompt > 0 else 0.0,
        "predicted_n": n, "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / n if n else 0.0,
        "predicted_per_second": result.decode_tps,
        "draft_n": result.n_drafted, "draft_n_accepted": result.n_accepted,
        "draft_prompt_n": result.draft_prompt_tokens, "draft_prompt_ms": result.t_draft_prompt * 1000,
        "total_ms": result.t_total * 1000,
    })


def drafters_used(result: GenerationResult) -> dict[str, int]:
    """Main-model passes per drafter (plain, spec = the draft model, lookup): auto's decisions, or the fixed mode's."""
    if result.auto is not None:
        counts = {Source(k).mode: v for k, v in result.auto.get("decisions", {}).items()}
        return dict(sorted(counts.items(), key=lambda kv: -kv[1]))
    return {result.mode: result.n_passes} if result.n_passes else {}


def finite(x: Any) -> Any:
    """`x` with every non-finite float as None: JSON has no Infinity or NaN, and strict parsers refuse them."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite(v) for v in x]
    return x


def extension(result: GenerationResult, parsed: Parsed) -> dict:
    """What ran and why: the mode, the drafter(s) used, and auto's one-sentence decision."""
    used = drafters_used(result)
    if result.auto is not None:
        decision = result.auto.get("sentence", "")
    else:
        whose = "the request asked for it" if parsed.mode_source == "request" else "the server's --mode"
        decision = f"fixed mode {result.mode} ({whose})."
    return finite({
        "mode": result.mode, "mode_source": parsed.mode_source, "task": parsed.task,
        "drafter": next(iter(used), "plain"), "decisions": used, "decision": decision,
        "acceptance": result.acceptance, "tokens_per_pass": result.tokens_per_pass,
        "stop_reason": result.stop_reason, "draft_max": parsed.req.draft.max,
        "auto": {k: v for k, v in result.auto.items() if k != "verify_curve"} if result.auto else None,
    })


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + secrets.token_hex(12)


def response(parsed: Parsed, result: GenerationResult, rid: str, created: int, model: str) -> dict:
    """The non-streaming answer."""
    if parsed.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": result.text},
                  "logprobs": None, "finish_reason": finish_reason(result)}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": finish_reason(result)}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
            "usage": usage(result), "timings": timings(result), "speclocal": extension(result, parsed)}


class Chunks:
    """Server-sent events of one streamed answer: (chat) a chunk with the assistant's role, one chunk per
    generated token (its text may be empty: a character split across tokens, or text the engine holds back
    because it may begin a stop string), then a final chunk with any text still to send, finish_reason, usage
    (null with `stream_options.include_usage`: then OpenAI's usage-only chunk follows), timings and the speclocal
    object; `data: [DONE]` ends the stream."""

    def __init__(self, parsed: Parsed, rid: str, created: int, model: str):
        self.parsed = parsed
        self.chat = parsed.kind == "chat"
        self.head = {"id": rid, "object": "chat.completion.chunk" if self.chat else "text_completion",
                     "created": created, "model": model}
        self.text = StreamText()

    def _event(self, choices: list, **extra) -> bytes:
        return b"data: " + json.dumps({**self.head, "choices": choices, **extra}, ensure_ascii=False,
                                      allow_nan=False).encode() + b"\n\n"

    def _choice(self, text: str | None, finish: str | None = None, role: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

    def start(self) -> bytes:
        """Chat streams open with the assistant's role, as OpenAI's do."""
        return self._event([self._choice(None, role=True)]) if self.chat else b""

    def tokens(self, pieces: list[str]) -> bytes:
        return b"".join(self._event([self._choice(self.text.add(p))]) for p in pieces)

    def finish(self, result: GenerationResult) -> bytes:
        tail = self.text.finish(result.text) or None  # text the last tokens released (held-back stop prefix)
        u = usage(result)  # once: on the last chunk of choices (as llama-server), or after it when asked for (as
        # OpenAI; clients that sum chunks' usage, LangChain's, would count it twice)
        out = self._event([self._choice(tail, finish_reason(result))], usage=None if self.parsed.include_usage else u,
                          timings=timings(result), speclocal=extension(result, self.parsed))
        if self.parsed.include_usage:
            out += self._event([], usage=u)
        return out + DONE

    def error(self, err: ApiError) -> bytes:
        return b"data: " + json.dumps(err.body()).encode() + b"\n\n" + DONE


DONE = b"data: [DONE]\n\n"


class StreamText:
    """The text a stream has sent: the engine's pieces, which never pass a stop string and hold back text that
    may begin one, then whatever of the final (authoritative) text they did not carry."""

    def __init__(self) -> None:
        self.sent = ""

    def add(self, piece: str) -> str:
        self.sent += piece
        return piece

    def finish(self, final: str) -> str:
        """What is left to send of the final text."""
        return final[len(self.sent):] if final.startswith(self.sent) else ""
