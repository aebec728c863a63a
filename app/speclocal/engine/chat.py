"""Chat prompts through the model's own chat template (from the GGUF), rendered in a Jinja sandbox."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from speclocal.errors import SpeclocalError

ROLES = ("system", "user", "assistant")


def _raise(message: str) -> None:
    raise SpeclocalError(f"chat template refused the conversation: {message}")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise, strftime_now=lambda f: datetime.now().strftime(f))
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise SpeclocalError(f"the model's chat template does not parse: {e}") from None


def render_chat(model, messages: list[dict]) -> str:
    """The prompt text for `messages` ({"role", "content"} dicts), ending with the assistant's turn."""
    for m in messages:
        if m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise SpeclocalError(f"a chat message needs a role in {ROLES} and text content, got {m!r}")
    template = model.chat_template()
    if not template:
        raise SpeclocalError(f"{model.path.name} has no chat template: use a raw prompt (--raw)")
    try:
        return _compile(template).render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=model.token_text(model.bos),
            eos_token=model.token_text(model.eos),
        )
    except SpeclocalError:
        raise
    except Exception as e:  # a template is code from the model file: any failure is the file's
        raise SpeclocalError(f"the model's chat template failed: {type(e).__name__}: {e}") from None
