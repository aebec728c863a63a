"""The engine on real GGUF models through the real llama.cpp: equivalence, counting, sampling, limits."""

from __future__ import annotations

import threading

import psutil
import pytest

from speclocal.engine import DraftParams, Engine, GenerationRequest, Sampling
from speclocal.engine.equivalence import NEAR_TIE, compare_outputs
from speclocal.errors import SpeclocalError
from speclocal.compare import compare

PROMPTS = {
    "code": [
        "Write a Python function that checks whether a number is prime.",
        "Write a JavaScript function that debounces another function.",
    ],
    "json": [
        'Extract the fields as JSON with keys "name", "age", "city": Maria Lopez is 34 and lives in Madrid.',
        'Return a JSON object with keys "product", "price", "currency" for: The Acme kettle costs 49.90 euros.',
    ],
    "chat": [
        "What are three good habits for staying focused while studying?",
        "Tell me a short story about a lighthouse keeper who befriends a seagull.",
    ],
}


def chat(text: str, mode: str, **kw) -> GenerationRequest:
    return GenerationRequest(messages=({"role": "user", "content": text},), mode=mode, **kw)


@pytest.fixture(scope="module")
def tiny(tiny_main, tiny_draft):
    engine = Engine(tiny_main, tiny_draft, n_ctx=1024)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def smol(smollm2):
    """SmolLM2 drafting for itself: the draft is the main file."""
    engine = Engine(smollm2, smollm2, n_ctx=512)
    yield engine
    engine.close()


def test_greedy_speculative_matches_plain_up_to_near_ties(tiny):
    """The draft model (spec) and the suffix drafter (suffix) against plain on code, JSON and chat prompts."""
    acceptance, suffix_drafted = {}, 0
    for kind, prompts in PROMPTS.items():
        for text in prompts:
            for mode in ("spec", "suffix"):
                report = compare(tiny, chat(text, "plain", n_predict=40), chat(text, mode, n_predict=40))
                plain, spec = report["runs"]
                eq = report["equivalence"]
                assert plain.n_generated > 0 and (spec.n_drafted > 0 or mode == "suffix")
                if not eq.identical:
                    assert eq.margin < NEAR_TIE, (
                        f"{mode} on {text!r}: outputs part at token {eq.tokens_match_until} where plain's top-2 "
                        f"margin is {eq.margin:.3f} (>= {NEAR_TIE}): that is not float rounding"
                    )
                else:
                    assert plain.tokens == spec.tokens
                if mode == "spec":
                    acceptance.setdefault(kind, []).append(spec.acceptance)
                else:
                    suffix_drafted += spec.n_drafted
                    assert set(spec.step_sources) <= {None, "suffix"}  # no store here: the context only
    mean = {k: sum(v) / len(v) for k, v in acceptance.items()}
    assert mean["code"] > mean["chat"], mean
    assert suffix_drafted > 0


def test_equivalence_check_detects_a_real_divergence(tiny):
    """A different output at a confident position must be reported as not a near tie."""
    req = chat(PROMPTS["code"][0], "plain", n_predict=12)
    tiny.reset()
    plain = tiny.generate(req)
    forged = list(plain.tokens)
    forged[0] = forged[0] + 1  # the first token of a code answer is confident
    eq = compare_outputs(tiny, tiny.prompt_tokens(req), plain.tokens, forged)
    assert eq.tokens_match_until == 0 and not eq.identical
    assert eq.margin > NEAR_TIE and eq.near_tie is False


def test_counting_is_exact_when_drafting_with_the_main_model(smol):
    smol.reset()
    k = 4
    req = GenerationRequest(prompt="The numbers from one to fifty in words: one, two, three,", mode="spec",
                            n_predict=41, draft=DraftParams(max=k))
    steps = []
    result = smol.generate(req, on_step=steps.append)
    assert result.acceptance == 1.0
    assert result.n_accepted == result.n_drafted
    assert all(len(s.tokens) == s.accepted + 1 for s in steps)
    assert [len(s.tokens) for s in steps[:-1]] == [k + 1] * (len(steps) - 1)
    assert result.n_generated == 41 and len(steps) == 9  # 8 passes of 5 tokens, then 1
    assert result.tokens_per_pass == pytest.approx(41 / 9)
    assert sum(result.from_draft) == result.n_accepted


