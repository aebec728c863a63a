"""The cost model and the auto policy as pure functions, and auto on the real tiny pair."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from speclocal.engine import DraftParams, Engine, GenerationRequest
from speclocal.policy.auto import Estimate, choose
from speclocal.tasks import detect_task
from speclocal.policy.costmodel import (
    CostCurve,
    best_k,
    break_even_acceptance,
    can_pay,
    expected_tokens,
    memory_bound_curve,
    acceptance_mle,
    predicted_run_speedup,
    predicted_speedup,
    predicted_steps_speedup,
)


def brief_cpu_curve() -> CostCurve:
    """The BRIEF's measured 2-core EPYC curve: tg 16.1 t/s; pp at 1/2/4/8/16 tokens 13.0/16.6/21.5/19.6/33.0 t/s."""
    tg = 16.1
    points = {1: 1.0, 2: 2 / 16.6 * tg, 4: 4 / 21.5 * tg, 8: 8 / 19.6 * tg, 16: 16 / 33.0 * tg}
    xs = sorted(points)
    verify = tuple(float(np.interp(n, xs, [points[x] for x in xs])) for n in range(1, 18))
    return CostCurve(verify, draft_cost=16.1 / 36.9, lookup_cost=0.001)


def test_expected_tokens():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(0.9, 0) == 1.0


def test_predicted_speedup_reproduces_the_brief_measurement():
    """BRIEF: draft model, k=2, acceptance 0.94 on code measured 0.87x plain on this kind of CPU."""
    s = predicted_speedup(0.94, 2, 16.1 / 36.9, brief_cpu_curve())
    assert s == pytest.approx(0.87, abs=0.1)


def test_run_prediction_sums_steps_of_any_draft_length():
    curve = brief_cpu_curve()
    c = curve.draft_cost
    assert predicted_run_speedup(0.8, [3] * 10, c, curve) == pytest.approx(predicted_speedup(0.8, 3, c, curve))
    assert predicted_run_speedup(0.8, [0] * 5, c, curve) == 1.0  # plain steps: one token per decode
    # a lookup run that found a proposal in half of its steps: tokens and cost add up step by step
    mixed = predicted_run_speedup(0.9, [0, 4, 0, 4], 0.0, curve)
    assert mixed == pytest.approx((2 + 2 * expected_tokens(0.9, 4)) / (2 + 2 * curve.V(5)))


def test_a_run_is_predicted_from_its_steps_at_a_rate_per_draft_length():
    curve = brief_cpu_curve()
    c = curve.cost_of("suffix")

    def exact(steps: list[tuple]) -> float:
        """The steps' own tokens over their predicted cost."""
        return sum(s[0] for s in steps) / sum(c.of(s[1]) + curve.V(s[1] + 1) for s in steps)

    # one length: the run's one i.i.d. rate, as `predicted_run_speedup` has it
    same = [(3, 3, 2, 0.1), (1, 3, 0, 0.1), (4, 3, 3, 0.1), (1, 0, 0, 0.1)]
    assert predicted_steps_speedup(same, c, curve) == pytest.approx(
        predicted_run_speedup(acceptance_mle(same), [3, 3, 3, 0], c, curve))
    assert predicted_steps_speedup([(1, 0, 0, 0.1)] * 3, c, curve) is None
    # a suffix run: a long copy taken whole, short guesses lost. One rate (16 / 18) expects 7.8 of the 17 tokens
    # the copy gave and 2.7 of each guess's 1, 13.1 in all where the steps gave 19; a rate per length expects 19
    copies = [(17, 16, 16, 0.1), (1, 2, 0, 0.1), (1, 2, 0, 0.1)]
    assert predicted_run_speedup(acceptance_mle(copies), [16, 2, 2], c, curve) < 0.8 * exact(copies)
    # the classes part at 4 and 8; the pass that ended the answer (no token) is not a rejection
    for steps in (copies, [(4, 3, 3, 0.1), (1, 4, 0, 0.1)], [(8, 7, 7, 0.1), (1, 8, 0, 0.1), (0, 3, 0, 0.1)]):
        assert predicted_steps_speedup(steps, c, curve) == pytest.approx(exact(steps)), steps


def test_compute_bound_curve_never_drafts_with_the_model():
    curve = brief_cpu_curve()
    assert not can_pay(curve.draft_cost, curve)
    for a in np.linspace(0, 0.95, 20):  # at 100 % acceptance k=16 would win on paper (1.15x); never seen
        assert best_k(float(a), curve.draft_cost, curve) == (0, 1.0)
        assert choose(float(a), 0.0, 0, curve, k_cap=16).source == "plain"


def test_memory_bound_curve_drafts_long_when_acceptance_is_high():
    curve = memory_bound_curve(draft_cost=0.1)
    k, s = best_k(0.8, curve.draft_cost, curve)
    assert k >= 4 and s > 2.0
    assert best_k(0.05, curve.draft_cost, curve)[0] == 0
    assert choose(0.8, 0.0, 0, curve, k_cap=16) == choose(0.8, 0.0, 0, curve, k_cap=16, current="model")
    assert choose(0.8, 0.0, 0, curve, k_cap=3).k == 3  # capped by what is left to generate


def test_break_even_is_where_speedup_crosses_one():
    curve = brief_cpu_curve()
    be = break_even_acceptance(4, curve.lookup_cost, curve)
    assert 0.5 < be < 1.0
    assert predicted_speedup(be, 4, curve.lookup_cost, curve) == pytest.approx(1.0, abs=1e-6)
    assert break_even_acceptance(4, curve.draft_cost, curve) is None


def test_policy_follows_an_acceptance_sequence_with_hysteresis():
    """Lookup proposals that keep being accepted switch auto to lookup; a run of misses switches it back."""
    curve = brief_cpu_curve()
    est = Estimate(prior=0.3)
    current, trace = "plain", []
    for drafted, accepted in [(8, 8)] * 6 + [(8, 0)] * 6:
        current = choose(None, est.a, 8, curve, k_cap=16, current=current).source
        trace.append(current)
        est.observe(drafted, accepted)
    assert trace[0] == "plain"  # the prior alone does not pay
    assert "lookup" in trace[1:6]
    assert trace[-1] == "plain"
    flips = sum(1 for x, y in zip(trace, trace[1:]) if x != y)
    assert flips == 2  # in once, out once: no flapping


def test_hysteresis_keeps_a_choice_that_is_nearly_as_good():
    curve = brief_cpu_curve()
    grid = np.linspace(0.5, 1, 501)
    a_marginal = next(a for a in grid if best_k(a, curve.lookup_cost, curve)[1] >= 1.03)  # inside the 5 % band
    assert choose(None, a_marginal, 16, curve, 16, current="plain").source == "plain"
    assert choose(None, a_marginal, 16, curve, 16, current="lookup").source == "lookup"
    a_clear = next(a for a in grid if best_k(a, curve.lookup_cost, curve)[1] >= 1.1)
    assert choose(None, a_clear, 16, curve, 16, current="plain").source == "lookup"
    assert choose(None, a_clear, 0, curve, 16, current="lookup").source == "plain"  # no proposal this step


