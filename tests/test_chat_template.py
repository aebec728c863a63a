"""Chat templates: the model's own template renders; hostile templates are refused or bounded."""

import time

import pytest

from speclocal.engine.chat import render_template
from speclocal.errors import SpeclocalError
from speclocal.models.gguf_info import read_gguf

MESSAGES = [{"role": "user", "content": "hi"}]


def test_qwen_template_from_the_gguf_renders_chatml(tiny_main):
    template = read_gguf(tiny_main).chat_template
    text = render_template(template, [{"role": "system", "content": "Be brief."}] + MESSAGES)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    default = render_template(template, MESSAGES)
    assert default.startswith("<|im_start|>system\nYou are Qwen")  # the template's own default system prompt


@pytest.mark.parametrize(
    "template, why",
    [
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
        ("{{ cycler.__init__.__globals__.os.popen('id').read() }}", "unsafe"),
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "iterations"),
        ("{{ 'x' * 1000000000 }}", "repetition"),
        ("{{ 10 ** 100000000 }}", "exponent"),
        ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "Recursion"),
        ("{% for i in range(99999) %}{% for j in range(9) %}{{ 'abcdefgh' }}{% endfor %}{% endfor %}", "output longer"),
        ("{% for m in messages %}{{ messages.append(m) }}{% endfor %}", "unsafe"),
        ("{{ raise_exception('no system role') }}", "refused"),
        ("{% if %}", "does not parse"),
    ],
)
def test_hostile_templates_are_refused_quickly(template, why):
    t0 = time.monotonic()
    with pytest.raises(SpeclocalError) as e:
        render_template(template, MESSAGES)
    assert time.monotonic() - t0 < 5
    assert why.lower() in str(e.value).lower()
    assert "\n" not in str(e.value)


def test_a_template_without_a_system_turn_gets_the_system_text_in_the_first_user_turn():
    """Gemma 2's template refuses a system message; every client's system prompt must not fail on it."""
    from types import SimpleNamespace

    from speclocal.engine.chat import TemplateRefused, render_chat

    template = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
                "{% endif %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>")
    model = SimpleNamespace(chat_template=lambda: template, token_text=lambda t: "", bos=1, eos=2)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]
    assert render_chat(model, chat) == "<user>Be brief.\n\nhi<assistant>hello<user>bye<assistant>"
    assert render_chat(model, chat[1:2]) == "<user>hi<assistant>"
    assert render_chat(model, [{"role": "system", "content": " "}, *chat[1:2]]) == "<user>hi<assistant>"
    with pytest.raises(TemplateRefused):  # a system turn it cannot open a user turn with: still refused
        render_chat(model, [{"role": "system", "content": "x"}])