def test_sampling_is_repeatable_and_spec_matches_plain_statistics(smol):
    sampling = Sampling(temp=0.8, seed=7)
    a = smol.generate(GenerationRequest(prompt="Once upon a time", mode="spec", n_predict=24, sampling=sampling))
    b = smol.generate(GenerationRequest(prompt="Once upon a time", mode="spec", n_predict=24, sampling=sampling))
    c = smol.generate(GenerationRequest(prompt="Once upon a time", mode="spec", n_predict=24,
                                        sampling=Sampling(temp=0.8, seed=8)))
    assert a.tokens == b.tokens
    assert a.tokens != c.tokens
    # the draft is the main model itself, so p == q and every drafted token is accepted
    assert a.acceptance == 1.0


def test_prompt_lookup_accepts_copied_text(tiny):
    code = "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
    req = chat(f"Add type hints to this code and return the whole file:\n\n{code}", "lookup", n_predict=48)
    tiny.reset()
    result = tiny.generate(req)
    assert result.n_accepted >= 10 and result.tokens_per_pass > 1.2  # measured: 15/30, 1.5 tokens per pass
    assert "def perimeter" in result.text


def test_cancel_returns_partial_result(smol):
    cancel = threading.Event()
    seen = []

    def on_step(event):
        seen.append(event)
        if len(seen) == 3:
            cancel.set()

    result = smol.generate(GenerationRequest(prompt="Count: 1, 2, 3,", mode="plain", n_predict=100),
                           on_step=on_step, cancel=cancel)
    assert result.stop_reason == "cancelled"
    assert result.n_generated == 3
    # the models stay usable
    again = smol.generate(GenerationRequest(prompt="Count: 1, 2, 3,", mode="plain", n_predict=5))
    assert again.n_generated == 5


def test_stop_string_and_eos(smol):
    r = smol.generate(GenerationRequest(prompt="Count: 1, 2, 3, 4,", mode="spec", n_predict=60, stop=(" 9",)))
    assert r.stop_reason == "stop" and " 9" not in r.text and "8" in r.text
    r = smol.generate(chat("Say hi.", "plain", n_predict=200))
    assert r.stop_reason == "eos" and r.n_generated < 200


@pytest.mark.parametrize("stop", [" 9", ", 9,"])
def test_output_tokens_and_counts_end_at_the_stop_string(smol, stop):
    """Speculation accepts several tokens per pass: none past the stop may be streamed, kept or counted, and
    text that could begin the stop is held back until the next tokens tell."""
    def decoded(tokens):
        return b"".join(smol.main.piece(t) for t in tokens).decode("utf-8", "replace")

    results = {}
    for mode in ("plain", "spec"):
        streamed: list[str] = []
        smol.reset()
        r = smol.generate(GenerationRequest(prompt="Count: 1, 2, 3, 4,", mode=mode, n_predict=60, stop=(stop,)),
                          on_step=lambda ev: streamed.append("".join(ev.pieces)))
        assert r.stop_reason == "stop" and stop not in r.text and r.text.rstrip(",").endswith("8")
        shown = ""
        for part in streamed:
            shown += part
            assert stop not in shown and shown == r.text[: len(shown)]
        assert shown == r.text  # the held-back text came out once it could not be a stop
        assert r.n_generated == len(r.tokens) == len(r.from_draft) == sum(s[0] for s in r.steps)
        beyond = decoded(r.tokens)[len(r.text):]  # what the kept tokens hold past the text: the stop's start at most
        assert decoded(r.tokens).startswith(r.text) and stop.startswith(beyond) and len(beyond) < len(stop)
        results[mode] = r
    assert results["spec"].tokens == results["plain"].tokens and results["spec"].text == results["plain"].text
    assert results["spec"].n_accepted <= results["spec"].n_drafted


def test_a_stop_after_a_split_character_adds_no_replacement_character():
    from speclocal.engine.text import Text

    pieces = {1: b"ab", 2: b"\xe2\x82", 3: b"\xac c", 4: b"c"}  # "ab", the first two bytes of the euro sign, ...
    text = Text(pieces.__getitem__, stops=("b",))
    shown, dropped = text.add([1, 2], final=False)
    assert (text.stopped, dropped, shown, text.finish()) == (True, 1, ["a"], "a")
    text = Text(pieces.__getitem__, stops=("c!",))
    assert text.add([1, 2], final=False) == (["ab", ""], 0)
    assert text.add([3], final=False) == (["€ "], 0)  # "c" could begin "c!": held back
    assert text.add([4], final=True)[0] == ["cc"] and text.finish() == "ab€ cc"


