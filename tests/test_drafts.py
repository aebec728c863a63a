"""`speclocal drafts`: acceptance by draft position, the answer it gives, bad input, and one ranking on the tiny main."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from speclocal.cli import main
from speclocal.policy import drafts_rank as dr
from speclocal.policy.costmodel import CostCurve


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _one_line_error(rc: int, out: str, err: str) -> str:
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("speclocal: error: ") and "Traceback" not in err
    return err


def test_run_lengths_and_counts_by_position():
    m = [True, True, False, True, True, True, False]
    assert dr.run_lengths(m, k=8) == [2, 1, 0, 3, 2, 1, 0]
    assert dr.run_lengths(m, k=2) == [2, 1, 0, 2, 2, 1, 0]
    accepted, drafted = dr.position_counts(m, k=3)
    # position 1: 5 of 7 starts match; position 2: starts 0..5 with a run >= 2: 0, 3, 4; position 3: start 3 only
    assert accepted == [5, 3, 1] and drafted == [7, 6, 5]


def test_simulated_steps_start_after_each_step_plus_the_main_models_token():
    m = [True, True, False, True, True, True, False, True]
    # (drafted, accepted): starts 0, 3, then 7, the last token, which the main model adds with no draft
    assert dr.simulate_steps(m, k=8) == [(7, 2), (4, 3)]
    assert dr.simulate_steps(m, k=1) == [(1, 1), (1, 0), (1, 1), (1, 1)]  # starts 0, 2, 3, 5
    assert dr.simulate_steps([True] * 5, k=8) == [(4, 4)]  # never drafts past the answer's last token
    assert dr.simulate_steps([True], k=3) == [] and dr.simulate_steps([], k=3) == []


def test_prediction_uses_the_cost_model_and_drafts_nothing_when_it_cannot_pay():
    flat = CostCurve((1.0,) + tuple(1.0 + 0.02 * i for i in range(1, 17)), 0.05)  # memory-bound: drafting is cheap
    steep = CostCurve(tuple(float(n) for n in range(1, 18)), 0.5)  # compute-bound: n tokens cost n decodes
    acc, drafted = [90, 80, 70, 60, 50, 40, 30, 20], [100] * 8
    good = dr.predict(acc, drafted, 0.05, flat)
    assert good["best_k"] > 1 and good["predicted"] > 2.0
    assert good["by_position"][1] == pytest.approx(80 / 90)
    assert good["predicted"] == max(good["speedup_by_k"])
    bad = dr.predict(acc, drafted, 0.5, steep)
    assert bad["best_k"] == 0 and bad["predicted"] == 1.0 and max(bad["speedup_by_k"]) < 1.0


def _row(label: str, speeds: dict[str, float], k: int = 3, checked: dict[str, float] | None = None) -> dict:
    tasks = {}
    for task, s in speeds.items():
        by_k = [s] * dr.DRAFT_K
        tasks[task] = {"predicted": max(s, 1.0), "best_k": k if s > 1 else 0, "speedup_by_k": by_k}
        if checked and task in checked:
            tasks[task]["check"] = {"k": k, "measured": checked[task], "predicted": s}
    overall = {"k_drafting": k, "predicted_drafting": sum(speeds.values()) / len(speeds)}
    return {"label": label, "path": f"/m/{label}.gguf", "tasks": tasks, "overall": overall}


def test_answer_names_the_best_draft_per_task_type_and_its_flags():
    rows = [_row("small", {"code": 1.4, "json": 1.2, "chat": 0.9}), _row("big", {"code": 1.2, "json": 1.3, "chat": 0.8})]
    a = dr.answer({"main": "/m/main.gguf", "candidates": rows})
    assert a["tasks"]["code"]["draft"] == "small" and a["tasks"]["json"]["draft"] == "big"
    assert a["tasks"]["chat"]["draft"] is None and a["tasks"]["chat"]["k"] == 0
    assert a["overall"]["draft"] == "small" and a["advice"] is None
    assert a["flags"]["llama-server"].startswith("llama-server -m /m/main.gguf -md /m/small.gguf --draft-max 3")


def test_a_measured_loss_overrules_the_prediction_and_nothing_pays():
    rows = [_row("small", {"code": 1.3, "json": 1.1, "chat": 1.1}, checked={"code": 0.9, "json": 0.95, "chat": 0.8})]
    a = dr.answer({"main": "/m/main.gguf", "candidates": rows})
    assert all(t["draft"] is None for t in a["tasks"].values())
    assert a["tasks"]["code"]["how"] == "measured" and a["tasks"]["code"]["speedup"] == 0.9
    assert a["overall"]["draft"] is None and a["flags"] is None and a["advice"] == dr.NO_DRAFT


def test_task_prompts_come_from_the_suite():
    prompts = dr.task_prompts(2)
    assert set(prompts) == {"code", "json", "chat"} and all(len(p) == 2 and all(p) for p in prompts.values())
    assert "json" in prompts["json"][0].lower()


def test_saved_ranking_is_found_until_the_main_model_or_the_machine_changes(tmp_path, monkeypatch):
    from speclocal.policy import profile

    main_file = tmp_path / "main.gguf"
    main_file.write_bytes(b"x" * 100)
    ranking = {"version": dr.RANKING_VERSION, "main": str(main_file), "main_key": dr._file_key(main_file),
               "machine": profile.machine_id(), "candidates": [_row("small", {"code": 1.4, "json": 1.2, "chat": 0.9})]}
    dr.save_ranking(ranking)
    got = dr.load_ranking(main_file)
    assert got is not None and dr.ranking_note(got, Path("/m/small.gguf")) == "#1: code 1.40x json 1.20x chat plain"
    assert dr.ranking_note(got, tmp_path / "other.gguf") is None
    with monkeypatch.context() as m:
        m.setattr(profile, "machine_id", lambda: "AMD EPYC | AuthenticAMD family 25 model 17 stepping 1 | ...")
        assert dr.load_ranking(main_file) is None
    main_file.write_bytes(b"y" * 101)
    assert dr.load_ranking(main_file) is None


def test_main_that_is_not_a_gguf_is_one_line(capsys, tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("this is not a model\n")
    err = _one_line_error(*_cli(capsys, "drafts", str(bad), "--dir", str(tmp_path)))
    assert "notes.gguf" in err


def test_missing_main_and_empty_candidates_are_one_line(capsys, tmp_path):
    err = _one_line_error(*_cli(capsys, "drafts", str(tmp_path / "nope.gguf")))
    assert "nope.gguf" in err
    bad = tmp_path / "notes.gguf"
    bad.write_text("x" * 100)
    _one_line_error(*_cli(capsys, "drafts", str(bad), "--candidates", ","))


def test_no_candidates_is_one_line_with_a_fetch_hint(capsys, tmp_path, tiny_main):
    err = _one_line_error(*_cli(capsys, "drafts", str(tiny_main), "--dir", str(tmp_path)))
    assert "no compatible draft model" in err and "speclocal fetch qwen2.5-coder-0.5b-q4km" in err


@pytest.mark.parametrize("other", ["smollm2", "gemma3"])
def test_candidate_with_another_vocabulary_is_one_line(capsys, request, tiny_main, other):
    path = request.getfixturevalue(other)
    err = _one_line_error(*_cli(capsys, "drafts", str(tiny_main), "--candidates", str(path)))
    assert path.name in err or other in err
    assert "cannot draft for" in err and "vocab" in err


@pytest.fixture(scope="session")
def draft_q2k(tiny_draft, tmp_path_factory) -> Path:
    """The tiny draft requantized to Q2_K by llama.cpp's quantizer: a second candidate, one vocabulary."""
    from speclocal.engine.quantize import requantize

    path, seconds = requantize(tiny_draft, "Q2_K", tmp_path_factory.mktemp("quant"))
    assert path.is_file() and seconds > 0
    assert requantize(tiny_draft, "Q2_K", path.parent) == (path, 0.0)  # made once
    return path