@pytest.mark.parametrize(
    "text, task",
    [
        ("Write a Python function that merges two sorted lists.", "code"),
        ("Rename `x` to `count` and return the whole file:\n```python\ndef f(x):\n    return x\n```", "edit"),
        ('Extract the name and age as JSON: "Ana, 31"', "json"),
        ("Write a short story about a lighthouse.", "creative"),
        ("What is the capital of Australia?", "chat"),
        ("Make `average` raise a ValueError when there are no readings. Return the whole file.", "edit"),
    ],
)
def test_detect_task(text, task):
    assert detect_task(text) == task


def test_auto_on_a_chat_prompt_ends_up_plain_and_reuses_the_profile(tiny_main, tiny_draft, fresh_priors):
    from speclocal.policy import auto_drafter
    from speclocal.policy.profile import cost_curve

    engine = Engine(tiny_main, tiny_draft, n_ctx=1024, auto_drafter=auto_drafter)
    try:
        curve = cost_curve(engine)  # measured once per machine and setup, then cached on disk
        assert cost_curve(engine) is curve
        req = GenerationRequest(messages=({"role": "user", "content": "What are three benefits of regular walks?"},),
                                mode="auto", n_predict=48)
        result = engine.generate(req)
        info = result.auto
        assert info["task"] == "chat"
        if not info["draft_model_can_pay"]:
            assert info["decisions"].get("model", 0) == 0
        assert info["decisions"].get("plain", 0) >= 0.8 * sum(info["decisions"].values())
        assert result.tokens_per_pass < 1.2
        assert "single-token decodes" in info["sentence"]
        assert fresh_priors.is_file()  # what it saw is learnt for next time
    finally:
        engine.close()


def test_auto_brings_the_draft_model_in_only_where_it_pays_end_to_end(tiny_main, tiny_draft, fresh_priors,
                                                                       monkeypatch):
    """A long prompt with a short, chat-like answer: processing the prompt through the draft model would cost
    more than it could save, so auto answers without it (the draft model reads no prompt token, and says why);
    spec mode pays that prompt processing up front. A copy-heavy code prompt still gets the drafter that pays.
    Auto decides on a fixed curve where drafting with the draft model can pay, so the decision is the policy's
    on every machine (on a compute-bound CPU the draft model cannot pay at all and is never weighed)."""
    from speclocal.policy import auto_drafter

    curve = replace(memory_bound_curve(draft_cost=0.3), draft_prefill=0.05)
    assert can_pay(curve.cost_of("model"), curve)
    monkeypatch.setattr("speclocal.policy.profile.cost_curve", lambda engine: curve)

    rain = [(f"Station {i}: the town of {town} measured {(i * 37) % 90 + 5} mm of rain in {month}, "
             f"with {(i * 11) % 23} windy days and a mean temperature of {(i * 7) % 19 + 3} degrees.")
            for i, (town, month) in enumerate(zip(["Alder", "Brook", "Cedar", "Dune", "Elm", "Fern", "Glen", "Heath"] * 5,
                                                  ["March", "April", "May", "June", "July"] * 8))]
    question = "\n".join(rain) + "\n\nWhich station measured the most rain? Answer in one sentence."
    engine = Engine(tiny_main, tiny_draft, n_ctx=2048, auto_drafter=auto_drafter)
    try:
        chat = GenerationRequest(messages=({"role": "user", "content": question},), mode="auto", n_predict=32)
        assert len(engine.prompt_tokens(chat)) > 1000
        r = engine.generate(chat)
        assert r.draft_prompt_tokens == 0 and r.t_draft_prompt == 0.0
        assert r.auto["decisions"].get("model", 0) == 0 and r.auto["draft_model_brought_in"] is None
        weighed = r.auto["draft_model_weighed"]
        assert weighed["behind"] > 1000 and weighed["cost"] > weighed["saving"]
        assert "never brought in" in r.auto["sentence"]
        engine.reset()
        spec = engine.generate(GenerationRequest(messages=chat.messages, mode="spec", n_predict=4))
        assert spec.draft_prompt_tokens == spec.n_prompt - 1 and spec.t_draft_prompt > 0  # all but the pending token

        text = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n    return a * b\n"
        engine.reset()
        copy = engine.generate(GenerationRequest(prompt=f"Repeat this code exactly:\n{text}\nRepeated:\n{text}",
                                                 mode="auto", n_predict=40))
        copied = sum(acc for (_, _, acc, _), src in zip(copy.steps, copy.step_sources) if src in ("suffix", "lookup"))
        assert copied >= 0.5 * copy.n_generated, (copied, copy.auto["decisions"])  # most of the answer copied
        assert copy.tokens_per_pass > 2
        for run in (r, copy):  # the draft model read the prompt exactly where auto brought it in
            brought_in = run.auto["draft_model_brought_in"]
            assert (run.draft_prompt_tokens > 0) == (brought_in is not None), brought_in
            if brought_in is not None and brought_in["at"] == 0:
                assert run.draft_prompt_tokens == run.n_prompt - 1 and run.t_draft_prompt > 0
    finally:
        engine.close()


def test_auto_learns_how_long_answers_of_a_task_are(fresh_priors):
    """The expected answer length (what the draft model's catch-up is weighed against) is learnt per task type from
    answers that ended by themselves; one cut at a cap only ever raises it; the request's cap bounds what is left."""
    from speclocal.policy.auto import DEFAULT_LENGTH, LENGTH, AutoDrafter, load_priors

    curve = brief_cpu_curve()
    AutoDrafter(curve, "json", None, None).learn(40, "eos")
    assert load_priors()["json"][LENGTH] == pytest.approx(0.7 * DEFAULT_LENGTH + 0.3 * 40)
    AutoDrafter(curve, "json", None, None).learn(30, "length")  # cut at 30: says nothing of a longer mean
    AutoDrafter(curve, "code", None, None).learn(900, "length")  # cut at 900: the answers are at least that long
    learnt = load_priors()
    assert learnt["json"][LENGTH] == pytest.approx(0.7 * DEFAULT_LENGTH + 0.3 * 40)
    assert learnt["code"][LENGTH] == pytest.approx(0.7 * DEFAULT_LENGTH + 0.3 * 900)
    auto = AutoDrafter(curve, "json", None, None, n_predict=64)
    auto.prepare(list(range(10)))
    left = 0.7 * DEFAULT_LENGTH + 0.3 * 40
    assert auto.remaining(list(range(10 + 20))) == pytest.approx(min(left - 20, 64 - 20))
    assert auto.remaining(list(range(10 + 60))) == pytest.approx(4)  # the cap
    assert AutoDrafter(curve, "json", None, None).remaining(list(range(10 + 500))) == pytest.approx(left / 4)