def test_kv_cache_is_reused_across_chat_turns(tiny):
    tiny.reset()
    first = chat("Write a haiku about rain.", "spec", n_predict=16)
    r1 = tiny.generate(first)
    messages = first.messages + ({"role": "assistant", "content": r1.text}, {"role": "user", "content": "Another."})
    r2 = tiny.generate(GenerationRequest(messages=messages, mode="spec", n_predict=16))
    assert r2.n_prompt_cached >= r1.n_prompt - 1
    assert r2.n_generated > 0


def test_prompt_longer_than_context_is_refused_before_decoding(smollm2):
    engine = Engine(smollm2, None, n_ctx=256)
    try:
        with pytest.raises(SpeclocalError, match="context is 256"):
            engine.generate(GenerationRequest(prompt="word " * 300, mode="plain"))
        assert engine.main.tokens == []
    finally:
        engine.close()


def test_generation_stops_at_context_limit(smollm2):
    engine = Engine(smollm2, smollm2, n_ctx=256)
    try:
        r = engine.generate(GenerationRequest(prompt="1, 2, 3, 4, 5," * 12, mode="spec", n_predict=500))
        assert r.stop_reason == "context"
        assert r.n_prompt + r.n_generated == 256 + 1  # the last token is emitted, never evaluated
    finally:
        engine.close()


def test_each_drafter_states_how_far_a_step_may_draft():
    """Plain drafts nothing; the draft model up to --draft-max; prompt lookup and the suffix drafter up to
    --lookup-max; a drafter that does not say (a bench's or a test's own) up to the larger of the two."""
    from speclocal.engine.drafting.base import Drafter, PlainDrafter
    from speclocal.engine.drafting.lookup import PromptLookupDrafter
    from speclocal.engine.drafting.suffix import SuffixDrafter

    params = DraftParams(max=3, lookup_max=8)
    assert PlainDrafter().cap(params) == 0 and Drafter().cap(params) == 8
    assert PromptLookupDrafter(params).cap(params) == SuffixDrafter(params).cap(params) == 8
    assert Drafter().cap(DraftParams(max=6, lookup_max=2)) == 6


def test_request_validation():
    with pytest.raises(SpeclocalError, match="draft-max"):
        GenerationRequest(prompt="x", mode="spec", draft=DraftParams(max=0))
    with pytest.raises(SpeclocalError, match="n-predict"):
        GenerationRequest(prompt="x", mode="plain", n_predict=0)
    with pytest.raises(SpeclocalError, match="mode"):
        GenerationRequest(prompt="x", mode="fast")


def test_per_step_work_matches_the_full_scans_it_replaces():
    """The cheap per-step paths give what the whole-context ones gave: the cached prefix (a C bisection), greedy
    verification (row by row, stopping at the first miss) and prompt lookup's index (new tokens only)."""
    import numpy as np

    from speclocal.engine.drafting.base import Proposal
    from speclocal.engine.drafting.lookup import PromptLookupDrafter
    from speclocal.engine.llama import common_prefix
    from speclocal.engine.verify import accept_one

    rng = np.random.default_rng(0)
    for _ in range(300):
        a = [int(x) for x in rng.integers(0, 3, rng.integers(0, 40))]
        b = a[: rng.integers(0, len(a) + 1)] + [int(x) for x in rng.integers(0, 3, rng.integers(0, 5))]
        n = min(len(a), len(b))
        naive = next((i for i in range(n) if a[i] != b[i]), n)
        assert common_prefix(a, b, n) == naive
    for _ in range(100):
        rows = rng.normal(size=(6, 50)).astype(np.float32)
        best = rows.argmax(axis=1)
        drafted = [int(t) if rng.random() < 0.7 else int(t + 1) % 50 for t in best[:5]]
        n = next((i for i in range(5) if drafted[i] != best[i]), 5)
        assert accept_one(rows, Proposal(drafted), Sampling(temp=0.0), rng) == (drafted[:n] + [int(best[n])], n)
    text = [int(x) for x in rng.integers(0, 6, 400)]
    stepped, fresh = PromptLookupDrafter(DraftParams()), PromptLookupDrafter(DraftParams())
    for end in range(50, 400, 7):
        stepped.draft(text[:end], 8, Sampling(temp=0.0), rng)
        fresh.prepare([])
        fresh.draft(text[:end], 8, Sampling(temp=0.0), rng)
        assert stepped._index == fresh._index and stepped._history == text[:end]
    stepped.draft(text[:30], 8, Sampling(temp=0.0), rng)  # a shorter history starts the index over
    fresh.prepare([])
    fresh.draft(text[:30], 8, Sampling(temp=0.0), rng)
    assert stepped._index == fresh._index


