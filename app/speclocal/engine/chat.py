"""Chat prompts through the model's own chat template (from the GGUF), rendered in a bounded Jinja sandbox.

A chat template is code that came with a downloaded file. Jinja's immutable sandbox stops it from
reaching Python internals; on top of that we bound its work: a budget of loop iterations over
`range`, no huge string or list repetition, a time limit checked on every call and output chunk,
and a cap on the output size.
"""

from __future__ import annotations

import json
import operator
import time
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from speclocal.errors import SpeclocalError

ROLES = ("system", "user", "assistant")
TIME_LIMIT_S = 2.0
MAX_ITERATIONS = 1_000_000  # over all `range` loops of one render
MAX_OUTPUT_CHARS = 4_000_000
MAX_REPEAT = 100_000  # longest result of `*` on strings / lists


class _Budget:
    """Work allowed for one render; shared by the sandbox hooks."""

    def __init__(self) -> None:
        self.deadline = time.monotonic() + TIME_LIMIT_S
        self.iterations = 0

    def tick(self, n: int = 1) -> None:
        self.iterations += n
        if self.iterations > MAX_ITERATIONS:
            raise SecurityError(f"more than {MAX_ITERATIONS:,} loop iterations")
        if time.monotonic() > self.deadline:
            raise SecurityError(f"rendering took longer than {TIME_LIMIT_S:.0f} s")


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})
    budget = _Budget()

    def call(self, __context, __obj, *args, **kwargs):
        self.budget.tick(0)
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context, op, left, right):
        if op == "**" and isinstance(right, (int, float)) and abs(right) > 64:
            raise SecurityError("exponent too large")
        if op == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_REPEAT:
                    raise SecurityError("repetition too large")
        return {"*": operator.mul, "**": operator.pow}[op](left, right)


class TemplateRefused(SpeclocalError):
    """The chat template's own raise_exception: it does not take this conversation (e.g. a system turn)."""


def _raise(message: str) -> None:
    raise TemplateRefused(f"chat template refused the conversation: {message}")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compile(template: str) -> tuple[jinja2.Template, _BoundedSandbox]:
    env = _BoundedSandbox(
        loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )

    def bounded_range(*args):
        r = range(*args)
        env.budget.tick(len(r))
        return r

    env.filters["tojson"] = _tojson
    env.globals.update(range=bounded_range, raise_exception=_raise, strftime_now=lambda f: datetime.now().strftime(f))
    try:
        return env.from_string(template), env
    except (jinja2.TemplateError, RecursionError, MemoryError) as e:
        raise SpeclocalError(f"the model's chat template does not parse: {e}") from None


def render_chat(model, messages: list[dict]) -> str:
    """The prompt text for `messages` ({"role", "content"} dicts), ending with the assistant's turn."""
    for m in messages:
        if m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise SpeclocalError(f"a chat message needs a role in {ROLES} and text content, got {m!r}")
    template = model.chat_template()
    if not template:
        raise SpeclocalError(f"{model.path.name} has no chat template: use a raw prompt "
                             "(run --raw, or serve's /v1/completions)")
    special = model.token_text(model.bos), model.token_text(model.eos)
    try:
        return render_template(template, messages, *special)
    except TemplateRefused:
        # a template without a system turn (Gemma 2's refuses one): the system text opens the first user turn,
        # as llama.cpp's templates do for such models, rather than every client's system prompt failing
        if len(messages) < 2 or messages[0]["role"] != "system" or messages[1]["role"] != "user":
            raise
        system, user = messages[0]["content"], messages[1]["content"]
        first = {"role": "user", "content": f"{system}\n\n{user}" if system.strip() else user}
        return render_template(template, [first, *messages[2:]], *special)


def render_template(template: str, messages: list[dict], bos_token: str = "", eos_token: str = "") -> str:
    """Render a chat template within the sandbox's budget; any failure is one SpeclocalError."""
    compiled, env = _compile(template)
    env.budget = budget = _Budget()
    out, size = [], 0
    try:
        for chunk in compiled.generate(messages=messages, add_generation_prompt=True,
                                       bos_token=bos_token, eos_token=eos_token):
            size += len(chunk)
            if size > MAX_OUTPUT_CHARS:
                raise SecurityError(f"output longer than {MAX_OUTPUT_CHARS:,} characters")
            budget.tick(0)
            out.append(chunk)
    except SpeclocalError:
        raise
    except SecurityError as e:
        raise SpeclocalError(f"the model's chat template was stopped: {e}") from None
    except Exception as e:  # a template is code from the model file: any failure is the file's
        raise SpeclocalError(f"the model's chat template failed: {type(e).__name__}: {e}") from None
    return "".join(out)