def test_profile_is_cached_on_disk(tiny_main, tiny_draft):
    from speclocal.policy.profile import load_or_measure

    engine = Engine(tiny_main, tiny_draft, n_ctx=512)
    try:
        first, _ = load_or_measure(engine)
        second, cached = load_or_measure(engine)
        assert cached and second == first
        assert first.verify[0] == 1.0 and len(first.verify) == 17
        assert 0 < first.draft_cost < 1  # the 0.5B drafts cheaper than the 1.5B decodes
    finally:
        engine.close()


def test_a_profile_from_a_smaller_context_is_measured_again_deeper(tmp_path, monkeypatch):
    """A profile measured in a 1,024-token context reached 768 deep; an 8,192-token one measures to 3,072, so the
    shallower profile is not reused there (auto would extrapolate the long prompts from 768), but serves back."""
    import time
    from types import SimpleNamespace

    from speclocal.policy import profile
    from speclocal.policy.costmodel import Depth
    from speclocal.policy.profile import cached_curve, deep_positions, profile_key

    model = tmp_path / "main.gguf"
    model.write_bytes(b"GGUF")

    def engine(n_ctx: int) -> SimpleNamespace:
        return SimpleNamespace(main=SimpleNamespace(path=model, n_ctx=n_ctx), draft=None, n_threads=2,
                               n_gpu_layers=0, compute="CPU")

    def stored(*depths: int) -> CostCurve:
        curve = CostCurve(tuple(1.0 + 0.5 * i for i in range(17)), 0.5, 0.001, 0.05, {"measured_at": time.time()},
                          deep=tuple(Depth(p, 0.06, ((2, 1.5), (5, 2.5)), 0.6) for p in depths))
        (tmp_path / f"{profile_key(engine(1024))}.json").write_text(json.dumps(curve.to_dict()))
        return curve

    assert deep_positions(1024) == [768] and deep_positions(8192) == [1024, 3072]
    small = stored(768)
    assert cached_curve(engine(1024), tmp_path) == small
    assert cached_curve(engine(8192), tmp_path) is None
    big = stored(1024, 3072)
    assert cached_curve(engine(8192), tmp_path) == big and cached_curve(engine(1024), tmp_path) == big
    # a refresh in the smaller context is used there, but does not replace the deeper profile on disk
    monkeypatch.setattr(profile, "measure", lambda engine: small)
    assert profile.load_or_measure(engine(1024), refresh=True, directory=tmp_path) == (small, False)
    assert cached_curve(engine(8192), tmp_path) == big
    # a cache that cannot be written costs a measurement next time, not this run
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    assert profile.load_or_measure(engine(1024), directory=blocker / "profiles") == (small, False)


def test_a_ranking_that_cannot_be_saved_is_still_given(tmp_path, monkeypatch, caplog):
    from speclocal import locations
    from speclocal.policy.drafts_rank import save_ranking

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setattr(locations, "rankings_dir", lambda: blocker / "drafts")
    with caplog.at_level("WARNING", logger="speclocal"):
        assert save_ranking({"main": str(tmp_path / "main.gguf")}) is None
    assert "could not save the draft ranking" in caplog.text


def test_lookup_ceiling_replay_and_hindsight_bound(load_script):
    """scripts/lookup_ceiling.py: a plain drafter replays at exactly 1x; on an answer that copies the
    prompt, prompt lookup and the suffix drafter gain, and the hindsight bound (speclocal.bench.ceiling) is
    at least as good and near exact copying's."""
    from speclocal.bench.ceiling import hindsight_speedup
    from speclocal.engine import DraftParams
    from speclocal.engine.drafting.base import Drafter
    from speclocal.engine.drafting.lookup import PromptLookupDrafter
    from speclocal.engine.drafting.suffix import SuffixDrafter

    lc = load_script("lookup_ceiling")
    curve = CostCurve(tuple(1.0 + 0.5 * i for i in range(17)), draft_cost=float("inf"), lookup_cost=0.0)
    prompt = list(range(100, 160))
    answer = prompt[5:45] + [7, 8, 9] + prompt[45:55]  # a copy, three new tokens, more copy
    assert lc.replay(prompt, answer, Drafter(), 4, curve) == 1.0
    lookup = lc.replay(prompt, answer, PromptLookupDrafter(DraftParams(max=4)), 4, curve)
    bound = hindsight_speedup(prompt, answer, curve)
    assert 1.2 < lookup < bound
    assert bound > 1.5 and bound <= 17 / curve.V(17) + 1e-9  # exact copying at k = 16 is the most
    novel = list(range(500, 540))  # nothing to copy: every step is a plain step
    assert hindsight_speedup(prompt, novel, curve) == 1.0
    free = DraftParams(max=16, lookup_max=16)
    assert 1.2 < lc.replay(prompt, answer, SuffixDrafter(free), 16, curve) <= bound + 1e-9
    # MAT (--mat): the best copying in hindsight takes no more steps than any copying drafter, and one per
    # token where nothing can be copied
    copy = lc.copy_steps(prompt, answer)
    assert copy <= min(lc.replay_counts(prompt, answer, d, k, curve)[0] for d, k in (
        (PromptLookupDrafter(DraftParams(lookup_max=4)), 4), (SuffixDrafter(free), 16)))
    assert copy == 8 and lc.copy_steps(prompt, novel) == len(novel)  # tokens 1 + 17 + 17 + 6 + 1 + 1 + 1 + 9


def test_lookup_ceiling_replays_cached_answers_with_and_without_the_copy_pointer(load_script, capsys, tmp_path):
    """--answers: the committed greedy answers (tiny pair, -n 128) replay without loading a model; on the code-edit
    prompts the copy pointer lifts the suffix drafter's MAT over prompt lookup's, and stays under the hindsight
    bound of copying; a cache made for another -n is refused in one line."""
    lc = load_script("lookup_ceiling")
    root = Path(__file__).resolve().parent.parent
    answers = root / "docs" / "replay-answers-tiny-n128.json"
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"verify": [1.0 + 0.5 * i for i in range(17)], "draft_cost": None}))
    args = ["--mat", "--json", "-n", "128", "--answers", str(answers), "--profile", str(curve),
            "--categories", "code-edit"]
    mats = {}
    for extra in ([], ["--no-copy"]):
        assert lc.main(args + extra) == 0
        mats[bool(extra)] = json.loads(capsys.readouterr().out)["code-edit"]
    new, old = mats[False], mats[True]
    assert new["lookup-k4"] == old["lookup-k4"] and new["hindsight"] == old["hindsight"]
    assert new["suffix-k16"] / new["lookup-k4"] >= 1.2 and new["suffix-k16"] > old["suffix-k16"] * 1.05
    assert new["suffix-k16"] <= new["hindsight"]
    assert lc.main(args[:3] + ["80"] + args[4:]) == 2
    assert "are for -n 128" in capsys.readouterr().err