def test_the_tally_reads_the_rss_a_few_times_a_second_and_at_the_end():
    from speclocal.engine.tally import RSS_INTERVAL, Tally
    from speclocal.engine.types import MemoryParts

    tally, reads = Tally(), []
    real = tally._read_rss
    tally._read_rss = lambda now: (reads.append(now), real(now))
    t = tally.t_start
    for _ in range(100):  # 100 steps of 10 ms
        tally.step([1], ["x"], [False], 0, 0, t, t, t, t + 0.01)
        t += 0.01
    per_second = round(1.0 / RSS_INTERVAL)
    assert per_second - 1 <= len(reads) <= per_second  # (float steps may land just short of the interval)
    n = len(reads)
    tally.result(mode="plain", text="", stop_reason="length", n_prompt=1, n_cached=0, memory=MemoryParts(0, 0, 0, 0),
                 auto=None, dropped_turns=0, seed=0, draft_prompt=(0, 0.0))
    assert len(reads) == n + 1 and tally.peak_rss > 0


def test_the_draft_models_prompt_processing_is_prompt_time_whenever_it_happens():
    """Spec reads the prompt through the draft model before the first token, auto may do it mid-answer: either
    way those seconds are prompt time, so decode speed means the same in every mode, and the total is kept."""
    from speclocal.engine.tally import Tally
    from speclocal.engine.types import MemoryParts

    def run(early: float, total_draft_prompt: float):
        tally = Tally()
        tally.t_start, tally.t_end = 100.0, 110.0
        tally.decoding(early)
        tally.t_decode0 = 102.0  # 2 s of prompt phase (the early draft-model share inside it)
        return tally.result(mode="auto", text="", stop_reason="length", n_prompt=300, n_cached=0,
                            memory=MemoryParts(0, 0, 0, 0), auto=None, dropped_turns=0, seed=0,
                            draft_prompt=(299, total_draft_prompt))

    spec, late = run(0.5, 0.5), run(0.0, 0.5)
    assert (spec.t_prompt, spec.t_decode) == (2.0, 8.0)
    assert (late.t_prompt, late.t_decode) == (2.5, 7.5)  # caught up mid-answer: moved out of decoding
    assert late.t_total == spec.t_total == 10.0

    tally = Tally()  # step by step: each step's drafting time and end time leave the catch-up out too
    tally.decoding(0.0)
    t = tally.t_decode0
    plain = tally.step([1], ["a"], [False], 0, 0, t, t, t + 0.1, t + 0.1)
    caught_up = tally.step([2, 3], ["b", "c"], [True, False], 3, 1, t + 0.1, t + 0.75, t + 0.85, t + 0.9,
                           t_draft_prompt=0.5)  # drafting took 0.65 s, 0.5 of them the prompt's catch-up
    assert plain.elapsed == pytest.approx(0.1) and caught_up.elapsed == pytest.approx(0.4)
    assert caught_up.t_draft == pytest.approx(0.15) and tally.steps[-1][3] == pytest.approx(0.4)
    tally.t_end = t + 0.9
    r = tally.result(mode="auto", text="", stop_reason="length", n_prompt=300, n_cached=0,
                     memory=MemoryParts(0, 0, 0, 0), auto=None, dropped_turns=0, seed=0, draft_prompt=(299, 0.5))
    assert r.t_decode == pytest.approx(0.4) and r.t_draft == pytest.approx(0.15)
    assert r.draft_share == pytest.approx(0.15 / 0.4)


