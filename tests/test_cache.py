"""The KV cache never silently loses its context: sliding windows, removals llama.cpp refuses, recurrent
states (real models through the real llama.cpp)."""

from __future__ import annotations

import numpy as np
import pytest

from speclocal.engine import Engine, GenerationRequest
from speclocal.engine.equivalence import compare_outputs
from speclocal.errors import SpeclocalError

STORY = ("The lighthouse keeper wrote in his log every evening. He noted the wind, the colour of the sea, the "
         "ships that passed and the birds that rested on the rail. ")


@pytest.mark.parametrize("repack", [None, False], ids=["chosen-layout", "stored-layout"])
def test_a_chat_past_the_sliding_window_reuses_only_what_the_window_still_holds(gemma3, repack):
    """Gemma 3 keeps a window of 512 positions in most layers, in a cache of about the window's size. When a
    conversation goes back further than that (here: the user rewrites their last long message), the cache no
    longer holds what the shared prefix needs, so it is processed again (as llama-server does); prompt lookup
    drafting from the reused cache gives plain's output from a fresh cache, up to near ties, turn after turn.
    A near tie is judged against this machine's rounding of the two candidates' gap (equivalence.py): with the
    weights as stored on an AVX-512 Xeon, Gemma 3's gap moves by ~1 logit with the shapes of earlier passes, so
    lookup parted from plain at a margin of 1.03 on turn 0, from fresh caches; that rolled-back tokens leave no
    trace is the next test's."""
    engine = Engine(gemma3, None, n_ctx=4096, repack=repack)
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
            assert eq.identical or eq.near_tie, (turn, action, eq)  # a real divergence: margin >> the rounding
            engine.reset()
            engine.main.eval(cache, outputs="none")  # back to the conversation's cache for the next turn
        assert reused >= 2 and reprocessed >= 1  # new days reuse the prefix; a rewrite behind the window cannot
    finally:
        engine.close()


@pytest.mark.parametrize("repack", [None, False], ids=["chosen-layout", "stored-layout"])
def test_rolled_back_tokens_leave_no_trace(gemma3, repack):
    """What a rejected draft wrote into the cache is gone once it is rolled back: the next pass gives the same
    logits, to the bit, whatever the rejected tokens were (passes of the same shapes: the kernels round alike),
    with Gemma 3's sliding-window cache and its global one, also after the window has moved on. A difference here
    would be cache handling, not rounding."""
    engine = Engine(gemma3, None, n_ctx=2048, repack=repack)
    try:
        main = engine.main
        text = main.tokenize(STORY * 24, add_special=False)
        assert len(text) > 700  # past the window of 512
        rows = []
        for rejected in (lambda pos: [5, 6, 7, 8, 9, 10, 11], lambda pos: [1000 * j for j in range(1, 8)],
                         lambda pos: text[pos + 3:pos + 10]):  # the last: what then comes, evaluated again
            engine.reset()
            main.eval(text[:600], outputs="none")
            for pos in range(600, 690, 6):  # speculative steps: 3 accepted, 7 rejected and rolled back
                main.eval(text[pos:pos + 3] + rejected(pos), outputs="all")
                main.truncate(pos + 3)
                main.eval(text[pos + 3:pos + 6], outputs="none")
            engine.check_kv()
            rows.append(main.eval(text[690:700], outputs="all").copy())
        assert np.array_equal(rows[0], rows[1]) and np.array_equal(rows[0], rows[2])
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