def test_lookup_ceiling_store_of_other_answers(load_script, capsys, tmp_path):
    """--store-others: the suffix drafter also drafts from a store of the other prompts' answers, which lifts its MAT
    on the code-edit prompts a little (they share boilerplate) and never by a copy of the prompt's own answer (that
    would multiply it); without --answers the option is refused in one line."""
    lc = load_script("lookup_ceiling")
    answers = Path(__file__).resolve().parent.parent / "docs" / "replay-answers-tiny-n128.json"
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"verify": [1.0 + 0.5 * i for i in range(17)], "draft_cost": None}))
    args = ["--mat", "--json", "--answers", str(answers), "--profile", str(curve), "--categories", "code-edit"]
    assert lc.main(args + ["--store-others"]) == 0
    mat = json.loads(capsys.readouterr().out)["code-edit"]
    assert mat["suffix-k16"] < mat["suffix+store"] < 1.2 * mat["suffix-k16"]
    assert lc.main(["--mat", "--store-others", "--categories", "code-edit"]) == 2
    assert "--store-others needs" in capsys.readouterr().err


def test_lookup_ceiling_steps_trace_auto(load_script, capsys, tmp_path):
    """--steps: every step auto drafted, per prompt turn; accepted never exceeds drafted, each step costs the curve's
    V(drafted + 1) (plus its source's per-step cost), and the speedup it heads equals the table's."""
    lc = load_script("lookup_ceiling")
    answers = Path(__file__).resolve().parent.parent / "docs" / "replay-answers-tiny-n128.json"
    curve = tmp_path / "curve.json"
    curve.write_text(json.dumps({"verify": [1.0 + 0.5 * i for i in range(17)], "draft_cost": None}))
    assert lc.main(["--steps", "--answers", str(answers), "--profile", str(curve), "--categories", "code-edit"]) == 0
    out = capsys.readouterr().out
    heads = re.findall(r"^(code-edit-\d+) turn 1: auto ([\d.]+)x", out, re.M)
    assert len(heads) == 7
    steps = [tuple(line.split()) for line in out.splitlines() if re.match(r"^  +\d+ ", line)]
    assert steps and all(int(acc) <= int(k) and float(cost) >= 1.0 + 0.5 * int(k) for _, _, k, acc, cost in steps)
    for qid, speed in heads:
        assert re.search(rf"^\| {qid} turn 1 \|( [\d.]+ \|){{4}} {speed} \|", out, re.M)


def test_prompt_lookup_follows_the_occurrence_it_is_copying_from():
    """Two earlier places share the last tokens; lookup continues the one whose preceding context matches
    (the stretch being copied), not merely the latest; with no context to tell them apart, the latest."""
    from speclocal.engine import DraftParams, Sampling
    from speclocal.engine.drafting.lookup import PromptLookupDrafter

    rng = np.random.default_rng(0)
    shared = [40, 41, 42, 43]  # as long as the longest n-gram looked up (4)
    copied = [10, 11, 12] + shared + [60, 61, 62]  # the source
    decoy = [90, 91, 92] + shared + [70, 71, 72]  # a later line with the same four tokens
    prompt = [1, 2] + copied + [3] + decoy + [4]
    lookup = PromptLookupDrafter(DraftParams(max=3))
    lookup.prepare(prompt)
    # the answer is copying the source (10 11 12 40 41 42 43): continue with 60 61 62
    assert lookup.draft(prompt + [10, 11, 12] + shared, 3, Sampling(), rng).tokens == [60, 61, 62]
    # only the shared tokens are known: the latest occurrence, as llama.cpp's lookup does
    assert lookup.draft(prompt + [7] + shared, 3, Sampling(), rng).tokens == [70, 71, 72]
    assert lookup.draft(prompt + [8, 9], 3, Sampling(), rng).tokens == []  # nothing matches


def test_prompt_lookup_is_charged_per_proposal_as_the_profile_measures_it():
    """The profile times one lookup call (a search, whatever its length): the cost model charges it once per
    drafting step, not once per drafted token, so long copies are not priced k times over."""
    from speclocal.policy.costmodel import DraftCost

    curve = CostCurve(tuple(1.0 + 0.1 * i for i in range(17)), draft_cost=0.5, lookup_cost=0.1)
    lookup = curve.cost_of("lookup")
    assert lookup == DraftCost(per_step=0.1) and curve.cost_of("model") == DraftCost(per_token=0.5)
    assert predicted_speedup(0.9, 8, lookup, curve) == pytest.approx(expected_tokens(0.9, 8) / (0.1 + curve.V(9)))
    assert predicted_speedup(0.9, 8, curve.cost_of("model"), curve) == pytest.approx(
        expected_tokens(0.9, 8) / (8 * 0.5 + curve.V(9)))
    assert best_k(0.95, lookup, curve)[0] == 16  # per token (1.6 for k = 16) it would stop shorter
    assert best_k(0.95, 0.1, curve)[0] < 16
    assert predicted_run_speedup(0.9, [0, 8], lookup, curve) == pytest.approx(
        (1 + expected_tokens(0.9, 8)) / (1 + 0.1 + curve.V(9)))  # a plain step pays no proposal


def test_auto_drafts_no_longer_than_the_caps_it_is_given(smollm2):
    """--draft-max caps auto's draft-model steps and --lookup-max its lookup steps (auto used to cap at 16
    whatever was set)."""
    from speclocal.engine.drafting.lookup import PromptLookupDrafter
    from speclocal.policy.auto import AutoDrafter

    def drafter(engine, req):  # a memory-bound curve: drafting pays, so auto drafts as long as it may
        return AutoDrafter(memory_bound_curve(), "edit", engine.model_drafter(req), PromptLookupDrafter(req.draft),
                           priors={"edit": {"model": 0.95, "lookup": 0.95}})

    engine = Engine(smollm2, smollm2, n_ctx=1024, auto_drafter=drafter)
    text = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
    try:
        for draft_max, lookup_max in ((2, 2), (1, 6)):
            req = GenerationRequest(prompt=f"Repeat this code exactly:\n{text}\nRepeated:\n{text}", mode="auto",
                                    n_predict=40, draft=DraftParams(max=draft_max, lookup_max=lookup_max))
            engine.reset()
            r = engine.generate(req)
            drafted = [s[1] for s in r.steps]
            assert max(drafted) <= max(draft_max, lookup_max) and sum(drafted) > 0, drafted
            assert r.auto["decisions"].get("model", 0) > 0
    finally:
        engine.close()