def test_teacher_forced_acceptance_is_what_the_real_loop_accepts(tiny_main, tiny_draft):
    """Greedy: read teacher-forced over a speculative run's own output, the draft model's matches give the tokens
    each of that run's steps drafted and accepted (draft length 4), step for step, from the first (which drafts
    answer[0] onwards), but where the draft model's batched pass and its single decodes part at a near tie
    (0.03 logits apart at one step of the chat prompt on the Intel Xeon (AMX)). (Over the plain answer they can
    differ where the main model's do too.)"""
    from speclocal.engine import Engine

    engine = Engine(tiny_main, tiny_draft, n_ctx=1024, store_dir=None)
    try:
        for task in ("code", "chat"):
            req = dr._request(dr.task_prompts(1)[task][0], "spec", 48, k=4)
            engine.reset()
            spec = engine.generate(req)
            matches = dr.teacher_matches(engine.draft, engine.prompt_tokens(req), spec.tokens)
            assert len(matches) == len(spec.tokens)
            pairs, s = [], 0  # (drafted, accepted) of each real step that drafted, and simulated from its start
            for n_new, drafted, acc, _ in spec.steps:
                if drafted:
                    pairs.append(((drafted, acc), dr.simulate_steps(matches[s:], 4)[0]))
                s += n_new
            assert s == len(spec.tokens) and len(pairs) >= 8
            assert pairs[0][0] == pairs[0][1] == dr.simulate_steps(matches, 4)[0], (task, pairs)
            same = sum(real == simulated for real, simulated in pairs)
            assert same >= 0.9 * len(pairs), (task, pairs)
    finally:
        engine.close()