def test_incompatible_pair_is_refused(tiny_main, smollm2):
    with pytest.raises(SpeclocalError, match="cannot draft for"):
        Engine(tiny_main, smollm2, n_ctx=256)


def test_rss_is_flat_over_50_generations(smol):
    modes = ("plain", "spec", "lookup")
    rss = []
    for i in range(50):
        smol.generate(GenerationRequest(prompt=f"Item {i}: the quick brown fox", mode=modes[i % 3], n_predict=16))
        rss.append(psutil.Process().memory_info().rss)
    assert rss[-1] <= rss[0] * 1.05, f"RSS grew from {rss[0] >> 20} MiB to {rss[-1] >> 20} MiB"


def test_long_chat_drops_oldest_turns_and_kv_stays_consistent(smollm2):
    engine = Engine(smollm2, smollm2, n_ctx=256)
    try:
        messages = [{"role": "system", "content": "You are terse."}]
        dropped_total = 0
        for i in range(8):
            messages.append({"role": "user", "content": f"Question {i}: name a colour and a fruit, then count to ten."})
            messages, dropped = engine.fit_chat(messages, reserve=48)
            dropped_total += dropped
            assert messages[0]["role"] == "system" and messages[-1]["content"].startswith(f"Question {i}")
            req = GenerationRequest(messages=tuple(messages), mode=("plain", "spec", "lookup")[i % 3], n_predict=48)
            prompt = engine.prompt_tokens(req)
            assert len(prompt) + 48 <= 256
            r = engine.generate(req)
            engine.check_kv()
            assert engine.main.tokens == (prompt + r.tokens)[: len(engine.main.tokens)]
            messages.append({"role": "assistant", "content": r.text})
        assert dropped_total > 0
    finally:
        engine.close()


def test_a_fitted_chat_reports_the_turns_it_left_out(smollm2):
    engine = Engine(smollm2, None, n_ctx=256)
    try:
        messages = [{"role": "system", "content": "You are terse."}]
        for i in range(12):
            messages += [{"role": "user", "content": f"Question {i}: name a colour and a fruit, then count to ten."},
                         {"role": "assistant", "content": f"Answer {i}: red, apple, one two three four five six."}]
        messages.append({"role": "user", "content": "And now?"})
        kept, _ = engine.fit_chat(messages, reserve=16)
        left_out = (len(messages) - len(kept)) // 2  # each turn is a question and its answer
        assert left_out > 0
        r = engine.generate(GenerationRequest(messages=tuple(messages), mode="plain", n_predict=16, fit_context=True))
        assert r.dropped_turns == left_out
    finally:
        engine.close()


def test_no_clock_is_read_while_a_decode_may_still_run(smol, monkeypatch):
    """llama_decode returns before a GPU has finished: every decode is synchronised before the next clock read,
    so prompt time never leaks into decode time (recorded order of decode, synchronize and clock calls)."""
    import speclocal.engine.llama as llama
    import speclocal.engine.loop as loop
    import speclocal.engine.tally as tally

    events: list[str] = []
    real_decode, real_sync, real_clock = llama.ll.llama_decode, llama.ll.llama_synchronize, loop.time.perf_counter

    class Clock:
        @staticmethod
        def perf_counter():
            events.append("clock")
            return real_clock()

    monkeypatch.setattr(llama.ll, "llama_decode", lambda ctx, batch: (events.append("decode"), real_decode(ctx, batch))[1])
    monkeypatch.setattr(llama.ll, "llama_synchronize", lambda ctx: (events.append("sync"), real_sync(ctx))[1])
    monkeypatch.setattr(loop, "time", Clock)
    monkeypatch.setattr(tally, "time", Clock)
    smol.reset()
    smol.generate(GenerationRequest(prompt="Count: 1, 2, 3,", mode="spec", n_predict=12))
    assert events.count("decode") > 12 and events.count("clock") > 12
    pending = False
    for e in events:
        pending = (pending or e == "decode") and e != "sync"
        assert not (e == "clock" and pending), "a clock was read while a decode could still be running"


