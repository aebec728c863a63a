"""The KV cache never silently loses its context: sliding windows, removals llama.cpp refuses, recurrent
states (real models through the real llama.cpp)."""

from __future__ import annotations

import pytest

from speclocal.engine import Engine, GenerationRequest
from speclocal.engine.equivalence import compare_outputs
from speclocal.errors import SpeclocalError

STORY = ("The lighthouse keeper wrote in his log every evening. He noted the wind, the colour of the sea, the "
         "ships that passed and the birds that rested on the rail. ")


def test_a_chat_past_the_sliding_window_reuses_only_what_the_window_still_holds(gemma3):
    """Gemma 3 keeps a window of 512 positions in most layers, in a cache of about the window's size. When a
    conversation goes back further than that (here: the user rewrites their last long message), the cache no
    longer holds what the shared prefix needs, so it is processed again (as llama-server does); prompt lookup
    drafting from the reused cache gives plain's output from a fresh cache, up to near ties, turn after turn."""
    engine = Engine(gemma3, None, n_ctx=4096)
    try:
        assert engine.main.memory_kind == "swa" and engine.main.n_swa == 512
        days, reprocessed, reused = [], 0, 0
        for turn, action in enumerate(["new", "new", "rewrite", "new", "rewrite"]):
            entry = f"Day {len(days) + (action == 'new')}" + (" (again)" if action == "rewrite" else "") + ". "
            entry += (STORY if action == "new" else STORY.upper()) * 16 + "Then he wrote:"
            days = days + [entry] if action == "new" else days[:-1] + [entry]
            prompt = "\n\n".join(days)
            req = GenerationRequest(prompt=prompt, mode="lookup", n_predict=24)
            got = engine.generate(req)  # the cache holds the previous turn
            if turn:
                reused += got.n_prompt_cached > 0
                reprocessed += got.n_prompt_cached == 0
            cache = list(engine.main.tokens)
            engine.reset()
            want = engine.generate(GenerationRequest(prompt=prompt, mode="plain", n_predict=24))
            eq = compare_outputs(engine, engine.prompt_tokens(req), want.tokens, got.tokens)
            assert eq.identical or eq.near_tie, (turn, action, eq)
            engine.reset()
            engine.main.eval(cache, outputs="none")  # back to the conversation's cache for the next turn
        assert reused >= 2 and reprocessed >= 1  # new days reuse the prefix; a rewrite behind the window cannot
    finally:
        engine.close()


def test_a_removal_llama_cpp_refuses_keeps_the_context(smollm2, monkeypatch):
    """If llama.cpp cannot remove the rejected tail (recurrent and hybrid memories), the kept prefix is evaluated
    again instead of clearing the whole cache: speculative output stays the main model's (here removal is refused
    for every call, on a model that would allow it)."""
    import speclocal.engine.llama as llama

    engine = Engine(smollm2, smollm2, n_ctx=512)
    try:
        code = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n"
        req = GenerationRequest(prompt=code, mode="plain", n_predict=24)  # lookup proposes, main disagrees
        plain = engine.generate(req)
        monkeypatch.setattr(llama.ll, "llama_memory_seq_rm", lambda mem, seq, p0, p1: False)
        engine.reset()
        lookup = engine.generate(GenerationRequest(prompt=req.prompt, mode="lookup", n_predict=24))
        assert engine.main.rebuilds > 0 and lookup.n_drafted > lookup.n_accepted  # rejections had to roll back
        assert lookup.tokens == plain.tokens
        engine.check_kv()
    finally:
        engine.close()


def test_speculative_modes_refuse_a_recurrent_model_in_one_line(smollm2, monkeypatch):
    import speclocal.engine.llama as llama

    monkeypatch.setattr(llama.ll, "llama_model_is_recurrent", lambda model: True)
    engine = Engine(smollm2, smollm2, n_ctx=256)
    try:
        assert engine.main.memory_kind == "recurrent"
        for mode in ("spec", "lookup", "auto"):
            with pytest.raises(SpeclocalError, match="recurrent state that cannot roll back"):
                engine.generate(GenerationRequest(prompt="Hello", mode=mode, n_predict=4))
        assert engine.generate(GenerationRequest(prompt="Hello", mode="plain", n_predict=4)).n_generated == 4
    finally:
        engine.close()