def test_synthetic_acceptance_sets_the_rate_and_the_sweep_predicts_each_cell(smollm2):
    """The benchmark-only synthetic drafter proposes the main model's own continuation, right at the rate set:
    all accepted at 1.0, none at 0.0, about half at 0.5; the sweep sets every cell against the cost model."""
    from speclocal.engine.drafting.synthetic import SyntheticDrafter
    from speclocal.policy.costmodel import acceptance_mle
    from speclocal.policy.sweep import synthetic_sweep

    engine = Engine(smollm2, None, n_ctx=512)
    try:
        req = GenerationRequest(prompt="Count: 1, 2, 3, 4,", mode="plain", n_predict=40)
        reference = engine.generate(req).tokens
        got = {}
        for rate in (1.0, 0.5, 0.0):
            engine.reset()
            r = engine.generate(GenerationRequest(prompt=req.prompt, mode="lookup", n_predict=40,
                                                  draft=DraftParams(lookup_max=4)),
                                drafter=SyntheticDrafter(reference, rate, engine.main.n_vocab, seed=1))
            assert r.tokens == reference  # wrong drafts are rejected: the output stays the main model's
            got[rate] = acceptance_mle(r.steps)  # the i.i.d. rate the steps show (accepted / drafted is lower)
        assert got[1.0] == 1.0 and got[0.0] == 0.0 and 0.3 < got[0.5] < 0.7
        curve = CostCurve(tuple(1.0 + 0.3 * i for i in range(17)), draft_cost=float("inf"))
        later = CostCurve(tuple(1.0 + 0.4 * i for i in range(17)), draft_cost=float("inf"))
        fresh = []  # the profile measured again before each k after the first (which uses the caller's): counted
        sweep = synthetic_sweep(engine, curve, rates=(0.0, 1.0), ks=(2, 3), n_predict=12,
                                remeasure=lambda: fresh.append(1) or later)
        assert fresh == [1] and [r["V"] for r in sweep["rows"]] == [curve.V(3)] * 2 + [later.V(4)] * 2
        assert [(r["k"], r["rate"]) for r in sweep["rows"]] == [(2, 0.0), (2, 1.0), (3, 0.0), (3, 1.0)]
        assert all(r["measured"] > 0 and r["predicted"] > 0 for r in sweep["rows"])
        assert sweep["rows"][1]["predicted"] == pytest.approx(3 / curve.V(3), rel=0.25)  # 3 tokens per pass
        assert all(r["tokens"] == 12 for r in sweep["rows"])  # nothing parted from plain's output
    finally:
        engine.close()


def test_the_sweep_measures_only_the_steps_before_the_output_parted_from_plains():
    """Past a near tie the synthetic drafter proposes the wrong text (acceptance falls whatever the rate): the
    sweep keeps the steps whose tokens all agree with the reference, and times them by their own clock."""
    from types import SimpleNamespace

    from speclocal.policy.sweep import _before_parting, _tps

    ref = list(range(10))
    run = SimpleNamespace(tokens=[0, 1, 2, 3, 4, 9, 9, 9], steps=[(3, 2, 2, 0.1), (2, 2, 1, 0.2), (3, 2, 0, 0.3)])
    assert _before_parting(run, ref) == run.steps[:2]  # the third step holds the first differing token
    assert _tps(run.steps[:2]) == pytest.approx(5 / 0.2)
    run.tokens = ref[:8]
    assert _before_parting(run, ref) == run.steps
    run.tokens = [5] + ref[1:8]
    assert _before_parting(run, ref) == [] and _tps([]) == 0.0


# ---- the suffix drafter in auto ----------------------------------------------------------------
def test_best_prefix_drafts_as_far_as_the_probabilities_pay():
    from speclocal.policy.costmodel import DraftCost, best_prefix

    gpu, cpu = memory_bound_curve(), brief_cpu_curve()
    free = DraftCost(per_step=0.001)
    assert best_prefix([1.0] * 10, free, gpu) == (10, pytest.approx(11 / (0.001 + gpu.V(11))))
    # probabilities that fall off a cliff after 3 tokens: drafting past them only costs
    k, s = best_prefix([0.95, 0.9, 0.9, 0.05, 0.05, 0.05], free, gpu)
    assert k == 3 and s == pytest.approx((1 + 0.95 + 0.9 + 0.9) / (0.001 + gpu.V(4)))
    assert best_prefix([0.3], free, cpu) == (0, 1.0)  # one unlikely token cannot pay for a pass over two
    assert best_prefix([], free, gpu) == (0, 1.0)
    assert best_prefix([1.0] * 16, free, cpu, k_cap=4)[0] <= 4


def test_suffix_calibration_scales_the_drafters_probabilities_and_learns_online():
    from speclocal.policy.auto import DEFAULT_PRIORS, Calibration, calibrated, match_class, suffix_key

    assert [match_class(m) for m in (0, 1, 2, 3, 4, 7, 8, 15, 16, 64)] == [1, 1, 2, 2, 4, 4, 8, 8, 16, 16]
    assert calibrated([1.0, 1.0, 0.5], 0.8) == [0.8, 0.8, 0.4]
    assert calibrated([0.9, 0.8], 2.0) == [1.0, 1.0]  # never above 1, never rising
    cal = Calibration(DEFAULT_PRIORS["code"][suffix_key(1)])
    assert cal.ratio == pytest.approx(DEFAULT_PRIORS["code"][suffix_key(1)])
    for _ in range(20):  # one-token matches read as certain and are accepted one time in ten
        cal.observe(1.0, 1 if _ % 10 == 0 else 0)
    assert cal.ratio < 0.25
    cal = Calibration(0.5)
    for _ in range(20):  # long copies: 16 predicted, 16 accepted
        cal.observe(16.0, 16)
    assert cal.ratio > 0.95