def test_sampling_is_random_unless_a_seed_is_given_and_the_seed_is_recorded(smol):
    def run(seed: int):
        smol.reset()
        return smol.generate(GenerationRequest(prompt="Once upon a time", mode="plain", n_predict=16,
                                               sampling=Sampling(temp=1.0, seed=seed)))

    a, b = run(-1), run(-1)  # -1, the default: a new seed each run, as llama.cpp
    assert Sampling().seed == -1 and a.seed != b.seed and a.seed >= 0 and b.seed >= 0
    assert run(a.seed).tokens == a.tokens  # the recorded seed reproduces the run
    assert run(1234).seed == 1234


def test_sampling_on_the_device_gives_what_the_host_gives(tiny, tiny_main, tiny_draft):
    """llama.cpp's backend sampling (-bs; on by default where every layer runs on a GPU, run here on the CPU):
    each output row comes back as its top-k candidates, selected by llama.cpp, and the outputs are the host
    path's token for token: greedy in every drafting mode, and at temperature 0.8 with the same seed (the same
    distributions, so the same draws, the lossless rule included); a request with top-k off reads full rows."""
    import numpy as np

    from speclocal.engine.llama import TopRows

    device = Engine(tiny_main, tiny_draft, n_ctx=1024, backend_sampling=True)
    try:
        assert tiny.compute + ", sampling on the device" == device.compute  # a profile of its own
        assert device.main.device_k == device.draft.device_k == 40  # the default top-k
        text = PROMPTS["code"][0]
        for mode, sampling in (("plain", Sampling()), ("spec", Sampling()), ("lookup", Sampling()),
                               ("suffix", Sampling()), ("spec", Sampling(temp=0.8, seed=11)),
                               ("plain", Sampling(temp=0.8, seed=12))):
            runs = []
            for engine in (tiny, device):
                engine.reset()
                runs.append(engine.generate(chat(text, mode, n_predict=32, sampling=sampling)))
            assert runs[0].tokens == runs[1].tokens, (mode, sampling)
            assert runs[0].n_drafted == runs[1].n_drafted and runs[0].n_accepted == runs[1].n_accepted
        device.reset()
        device.generate(chat(text, "plain", n_predict=2, sampling=Sampling(temp=0.8, top_k=0)))
        assert device.main.device_k is None  # every id may keep probability: full rows
        device.generate(chat(text, "plain", n_predict=2))
        assert device.main.device_k == 40

        m = device.main  # two candidates in one pass (auto's runner-up), both ways
        prompt = device.prompt_tokens(chat(text, "plain"))
        m.clear()
        m.eval(prompt[:-1], outputs="none")
        base = len(m.tokens)
        on_device = m.eval_branches([prompt[-1], 785, 1156], 0, [262, 4686])
        assert isinstance(on_device, TopRows) and len(on_device) == 5
        ids = on_device.argmax(axis=1)
        m.keep_branch(False)
        m.truncate(base)
        with m.full_rows():
            assert m.device_k is None
            host = m.eval_branches([prompt[-1], 785, 1156], 0, [262, 4686])
            assert isinstance(host, np.ndarray) and host.shape == (5, m.n_vocab)
            assert np.array_equal(ids, host.argmax(axis=1))
            m.keep_branch(False)
        assert m.device_k == 40
        m.clear()
    finally:
        device.close()


def test_a_device_that_cannot_select_the_top_k_samples_on_the_host(smollm2, monkeypatch, caplog):
    """Where the device cannot run llama.cpp's top-k (it then hands back whole rows and no candidates: faked
    here at the ctypes boundary), the engine finds out in its warm-up, says so once, and samples on the host."""
    import logging

    import llama_cpp

    monkeypatch.setattr(llama_cpp, "llama_get_sampled_candidates_count_ith", lambda ctx, i: 0)
    notice = logging.getLogger("speclocal.notice")  # the CLI may have set it apart, with a handler of its own
    monkeypatch.setattr(notice, "handlers", [caplog.handler])
    engine = Engine(smollm2, None, n_ctx=256, backend_sampling=True)
    try:
        assert not engine.backend_sampling and engine.main.device_k is None
        assert "sampling on the device" not in engine.compute
        assert any("cannot select a row's top-k" in r.getMessage() for r in caplog.records)
        out = engine.generate(GenerationRequest(prompt="One, two, three,", mode="plain", n_predict=4))
        assert out.n_generated == 4
    finally:
        engine.close()