def test_ranking_of_two_candidates(capsys, tiny_main, tiny_draft, draft_q2k):
    rc, out, err = _cli(capsys, "drafts", str(tiny_main), "--candidates", f"{tiny_draft},{draft_q2k}", "-n", "8",
                        "-c", "1024", "--json")
    assert rc == 0, err
    r = json.loads(out)
    assert [Path(c["path"]) for c in r["candidates"]] != [] and len(r["candidates"]) == 2
    assert {Path(c["path"]) for c in r["candidates"]} == {tiny_draft, draft_q2k}
    for c in r["candidates"]:
        assert c["c"] > 0 and set(c["tasks"]) == {"code", "json", "chat"}
        assert 0 < c["memory"]["estimate"] and c["memory"]["loaded"] == pytest.approx(c["memory"]["estimate"], rel=0.05)
        for t in c["tasks"].values():
            assert len(t["by_position"]) == dr.DRAFT_K and all(0 <= p <= 1 for p in t["by_position"])
            assert sum(t["drafted"]) > 0 and all(a <= d for a, d in zip(t["accepted"], t["drafted"]))
            assert ("check" in t) and t["check"]["measured"] > 0  # both candidates are the top two
    c = {Path(x["path"]): x["c"] for x in r["candidates"]}
    assert c[tiny_draft] < 1.0  # a third of the main model's parameters: cheaper per token than it
    assert set(r["answer"]["tasks"]) == {"code", "json", "chat"}
    assert (r["answer"]["flags"] is None) == (r["answer"]["advice"] == dr.NO_DRAFT)
    assert err.count("[") >= 4  # progress lines on stderr
    saved = dr.load_ranking(tiny_main)
    assert saved is not None and saved["candidates"] == r["candidates"]


def test_teacher_matches_of_an_answer_longer_than_a_batch(smollm2):
    """`drafts -n` above n_batch: every position's choice is read in passes of n_batch tokens, as in one pass.
    The answer is the model's own greedy one, so every position matches."""
    from speclocal.engine.llama import LoadedModel

    whole, small = LoadedModel(smollm2, 256, 2), LoadedModel(smollm2, 256, 2, n_batch=16)
    try:
        prompt = whole.tokenize("The numbers from one to twenty: one, two, three,")
        answer = [int(whole.eval(prompt, outputs="last").argmax())]
        while len(answer) < 40:
            answer.append(int(whole.eval(answer[-1:], outputs="last").argmax()))
        whole.clear()
        assert small.n_batch == 16 < len(answer)
        assert dr.teacher_matches(small, prompt, answer) == dr.teacher_matches(whole, prompt, answer) == [True] * 40
    finally:
        whole.close()
        small.close()