def test_choose_takes_a_confident_suffix_copy_and_keeps_short_guesses_plain():
    from speclocal.policy.auto import DEFAULT_PRIORS, calibrated, suffix_key

    cpu = brief_cpu_curve()
    edit, chat = DEFAULT_PRIORS["edit"], DEFAULT_PRIORS["chat"]
    long_copy = calibrated([1.0] * 16, edit[suffix_key(16)])  # a 40-token match: the answer re-emits the file
    c = choose(None, 0.15, 0, cpu, 3, suffix=long_copy)
    assert c.source == "suffix" and c.k >= 8 and c.predicted > 1.05
    # what chat gives: a match of one or two tokens that occurred once ("certain" by the counts)
    for scores, m in (([1.0], 1), ([1.0, 1.0], 2), ([1.0, 0.5, 0.5], 2)):
        assert choose(None, 0.15, 0, cpu, 3, suffix=calibrated(scores, chat[suffix_key(m)])).source == "plain"
    # a 4-token match that occurred once: in an edit the copy goes on (drafted); in chat it is the answer
    # echoing the question's words, and what followed them there rarely follows (plain)
    echo = [1.0] * 4
    assert choose(None, 0.15, 0, cpu, 3, suffix=calibrated(echo, edit[suffix_key(4)])).source == "suffix"
    assert choose(None, 0.15, 0, cpu, 3, suffix=calibrated(echo, chat[suffix_key(4)])).source == "plain"
    # on a memory-bound machine even a likely single token pays, so auto drafts it there
    gpu = memory_bound_curve()
    assert choose(None, 0.15, 0, gpu, 3, suffix=calibrated([1.0], 0.9)).source == "suffix"
    # hysteresis: a held suffix choice survives a lookup proposal predicted within 5 % of it
    held = choose(None, 0.0, 0, gpu, 3, suffix=[0.9] * 4)
    a = next(x for x in np.linspace(0.5, 1, 501) if best_k(x, gpu.cost_of("lookup"), gpu, 4)[1] > held.predicted)
    assert choose(None, a, 4, gpu, 3, current="suffix", suffix=[0.9] * 4).source == "suffix"
    assert choose(None, a, 4, gpu, 3, current="lookup", suffix=[0.9] * 4).source == "lookup"


def _replay(prompt, answer, drafter, curve, k=16):
    """Greedy replay: drafts against a known answer, each step charged V(d+1) (model-free drafts)."""
    from speclocal.engine import Sampling

    history, i, cost, steps = list(prompt), 0, 0.0, 0
    drafter.prepare(prompt)
    rng = np.random.default_rng(0)
    while i < len(answer):
        room = min(k, len(answer) - i - 1)
        tokens = drafter.draft(history, room, Sampling(), rng).tokens if room > 0 else []
        acc = 0
        while acc < len(tokens) and tokens[acc] == answer[i + acc]:
            acc += 1
        drafter.observe(len(tokens), acc)
        cost += curve.V(len(tokens) + 1) + (curve.lookup_cost if tokens else 0.0)
        step = min(acc + 1, len(answer) - i)
        history += answer[i:i + step]
        i, steps = i + step, steps + 1
    return len(answer) / cost, steps


def test_auto_reads_and_learns_priors_in_the_file_it_is_given(fresh_priors, tmp_path):
    """A priors file of its own (the bench's): auto starts from what it holds and learns into it, never the
    user's."""
    import json

    from speclocal.policy.auto import DEFAULT_LENGTH, LENGTH, PRIORS_VERSION, AutoDrafter, load_priors

    own = tmp_path / "bench" / "auto-priors.json"
    own.parent.mkdir()
    own.write_text(json.dumps({"version": PRIORS_VERSION, "learnt": {"json": {LENGTH: 50.0}}}))
    user = json.dumps({"version": PRIORS_VERSION, "learnt": {"json": {LENGTH: 70.0}}})
    fresh_priors.write_text(user)
    curve = brief_cpu_curve()
    auto = AutoDrafter(curve, "json", None, None, priors_file=own)
    assert auto.expected_length == 50.0
    auto.learn(40, "eos")
    assert load_priors(own)["json"][LENGTH] == pytest.approx(0.7 * 50 + 0.3 * 40)
    assert fresh_priors.read_text() == user
    assert AutoDrafter(curve, "json", None, None).expected_length == 70.0 != DEFAULT_LENGTH


def _auto(curve, task):
    from speclocal.engine.drafting.lookup import PromptLookupDrafter
    from speclocal.engine.drafting.suffix import SuffixDrafter
    from speclocal.policy.auto import DEFAULT_PRIORS, AutoDrafter

    p = DraftParams(lookup_max=16)
    return AutoDrafter(curve, task, None, PromptLookupDrafter(p), priors={t: dict(v) for t, v in DEFAULT_PRIORS.items()},
                       suffix=SuffixDrafter(p))


def test_auto_uses_the_suffix_drafter_on_a_multi_turn_edit_and_stays_plain_on_chat():
    """Replayed on the compute-bound CPU curve: the third turn of an editing session (the file twice in the
    conversation already) is re-emitted with one more change; auto drafts it mostly from the suffix drafter
    and gains. A chat answer of Zipf-distributed words (short matches everywhere, no copies) stays plain."""
    curve = brief_cpu_curve()
    rng = np.random.default_rng(3)
    file = rng.integers(1000, 9000, 300).tolist()
    edit1 = file[:120] + [42, 43] + file[122:]
    edit2 = edit1[:200] + [50, 51, 52] + edit1[200:]
    prompt = [1] + file + [2, 3] + edit1 + [4, 5, 6, 7]  # user: the file; assistant: edit 1; user: edit 2
    auto = _auto(curve, "edit")
    speedup, _ = _replay(prompt, edit2, auto, curve)
    info = auto.explain()
    assert info["decisions"].get("suffix", 0) > 0.3 * sum(info["decisions"].values()), info["decisions"]
    assert speedup > 1.3, speedup
    chat_vocab = np.minimum(rng.zipf(1.3, 4000), 3000).tolist()
    prompt, answer = chat_vocab[:300], chat_vocab[300:600]
    auto = _auto(curve, "chat")
    speedup, steps = _replay(prompt, answer, auto, curve)
    d = auto.explain()["decisions"]
    assert d.get("plain", 0) >= 0.9 * sum(d.values()), d
    assert speedup >= 0.97, speedup  # never worse than plain where there is nothing to gain
    assert auto.suffix_shadow_seen > 0  # it kept scoring the suffix drafter's proposals in the shadow


def test_auto_learns_the_suffix_calibration_across_runs(fresh_priors):
    from speclocal.policy.auto import DEFAULT_PRIORS, AutoDrafter, load_priors, suffix_key

    run = AutoDrafter(brief_cpu_curve(), "chat", None, None)
    for _ in range(5):  # 4-token matches that read as certain and were never accepted
        run.calibration[4].observe(4.0, 0)
    run.learn(64, "length")  # cut at a cap below the expected length: says nothing of it
    learnt = load_priors()["chat"]
    assert learnt[suffix_key(4)] < DEFAULT_PRIORS["chat"][suffix_key(4)]
    assert learnt[suffix_key(16)] == DEFAULT_PRIORS["chat"][suffix_key(16)]  # no proposals of that class: kept
    assert load_priors()["edit"] == DEFAULT_PRIORS["edit"]  # another task type's priors are its own
    assert AutoDrafter(brief_cpu_curve(), "chat", None, None).calibration[4].ratio == pytest.approx(learnt[suffix_key(4)])


def test_the_curve_at_a_context_depth_follows_the_measured_depths():
    """`CostCurve.at`: each pass's time piecewise linear in the depth through the depths a profile measures, in
    units of a single decode that deep: V(n) equals the shallow curve at CONTEXT_POS and the deep measurements at
    each depth (interpolated in n between the sizes measured), c follows too, a search's seconds do not change;
    past the deepest, the last segment's slope goes on (a pass's time grows faster deep in the context); a
    profile that measured only c deep keeps its V(n); the fields survive a JSON round trip, and a profile of
    the one-depth format before version 6 reads as one depth."""
    from speclocal.policy.costmodel import CONTEXT_POS, LONG_N, CostCurve, Depth

    shallow = tuple(1.0 + 0.25 * i for i in range(17))
    verify = tuple((n, 1.0 + 0.5 * (n - 1)) for n in LONG_N)
    one = Depth(1088, 0.12, verify, 0.5)
    curve = CostCurve(shallow, 0.4, lookup_cost=0.01, t_single=0.10, deep=(one,))
    assert curve.at(None) is curve
    near = curve.at(CONTEXT_POS)
    assert near.verify == pytest.approx(shallow) and near.draft_cost == pytest.approx(0.4)
    assert near.t_single == pytest.approx(0.10) and near.lookup_cost == pytest.approx(0.01)
    far = curve.at(1088)
    assert [far.V(n) for n in LONG_N] == pytest.approx([v for _, v in verify])
    assert far.V(3) == pytest.approx(2.0) and far.V(1) == 1.0  # between the sizes measured: linear in n
    assert far.draft_cost == pytest.approx(0.5) and far.lookup_cost == pytest.approx(0.01 * 0.10 / 0.12)
    mid = curve.at((CONTEXT_POS + 1088) // 2)  # halfway: each pass takes the mean of its two times
    assert mid.t_single == pytest.approx(0.11)
    assert mid.V(17) * 0.11 == pytest.approx((shallow[16] * 0.10 + verify[-1][1] * 0.12) / 2)
    assert far.at(5000) is far  # already at a depth: no second correction
    old = replace(curve, deep=(replace(one, verify=()),))  # only c measured deep
    assert old.at(1088).verify == shallow and old.at(1088).draft_cost == pytest.approx(0.5)
    assert CostCurve.from_dict(json.loads(json.dumps(curve.to_dict()))) == curve
    alone = replace(curve, draft_cost=float("inf"))  # no draft model: strict JSON, read back as it was
    assert CostCurve.from_dict(json.loads(json.dumps(alone.to_dict(), allow_nan=False))) == alone
    assert CostCurve.from_dict(curve.to_dict() | {"verify": [str(v) for v in curve.verify]}) == curve  # hand-edited
    v5 = {k: v for k, v in curve.to_dict().items() if k != "deep"} | {
        "long_pos": 1088, "t_single_long": 0.12, "verify_long": [list(x) for x in verify], "draft_cost_long": 0.5}
    assert CostCurve.from_dict(json.loads(json.dumps(v5))) == curve
    # a fit is trusted only so far, and noise never makes a pass cheaper deeper in the context
    assert curve.at(10**6).verify == pytest.approx(curve.at(CONTEXT_POS + 8 * (1088 - CONTEXT_POS)).verify)
    noisy = replace(curve, deep=(Depth(1088, 0.09, tuple((n, 0.5 * v) for n, v in verify), 0.5),))
    assert noisy.at(4096).verify == pytest.approx(shallow) and noisy.at(4096).t_single == pytest.approx(0.10)
    # a second depth where verifying costs more than the first segment's line says: the two segments meet at the
    # first depth, and past the second its steeper slope goes on
    steeper = Depth(2112, 0.14, tuple((n, v * 1.4) for n, v in verify), 0.6)
    two = replace(curve, deep=(one, steeper))
    assert [two.at(1088).V(n) for n in LONG_N] == pytest.approx([far.V(n) for n in LONG_N])
    assert [two.at(2112).V(n) for n in LONG_N] == pytest.approx([v * 1.4 for _, v in verify])
    t_3136 = 0.14 + (0.14 - 0.12)  # one segment's length past the second depth
    assert two.at(3136).t_single == pytest.approx(t_3136)
    assert two.at(3136).V(17) * t_3136 == pytest.approx(2 * 9.0 * 1.4 * 0.14 - 9.0 * 0.12)
    assert two.at(3136).draft_cost * t_3136 == pytest.approx(2 * 0.6 * 0.14 - 0.5 * 0.12)
    assert two.at(3136).V(17) > curve.at(3136).V(17) * 1.05  # the one-depth fit under-predicts there
    assert CostCurve.from_dict(json.loads(json.dumps(two.to_dict()))) == two


class _Unread:
    """What auto's weighing asks of a draft model that holds nothing yet (the real one is in the test above)."""

    def begin(self, prompt):
        pass

    def behind(self, history):
        return len(history) - 1


def test_the_first_step_alone_does_not_bring_the_draft_model_in_on_a_task_that_copies(fresh_priors):
    """At an answer's first step nothing has been copied yet, so the model-free drafters look like plain. On a
    task that mostly copies, auto weighs the draft model against what they gave the task before (the prior,
    worth a few tokens) and waits; if the answer copies nothing after all, the request's own steps bring the
    model in a few steps later. On code, which copies little, it comes in at once. What the steps without the
    model cost, as they turned out, is what is weighed and learnt."""
    from speclocal.policy.auto import DEFAULT_PRIORS, FREE, FREE_LEARN_STEPS, AutoDrafter, Choice, load_priors

    curve = replace(memory_bound_curve(draft_cost=0.3), draft_prefill=0.1)
    prompt = list(range(300))

    def weigh(task, steps):
        """Weigh the model before each step (drafted, accepted) by prompt lookup; (0, 0): a plain step."""
        auto = AutoDrafter(curve, task, _Unread(), None, n_predict=200)
        auto.prepare(prompt)
        history = list(prompt)
        for drafted, accepted in steps:
            auto._weigh_model(history, 4)
            if auto.model_in:
                break
            auto.last, auto._step_open = Choice("lookup" if drafted else "plain", drafted, 1.0), True  # as `draft`
            auto.observe(drafted, accepted)
            history += [1] * (accepted + 1)
        return auto

    assert weigh("code", [(0, 0)]).brought_in["at"] == 0
    edit = weigh("edit", [(0, 0)])
    assert not edit.model_in and edit.bring_in["free"] < 0.7 and edit.bring_in["saving"] < edit.bring_in["cost"]
    late = weigh("edit", [(0, 0)] * 12)
    assert late.model_in and 0 < late.brought_in["at"] < 12
    copying = weigh("edit", [(0, 0)] + [(8, 8)] * 12)
    assert not copying.model_in and copying.bring_in["saving"] == 0.0
    assert copying.free_n == 13 and copying.free < 0.3  # 9 tokens a step for V(9) = 1.16

    rng = np.random.default_rng(5)  # learnt from the steps without the draft model: what they cost per token
    file, cpu = rng.integers(1000, 9000, 200).tolist(), brief_cpu_curve()
    copier = _auto(cpu, "edit")
    speedup, _ = _replay(file + [7], file, copier, cpu)
    mean = copier.free_cost_seen / copier.free_tokens_seen
    assert copier.free_n >= FREE_LEARN_STEPS and mean < 0.8  # the file was there to copy
    assert mean == pytest.approx(1 / speedup, rel=0.05)  # as the replay charged the same steps
    copier.learn(len(file), "length")
    assert load_priors()["edit"][FREE] == pytest.approx(0.7 * DEFAULT_PRIORS["edit"][FREE] + 0.3 * mean)
    few = _auto(cpu, "code")
    _replay(file[:50] + [7], file[:5], few, cpu)
    few.learn(5, "eos")  # too few steps to say what copying gives code
    assert few.free_n < FREE_LEARN_STEPS and "code" in json.loads(fresh_priors.read_text())["learnt"]
    assert FREE not in json.loads(fresh_priors.read_text())["learnt"]["code"]
    loser = _auto(cpu, "chat")  # copying that lost is learnt as such, up to FREE_MAX
    loser.free_n, loser.free_cost_seen, loser.free_tokens_seen = FREE_LEARN_STEPS, 30.0, 10.0
    loser.learn(10, "length")
    assert load_priors()["chat"][FREE] == pytest.approx(0.7 * DEFAULT_PRIORS["chat"][FREE] + 0.3 * 2.0)


def test_learnt_priors_keep_only_values_in_range(fresh_priors):
    from speclocal.policy.auto import FREE, FREE_MAX, LENGTH, PRIORS_VERSION, learnt_priors

    fresh_priors.write_text(json.dumps({"version": PRIORS_VERSION, "learnt": {"code": {
        LENGTH: 0, FREE: FREE_MAX + 0.5, "lookup": 1.2, "model": 0.9}, "json": {LENGTH: 120.0, FREE: 1.4,
        "free": 0.5}}}))  # "free": the key of the predictions F was learnt from before, no longer read
    assert learnt_priors() == {"code": {"model": 0.9}, "json": {LENGTH: 120.0, FREE: 1.4}}


def test_auto_counts_its_own_time_per_step_in_what_a_token_costs_without_the_draft_model(fresh_priors):
    """Every step pays for auto's own work (both model-free drafters, the choice), whatever it drafts: a machine
    where that takes a fifth of a decode makes plain steps cost 1.2 decodes each, and a token from the draft
    model (3-4 tokens a step) a smaller share of it; so the model is brought in where it pays only with that
    counted. Here the model-free drafter is slowed to 2 ms a step on a 10 ms decode; the draft model's own
    decodes are its cost c, not auto's time; the last step (nothing drafted: no `draft`) is not counted."""
    import time as _time

    from speclocal.engine.drafting.base import Proposal
    from speclocal.engine.drafting.lookup import PromptLookupDrafter
    from speclocal.policy.auto import AutoDrafter

    class SlowLookup(PromptLookupDrafter):
        def draft(self, history, k, sampling, rng):
            _time.sleep(0.002)
            return super().draft(history, k, sampling, rng)

    curve = replace(memory_bound_curve(draft_cost=0.3), draft_prefill=0.1, t_single=0.010)
    auto = AutoDrafter(curve, "chat", _Unread(), SlowLookup(DraftParams(lookup_max=4)), n_predict=400)
    auto.model_ok = False  # weigh by hand below: see what one plain step cost first
    prompt = list(range(1000, 1300))
    auto.prepare(prompt)
    history = prompt + [5]
    auto.draft(history, 4, None, np.random.default_rng(0))
    auto.observe(0, 0)
    o = auto.overhead_sum  # one step: its time over a decode's, at least the 2 ms sleep
    assert auto.last.source == "plain" and auto.free_n == 1 and o >= 0.2 and auto.free_cost == pytest.approx(1 + o)
    auto.model_ok = True
    auto._weigh_model(history + [6], 4)
    w, a = auto.bring_in, auto.est["model"].a
    assert w["free"] == pytest.approx((1 + o + 4 * auto.free_prior) / 5)
    k, s_model = best_k(a, curve.cost_of("model"), curve, 4)
    assert k > 0 and expected_tokens(a, k) > 2  # a token from the model carries under half a step's overhead
    assert w["with_model"] == pytest.approx(1 / s_model + o / expected_tokens(a, k))
    auto.observe(0, 0)  # no `draft` before it: the loop's last step
    assert auto.free_n == 1

    class SlowModel(_Unread):
        def draft(self, history, k, sampling, rng):
            _time.sleep(0.05)
            return Proposal()

    auto.model, auto.model_in = SlowModel(), True
    auto.draft(history + [6], 4, None, np.random.default_rng(0))
    assert auto.last.source == "model" and auto._step_overhead < 2.0  # 5 decodes slept in the model, not counted
    auto.observe(0, 0)
    assert auto.free_n == 1  # nor is a step once the model is in


def test_one_early_rejection_does_not_end_a_draft_model_that_pays_but_a_run_of_them_does():
    """Once brought in, auto drafts the model by its acceptance one posterior deviation up: on a curve where the
    model pays above ~0.87, a first step that accepts nothing leaves the prior's 0.92 at 0.74 (plain would
    win), the optimistic rate still drafts; after a second miss it is under the break-even too; the margin
    shrinks with what was seen."""
    curve = memory_bound_curve(draft_cost=0.5, slope=0.25)  # a CPU's: c = 0.5, V(4) = 1.75
    be = break_even_acceptance(3, curve.cost_of("model"), curve)
    est = Estimate(prior=0.92)
    est.observe(3, 0)
    assert est.a < be < est.optimistic
    assert choose(est.optimistic, 0.0, 0, curve, 3, current="model").source == "model"
    est.observe(3, 0)
    assert est.optimistic < be  # a second miss: no longer worth drafting (bar the 5 % hysteresis)
    assert choose(est.optimistic, 0.0, 0, curve, 3, current="plain").source == "plain"
    sure = Estimate(prior=0.92)
    for _ in range(40):
        sure.observe(3, 3)
        sure.observe(3, 2)
    assert sure.optimistic - sure.a < 0.3 * (est.optimistic - est.a)
