"""`speclocal bench` on the real tiny pair (and SmolLM2 for the cheap runs): outputs, numbers, errors."""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import signal
import statistics

import pytest

from speclocal.bench import suite as suite_mod
from speclocal.bench.metrics import ENABLE_AT, auto_vs_best, windows
from speclocal.bench.runner import parse_int_list, parse_methods, run_order
from speclocal.errors import SpeclocalError
from speclocal.suite import load_questions

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ["speedup_by_category.png", "acceptance_by_category.png", "tps_over_position.png",
         "acceptance_vs_context.png", "what_if.png"]
CATALOGUE_SHA = {
    "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
}


def bench_main(argv: list[str]) -> int:
    """`speclocal bench ARGV` through the CLI."""
    from speclocal.cli import main

    return main(["bench", *argv])


def parse_md_table(text: str, first_header: str) -> list[dict[str, str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, [c.strip() for c in line.strip("|").split("|")])))
    return rows


def first_number(cell: str) -> float:
    return float(re.match(r"-?[\d,]+(\.\d+)?", cell).group(0).replace(",", ""))


# ---- one real run on the tiny pair, shared by the tests below ------------------------------------
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_main, tiny_draft):
    out = tmp_path_factory.mktemp("bench") / "out"
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()) as stdout:
        rc = bench_main(["--categories", "code,json", "--per-category", "1", "-n", "24",
                         "--methods", "plain,spec,lookup", "-m", str(tiny_main), "-md", str(tiny_draft),
                         "-c", "1024", "--out", str(out)])
    return rc, out, err.getvalue(), stdout.getvalue()


def test_writes_all_four_kinds_of_output(tiny_run):
    rc, out, err, stdout = tiny_run
    assert rc == 0, err
    for name in ["results.json", "results.csv", "report.md", *PLOTS]:
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    data = json.loads((out / "results.json").read_text())
    assert data["partial"] is False and data["runs_done"] == data["runs_planned"] == 8  # plain twice per turn
    m = data["machine"]
    assert m["cpu"] and m["cores_logical"] >= 1 and m["ram_bytes"] > 2**30 and m["os"]
    assert m["llama_cpp_python"] == "0.3.36"
    for role in ("main", "draft"):
        info = data["models"][role]
        assert info["sha256"] == CATALOGUE_SHA[info["file"]]
    assert data["settings"]["n_predict"] == 24 and data["settings"]["greedy"] is True
    assert data["settings"]["bracket_plain"] is True
    assert data["methods"] == ["plain", "spec-k3", "lookup-k4"]
    runs = data["runs"]
    assert sorted((r["category"], r["method"]) for r in runs) == sorted(
        (c, mm) for c in ("code", "json") for mm in data["methods"] + ["plain"])
    for r in runs:
        assert sum(s[0] for s in r["steps"]) == r["n_generated"] <= 24
        assert r["n_prompt_cached"] == 0  # caches cleared before every measured run
        if r["method"] == "plain":
            assert r["n_drafted"] == 0 and r["equivalence"] is None and r["draft_memory_added"] == 0
        else:
            assert r["equivalence"]["compared"] > 0
    spec = [r for r in runs if r["method"] == "spec-k3"]
    assert all(r["n_drafted"] > 0 and r["draft_memory_added"] > 0 for r in spec)
    # plain brackets the other methods, whose order alternates from one prompt to the next
    orders = {r["question_id"]: [x["method"] for x in sorted((y for y in runs if y["question_id"] == r["question_id"]),
                                                             key=lambda y: y["order"])] for r in runs}
    assert list(orders.values()) == [["plain", "spec-k3", "lookup-k4", "plain"], ["plain", "lookup-k4", "spec-k3", "plain"]]
    for qid in orders:  # greedy: plain's second run repeats its first token for token
        first, second = sorted((r for r in runs if r["question_id"] == qid and r["method"] == "plain"),
                               key=lambda r: r["order"])
        assert first["text"] == second["text"] and first["order"] == 0 and second["order"] == 3
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8
    assert sorted(float(r["decode_tps"]) for r in rows) == pytest.approx(sorted(r["decode_tps"] for r in runs))
    # progress with ETA on stderr, the summary table on stdout
    assert "8/8 runs" in err and "ETA" in err
    assert "| code | spec-k3 |" in stdout


def test_report_numbers_equal_those_recomputed_from_results_json(tiny_run):
    _, out, _, _ = tiny_run
    data = json.loads((out / "results.json").read_text())
    report = (out / "report.md").read_text()
    table = parse_md_table(report, "category")
    assert {(r["category"], r["method"]) for r in table} == {(c, m) for c in ("code", "json")
                                                              for m in ("spec-k3", "lookup-k4")}
    runs = [r for r in data["runs"] if r["phase"] == "suite"]
    for row in table:
        cat = [r for r in runs if r["category"] == row["category"]]
        plain: dict[tuple, list[float]] = {}  # two runs around the methods: the baseline is their mean
        plain_prompt: dict[tuple, list[float]] = {}  # end to end: plain's prompt time, then its decode rate
        for r in cat:
            if r["method"] == "plain":
                plain.setdefault((r["question_id"], r["turn"], r["rep"]), []).append(r["decode_tps"])
                plain_prompt.setdefault((r["question_id"], r["turn"], r["rep"]), []).append(r["t_prompt"])
        assert all(len(v) == 2 for v in plain.values())
        mine = [r for r in cat if r["method"] == row["method"]]
        ratios = [r["decode_tps"] / statistics.fmean(plain[(r["question_id"], r["turn"], r["rep"])]) for r in mine]
        speedup = statistics.median(ratios)
        acc = sum(r["n_accepted"] for r in mine) / sum(r["n_drafted"] for r in mine)
        assert first_number(row["plain t/s"]) == pytest.approx(statistics.median(
            x for v in plain.values() for x in v), abs=0.0051)
        assert first_number(row["t/s"]) == pytest.approx(statistics.median(r["decode_tps"] for r in mine), abs=0.0051)
        assert first_number(row["speedup"]) == pytest.approx(speedup, abs=0.0051)
        key = lambda r: (r["question_id"], r["turn"], r["rep"])  # noqa: E731
        assert first_number(row["e2e speedup"]) == pytest.approx(statistics.median(
            (statistics.fmean(plain_prompt[key(r)]) + r["n_generated"] / statistics.fmean(plain[key(r)]))
            / (r["t_prompt"] + r["t_decode"]) for r in mine), abs=0.0051)
        assert first_number(row["acceptance"]) == pytest.approx(100 * acc, abs=0.051)
        assert first_number(row["tokens/pass"]) == pytest.approx(
            sum(r["n_generated"] for r in mine) / sum(r["n_passes"] for r in mine), abs=0.0051)
        assert first_number(row["TTFT s"]) == pytest.approx(statistics.median(r["ttft"] for r in mine), abs=0.0051)
        added = max(r["memory"]["draft_weights"] + r["memory"]["draft_kv"] if r["mode"] == "spec" else 0 for r in mine)
        assert (row["memory added"] == "0") if added == 0 else first_number(row["memory added"]) == pytest.approx(
            added / 2**20, abs=0.51)
        identical = sum(1 for r in mine if r["equivalence"]["identical"])
        assert row["identical"] == f"{identical}/{len(mine)}"
        real_div = any(not r["equivalence"]["identical"] and not r["equivalence"]["near_tie"] for r in mine)
        assert row["verdict"] == ("enable" if round(speedup, 2) >= ENABLE_AT and not real_div else "disable")
    # a recommendation per category, consistent with the verdicts
    for cat in ("code", "json"):
        line = next(x for x in report.splitlines() if x.startswith(f"- **{cat}**"))
        enabled = [r for r in table if r["category"] == cat and r["verdict"] == "enable"]
        assert ("enable `" in line) == bool(enabled)
    # the machine's own noise: plain's later run of each turn over its earlier one
    plain_runs: dict[tuple, list[dict]] = {}
    for r in runs:
        if r["method"] == "plain":
            plain_runs.setdefault((r["question_id"], r["turn"], r["rep"]), []).append(r)
    drift = sorted(b["decode_tps"] / a["decode_tps"]
                   for a, b in (sorted(v, key=lambda r: r["order"]) for v in plain_runs.values()))
    line = next(x for x in report.splitlines() if x.startswith("- the machine's own noise"))
    shown = re.search(r"median ([\d.]+), ([\d.]+)–([\d.]+) over (\d+) turns", line).groups()
    assert [float(x) for x in shown[:3]] == pytest.approx(
        [statistics.median(drift), drift[0], drift[-1]], abs=0.0051) and int(shown[3]) == len(drift) == 2


def test_cost_model_check_and_what_if_are_recomputed_from_results_json(tiny_run):
    """The report's predicted-vs-measured table and what-if follow from the runs and the stored profile."""
    from speclocal.policy.costmodel import CostCurve, acceptance_mle, best_k, memory_bound_curve, predicted_steps_speedup

    _, out, _, _ = tiny_run
    data = json.loads((out / "results.json").read_text())
    curve = CostCurve.from_dict(data["profile"])
    assert curve.V(1) == 1.0 and curve.draft_cost > 0
    report = (out / "report.md").read_text()
    table = parse_md_table(report.split("## The cost model against the fixed-k runs")[1], "category")
    assert {(r["category"], r["method"]) for r in table} == {(c, m) for c in ("code", "json")
                                                              for m in ("spec-k3", "lookup-k4")}
    runs = [r for r in data["runs"] if r["phase"] == "suite"]
    errors = []
    for row in table:
        (run,) = [r for r in runs if r["category"] == row["category"] and r["method"] == row["method"]]
        # the curve at the run's depth (the prompt and half the answer); lookup: per proposal
        deep = curve.at(run["n_prompt"] + run["n_generated"] // 2)
        c = deep.cost_of("model" if run["mode"] == "spec" else "lookup")
        pred = predicted_steps_speedup(run["steps"], c, deep)
        assert first_number(row["predicted"]) == pytest.approx(pred, abs=0.0051)
        assert first_number(row["measured"]) == pytest.approx(run["speedup"], abs=0.0051)
        errors.append(abs(pred - run["speedup"]) / run["speedup"])
    line = next(x for x in report.splitlines() if x.startswith("Median error across categories"))
    assert first_number(line.split("**")[1]) == pytest.approx(100 * statistics.median(errors), abs=0.051)
    by_context = parse_md_table(report.split("By context depth")[1], "context")
    assert {r["method"] for r in by_context} == {"spec-k3", "lookup-k4"}
    assert sum(int(r["runs"]) for r in by_context) == len(table)  # every run in one depth bin
    what_if = parse_md_table(report.split("## What-if")[1], "category")
    mem = memory_bound_curve()
    for row in what_if:
        (spec,) = [r for r in runs if r["category"] == row["category"] and r["mode"] == "spec"]
        k, s = best_k(acceptance_mle(spec["steps"]), mem.draft_cost, mem)
        assert row["draft memory-bound"] == (f"{s:.2f}x (k={k})" if k else "plain (1.00x)")


def test_mat_per_method_and_draft_source_is_recomputed_from_results_json(tiny_run):
    """The MAT table (Spec-Bench's mean accepted tokens per step) follows from each run's steps and sources."""
    _, out, _, _ = tiny_run
    data = json.loads((out / "results.json").read_text())
    report = (out / "report.md").read_text()
    table = parse_md_table(report.split("## Mean accepted tokens per step (MAT)")[1], "category")
    runs = [r for r in data["runs"] if r["phase"] == "suite"]
    assert {(r["category"], r["method"]) for r in table} == {(c, m) for c in ("code", "json")
                                                              for m in ("plain", "spec-k3", "lookup-k4")}
    for row in table:
        mine = [r for r in runs if r["category"] == row["category"] and r["method"] == row["method"]]
        steps = [(st, src) for r in mine for st, src in zip(r["steps"], r["step_sources"])]
        assert int(row["steps"]) == len(steps) == sum(r["n_passes"] for r in mine)
        assert first_number(row["MAT"]) == pytest.approx(sum(st[0] for st, _ in steps) / len(steps), abs=0.0051)
        by = {}
        for st, src in steps:
            by.setdefault(src or "none", []).append(st[0])
        shown = dict(re.findall(r"(\w+) ([\d.]+) \(\d+%\)", row["by draft source: MAT (share of steps)"]))
        assert set(shown) == set(by)
        for src, tokens in by.items():
            assert float(shown[src]) == pytest.approx(sum(tokens) / len(tokens), abs=0.0051)
        expected = {"plain": {"none"}, "spec-k3": {"model", "none"}, "lookup-k4": {"lookup", "none"}}[row["method"]]
        assert set(by) <= expected


def test_mat_of_runs_recorded_before_step_sources_comes_from_their_mode():
    from speclocal.bench.metrics import mat

    old = [{"mode": "lookup", "steps": [[3, 4, 2, 0.1], [1, 0, 0, 0.2]]},  # no step_sources: results.json from before
           {"mode": "auto", "steps": [[5, 4, 4, 0.1]], "step_sources": ["store"]}]
    m = mat(old)
    assert m["mat"] == pytest.approx(3.0) and m["steps"] == 3
    assert {k: v["mat"] for k, v in m["by_source"].items()} == {"lookup": 3.0, "none": 1.0, "store": 5.0}
    assert m["by_source"]["store"]["accepted"] == 4 and m["by_source"]["lookup"]["share"] == pytest.approx(1 / 3)


def test_auto_is_set_against_the_best_fixed_choice_per_category():
    def st(speedup, tps=20.0):
        return {"tps": {"median": tps}, "speedup": None if speedup is None else {"median": speedup}}

    rows = auto_vs_best({
        "code-edit": {"plain": st(None), "spec-k3": st(0.7), "lookup-k4": st(1.25), "auto": st(1.3, 26.0)},
        "qa": {"plain": st(None), "spec-k3": st(0.5), "auto": st(0.95)},
        "no-auto": {"plain": st(None), "spec-k3": st(0.5)},
    })
    assert [(r["category"], r["best"]) for r in rows] == [("code-edit", "lookup-k4"), ("qa", "plain")]
    assert rows[0]["vs_best"] == pytest.approx(1.3 / 1.25) and rows[0]["vs_plain"] == pytest.approx(1.3)
    assert rows[0]["auto_tps"] == 26.0 and rows[0]["plain_tps"] == 20.0
    assert rows[1]["vs_best"] == rows[1]["vs_plain"] == pytest.approx(0.95)
    assert rows[0]["ceiling"] is None  # no plain run carries a hindsight ceiling
    # auto's median speedup as a share of the median ceiling of the category's prompt turns
    suite = [{"category": "code-edit", "method": "plain", "hindsight": h} for h in (1.4, 1.6, 1.5)]
    (row,) = auto_vs_best({"code-edit": {"plain": st(None), "auto": st(1.2)}}, suite + [{"category": "qa", "hindsight": 9}])
    assert row["ceiling"] == pytest.approx(1.5) and row["of_ceiling"] == pytest.approx(0.8)


def test_auto_is_set_against_the_best_fixed_choice_end_to_end_too():
    """By decode speed the draft model wins; end to end its prompt processing makes lookup the best fixed choice,
    and the row says in how many of auto's runs the draft model processed the prompt."""
    def st(speedup, e2e):
        return {"tps": {"median": 20.0}, "speedup": {"median": speedup}, "speedup_e2e": {"median": e2e}}

    suite = [{"category": "rag", "method": "auto", "auto": {"draft_model_brought_in": x}} for x in (None, None, {"at": 0})]
    (row,) = auto_vs_best({"rag": {"plain": st(1.0, 1.0), "spec-k3": st(1.3, 0.6), "lookup-k4": st(1.1, 1.05),
                                   "auto": st(1.05, 1.02)}}, suite)
    assert row["best"] == "spec-k3" and row["vs_best"] == pytest.approx(1.05 / 1.3)
    assert row["e2e"]["best"] == "lookup-k4" and row["e2e"]["vs_best"] == pytest.approx(1.02 / 1.05)
    assert (row["e2e"]["draft_prompt_runs"], row["e2e"]["runs"]) == (1, 3)


def test_end_to_end_speedup_sets_an_answer_against_plain_giving_as_many_tokens():
    """An answer that parts from plain's at a near tie and stops sooner is set against plain's prompt time plus
    that many tokens at plain's rate: the prompt time it shares out over fewer tokens counts neither for nor
    against it. Equal lengths: the ratio of total times."""
    from speclocal.bench.metrics import attach_speedups
    from speclocal.engine.types import e2e_speedup

    def run(method, n, t_prompt, t_decode):
        return {"phase": "suite", "question_id": "q", "turn": 1, "rep": 0, "method": method, "n_generated": n,
                "t_prompt": t_prompt, "t_decode": t_decode, "decode_tps": n / t_decode}

    plain, same, shorter = run("plain", 64, 4.0, 8.0), run("suffix", 64, 4.0, 4.0), run("auto", 32, 4.0, 2.0)
    attach_speedups([plain, same, shorter])
    assert plain["speedup_e2e"] == 1.0 and same["speedup_e2e"] == pytest.approx(12 / 8)
    assert shorter["speedup"] == same["speedup"] == pytest.approx(2.0)
    assert shorter["speedup_e2e"] == pytest.approx((4 + 32 / 8) / 6)  # 1.33x; tokens per total second said 1.00x
    assert e2e_speedup(10, 0.0, 1.0, 10.0) is None and e2e_speedup(10, 1.0, 1.0, 0.0) is None


def test_the_bench_records_the_hindsight_ceiling_of_each_greedy_turn(tiny_run):
    """Each prompt turn's first plain run carries the ceiling of copying from the context, replayed over its own
    tokens on the bench's curve: between 1x (nothing to copy) and exact copying's best on that curve."""
    from speclocal.policy.costmodel import CostCurve

    _, out, _, _ = tiny_run
    data = json.loads((out / "results.json").read_text())
    curve = CostCurve.from_dict(data["profile"])
    plain = [r for r in data["runs"] if r["phase"] == "suite" and r["method"] == "plain"]
    carried = [r["hindsight"] for r in plain if "hindsight" in r]
    assert len(carried) == len({(r["question_id"], r["turn"]) for r in plain}) == 2
    best = max((k + 1) / curve.V(k + 1) for k in range(curve.k_max + 1))
    assert all(1.0 <= h <= best + 1e-9 for h in carried)


def test_plots_are_valid_pngs(tiny_run):
    _, out, _, _ = tiny_run
    from matplotlib import image

    for name in PLOTS:
        raw = (out / name).read_bytes()
        assert raw[:8] == PNG_MAGIC, name
        pixels = image.imread(out / name)
        assert pixels.shape[0] > 200 and pixels.shape[1] > 300
        assert pixels.std() > 0.01  # not a blank canvas


# ---- a Spec-Bench-format file with its own categories ----------------------------------------------
def test_spec_bench_questions_file_is_reported_per_category(tmp_path, smollm2, capsys):
    qfile = tmp_path / "question.jsonl"
    rows = [
        {"question_id": 81, "category": "translation", "turns": ["Translate to French: good morning, friends."]},
        {"question_id": 82, "category": "translation", "turns": ["Translate to German: the cat sleeps."]},
        {"question_id": 83, "category": "math_reasoning",
         "turns": ["What is 12 times 7?", "Now divide that by 4."]},
    ]
    qfile.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "out"
    rc = bench_main(["--questions", str(qfile), "--per-category", "1", "-n", "12", "--methods", "plain,lookup",
                     "-m", str(smollm2), "-c", "512", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    data = json.loads((out / "results.json").read_text())
    assert data["settings"]["categories"] == ["translation", "math_reasoning"]
    assert data["settings"]["suite"] == str(qfile)
    runs = data["runs"]
    assert {r["question_id"] for r in runs} == {"81", "83"}  # --per-category 1
    assert sorted((r["turn"], r["method"]) for r in runs if r["question_id"] == "83") == [
        (0, "lookup-k4"), (0, "plain"), (0, "plain"), (1, "lookup-k4"), (1, "plain"), (1, "plain")]
    # turn 2 continues the conversation: its prompt holds turn 1 and plain's answer
    t0, t1 = (next(r for r in runs if r["question_id"] == "83" and r["turn"] == t and r["method"] == "plain")
              for t in (0, 1))
    assert t1["n_prompt"] > t0["n_prompt"] + t0["n_generated"]
    table = parse_md_table((out / "report.md").read_text(), "category")
    assert [(r["category"], r["method"]) for r in table] == [("translation", "lookup-k4"), ("math_reasoning", "lookup-k4")]
    assert table[1]["prompts"] == "2"  # two turns of one conversation
    assert set(data["summary"]["categories"]) == {"translation", "math_reasoning"}


# ---- Ctrl-C keeps what is finished ------------------------------------------------------------------
def interrupt_after(monkeypatch, runs: int):
    """Send SIGINT (what Ctrl-C sends) once the bench has recorded `runs` runs; returns the real `record_of`."""
    from speclocal.bench import runner

    real = runner.record_of
    calls = []

    def record_then_interrupt(*a, **kw):
        rec = real(*a, **kw)
        calls.append(rec)
        if len(calls) == runs:
            os.kill(os.getpid(), signal.SIGINT)
        return rec

    monkeypatch.setattr(runner, "record_of", record_then_interrupt)
    return real


def test_interrupt_writes_a_partial_report_and_exits_130(tmp_path, smollm2, monkeypatch, capsys):
    interrupt_after(monkeypatch, 3)
    out = tmp_path / "out"
    rc = bench_main(["--categories", "qa,creative", "--per-category", "2", "-n", "8", "--methods", "plain,lookup",
                     "-m", str(smollm2), "-c", "512", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 130
    assert "interrupted" in err and "Traceback" not in err
    data = json.loads((out / "results.json").read_text())
    assert data["partial"] is True and data["runs_done"] == 3 < data["runs_planned"] == 12
    assert len(data["runs"]) == 3
    report = (out / "report.md").read_text()
    assert report.startswith("# speclocal bench report (PARTIAL)") and "3 of 12 planned runs" in report
    assert all((out / p).is_file() for p in PLOTS)


def test_resume_keeps_finished_prompts_and_runs_the_rest(tmp_path, smollm2, monkeypatch, capsys):
    from speclocal.bench import runner

    real = interrupt_after(monkeypatch, 4)  # the first prompt finished (plain, lookup, plain), the second cut short
    out = tmp_path / "out"
    common = ["-n", "8", "--methods", "plain,lookup", "-m", str(smollm2), "-c", "512", "--out", str(out)]
    assert bench_main(["--categories", "qa,creative", "--per-category", "2", *common]) == 130
    first = json.loads((out / "results.json").read_text())
    assert first["runs_done"] == 4 and "--resume" in capsys.readouterr().err
    monkeypatch.setattr(runner, "record_of", real)

    # the same bench continued: no --categories needed, the earlier prompts are the plan
    assert bench_main(["--resume", *common]) == 0
    err = capsys.readouterr().err
    assert "resuming: 3 runs of 1 finished prompt repetitions kept from 1 earlier sitting" in err, err
    data = json.loads((out / "results.json").read_text())
    assert data["partial"] is False and data["runs_done"] == len(data["runs"]) == 12
    assert data["runs"][:3] == first["runs"][:3]  # kept as measured
    cut_short = first["runs"][3]["question_id"]
    assert sum(r["question_id"] == cut_short for r in data["runs"]) == 3  # run again whole
    assert len(data["sittings"]) == 2 and data["started"] == first["started"]
    # a run is predicted from the cost curves of its own sitting: each curve names the sitting that measured it
    assert [p["sitting"] for p in data["profiles"]] == [0] * len(first["profiles"]) + [1] * (
        len(data["profiles"]) - len(first["profiles"]))
    assert set(data["summary"]["categories"]) == {"qa", "creative"}
    assert not (out / ".partial.json").exists()
    assert "(PARTIAL)" not in (out / "report.md").read_text()

    # a finished bench: nothing to run; another setting: refused, one line, the results untouched
    assert bench_main(["--resume", *common]) == 0
    assert "nothing left to run" in capsys.readouterr().err
    before = (out / "results.json").read_bytes()
    more = ["--categories", "json", "--per-category", "1"]
    for changed, message in ((["-n", "16"], "n_predict 8, this one with 16"),
                             ([*more, "-c", "1024"], "ctx_size 512, this one with 1024")):
        assert bench_main(["--resume", *common, *changed]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err
        assert (out / "results.json").read_bytes() == before

    # a category added to a finished bench: only its prompt runs, the report covers all three
    assert bench_main(["--resume", *more, *common]) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["runs_done"] == 15 and data["runs"][:12] == json.loads(before)["runs"]
    assert len(data["sittings"]) == 3 and set(data["summary"]["categories"]) == {"qa", "creative", "json"}
    assert data["settings"]["categories"] == ["qa", "creative", "json"]


def test_auto_learns_priors_within_the_bench_alone(tmp_path, smollm2, fresh_priors):
    """A bench's auto starts from the default task priors (the warm-up's lessons forgotten) and learns into
    auto-priors.json in --out (what --resume goes on from): it neither reads nor changes the user's."""
    from speclocal.policy.auto import DEFAULT_PRIORS, LENGTH, PRIORS_VERSION

    user = json.dumps({"version": PRIORS_VERSION, "learnt": {"json": {LENGTH: 7.0}, "edit": {LENGTH: 7.0}}})
    fresh_priors.write_text(user)
    out = tmp_path / "out"
    out.mkdir()
    own = out / "auto-priors.json"
    own.write_text(json.dumps({"version": PRIORS_VERSION, "learnt": {"chat": {LENGTH: 7.0}}}))
    assert bench_main(["--categories", "json", "--per-category", "1", "-n", "32", "--methods", "plain,auto",
                       "-m", str(smollm2), "-c", "1024", "--out", str(out)]) == 0
    assert fresh_priors.read_text() == user
    (run,) = [r for r in json.loads((out / "results.json").read_text())["runs"] if r["method"] == "auto"]
    assert run["auto"]["expected_length"] == DEFAULT_PRIORS["json"][LENGTH]  # not the user's 7, not the warm-up's
    learnt = json.loads(own.read_text())["learnt"]
    assert set(learnt) == {"json"}, learnt  # not the user's edit, not an earlier bench's chat, not the warm-up's code
    assert "auto-priors.json beside this report" in (out / "report.md").read_text()


def test_resume_refuses_another_cpu_sold_under_the_same_name():
    from speclocal.models.cpu import cpu_signature
    from speclocal.bench.resume import check_same_bench

    core = "processor\t: {}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: {}\nmodel name\t: AMD EPYC\nstepping\t: 1\n"
    zen3, zen4 = (cpu_signature("\n".join(core.format(i, model) for i in range(2))) for model in (1, 17))
    assert zen3 == "AuthenticAMD family 25 model 1 stepping 1" and zen4.endswith("model 17 stepping 1")
    arm = "processor : 0\nCPU implementer : 0x41\nCPU variant : 0x0\nCPU part : 0xd05\nCPU revision : 0\n\n" \
          "processor : 1\nCPU implementer : 0x41\nCPU variant : 0x1\nCPU part : 0xd0b\nCPU revision : 1\n"
    assert cpu_signature(arm) == "Arm implementer 0x41 part 0xd05 r0x0p0 + Arm implementer 0x41 part 0xd0b r0x1p1"

    bench = {"models": {}, "methods": ["plain"], "settings": {}}
    epyc = {"cpu": "AMD EPYC", "cpu_signature": zen3, "cores_logical": 2, "llama_cpp_python": "0.3.36",
            "llama_cpp_system_info": "CPU : AVX2 = 1 | FMA = 1 |"}

    def check(earlier: dict, later: dict) -> None:
        check_same_bench(bench | {"machine": earlier}, bench | {"machine": later})

    check(epyc, epyc | {"llama_cpp_system_info": "CPU : FMA = 1 | AVX2 = 1"})  # the same features, other order
    old = {k: v for k, v in epyc.items() if k != "cpu_signature"}
    check(old, epyc)  # a bench from before the signature was recorded is not refused for lacking it
    with pytest.raises(SpeclocalError, match="machine cpu_signature '.*model 1 .*', this one with '.*model 17 "):
        check(epyc, epyc | {"cpu_signature": zen4})
    avx512 = "CPU : AVX2 = 1 | FMA = 1 | AVX512 = 1 | AVX512_BF16 = 1 |"
    with pytest.raises(SpeclocalError, match=r"features no others, this one with 'AVX512 = 1 \| AVX512_BF16 = 1'; "
                                             "resume on the machine that measured it"):
        check(old, old | {"llama_cpp_system_info": avx512})


@pytest.mark.parametrize("results, extra, message", [
    (None, [], "no bench to continue in"),
    ('{"format": "speclocal-bench/1", "runs": []}', [], "is not the results of a speclocal bench this version can"),
    ('{"format": "speclocal-bench/1", "runs": []}', ["--store"], "--resume cannot continue a bench with --store"),
])
def test_resume_without_a_bench_it_can_continue_is_one_clean_line(tmp_path, capsys, results, extra, message):
    out = tmp_path / "out"
    if results is not None:
        out.mkdir()
        (out / "results.json").write_text(results)
    rc = bench_main(["--resume", *extra, "--out", str(out), "-m", str(tmp_path / "no-such-model.gguf")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and message in err, err
    if results is None:
        assert not out.exists()  # nothing made where there was nothing to continue
    else:
        assert (out / "results.json").read_text() == results  # nothing lost


# ---- bad input: one clear line, exit 2, before any model loads ----------------------------------------
@pytest.mark.parametrize("case, args, message", [
    ("category", ["--categories", "code,poetry"], "unknown category 'poetry' (choose from code, code-edit"),
    ("method", ["--methods", "plain,medusa"], "unknown method 'medusa' (choose from plain, spec, lookup, suffix, auto)"),
    ("draft-max", ["--draft-max", "2,x"], "--draft-max takes comma-separated integers"),
    ("bad-json", ["--questions", "{bad}"], "line 2: not valid JSON"),
    ("no-turns", ["--questions", "{noturns}"], "line 1: missing 'turns'"),
    ("empty-turns", ["--questions", "{emptyturns}"], "'turns' must be a non-empty list"),
    ("no-file", ["--questions", "{missing}"], "cannot read questions file"),
    ("out", ["--out", "{unwritable}"], "cannot write to --out"),
    ("reps", ["--reps", "0"], "--reps must be >= 1"),
    ("profile-every", ["--profile-every", "-5"], "--profile-every must be >= 0, got -5"),
    ("draft-min", ["--draft-max", "2,4", "--draft-min", "3"], "--draft-min must be <= the shortest draft length (spec-k2)"),
    ("draft-min-lookup", ["--lookup-max", "2", "--draft-min", "3"], "the shortest draft length (lookup-k2), got 3"),
    ("temp", ["--temp", "nan"], "--temp must be a finite number, got nan"),
])
def test_bad_input_is_one_clean_line_before_loading(tmp_path, capsys, case, args, message):
    files = {
        "bad": '{"question_id": 1, "category": "a", "turns": ["hi"]}\n{"question_id": 2, "category": "a", "turns": [\n',
        "noturns": '{"question_id": 1, "category": "a", "prompt": "hi"}\n',
        "emptyturns": '{"question_id": 1, "category": "a", "turns": []}\n',
    }
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    subs = {"missing": str(tmp_path / "nope.jsonl"), "unwritable": str(blocker / "out")}
    for key, text in files.items():
        (tmp_path / f"{key}.jsonl").write_text(text)
        subs[key] = str(tmp_path / f"{key}.jsonl")
    args = [a.format(**subs) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "out")]
    # a model that does not exist: the error must come first, from checks made before any loading
    rc = bench_main([*args, "-m", str(tmp_path / "no-such-model.gguf")])
    cap = capsys.readouterr()
    assert rc == 2
    assert cap.err.count("\n") == 1 and message in cap.err and "Traceback" not in cap.err, cap.err
    assert cap.err.startswith("speclocal: error: ")


# ---- pieces without models -------------------------------------------------------------------------
def test_builtin_suite_has_every_category():
    qs = load_questions(None)
    assert len(qs) == 51 and len({q.question_id for q in qs}) == len(qs)
    count = {c: sum(q.category == c for q in qs) for c in suite_mod.categories_of(qs)}
    minimum = {"code": 8, "code-edit": 6, "json": 6, "qa": 6, "creative": 6, "multi-turn": 4, "editing-session": 4,
               "long-context": 2}
    assert set(count) == set(minimum)
    assert all(count[c] >= n for c, n in minimum.items()), count
    assert all(len(q.turns) == 3 for q in qs if q.category == "multi-turn")
    edits = [q.turns[0] for q in qs if q.category == "code-edit"]
    assert all("```" in t and ("whole" in t or "complete" in t) for t in edits)  # code in, the whole file back
    sessions = [q.turns for q in qs if q.category == "editing-session"]
    assert all(len(turns) >= 4 for turns in sessions)  # several edits of one file in a row
    assert all("```" in turns[0] and "```" not in "".join(turns[1:]) for turns in sessions)  # the file comes once
    assert all("whole" in t or "complete" in t for turns in sessions for t in turns)  # every answer: the whole file
    assert {q.stability for q in suite_mod.stability_questions(qs)} == {"code", "chat"}


def test_long_context_prompts_are_2k_to_4k_tokens(tiny_main):
    import llama_cpp

    vocab = llama_cpp.Llama(str(tiny_main), vocab_only=True, verbose=False)
    qs = [q for q in load_questions(None) if q.category == "long-context"]
    sizes = [len(vocab.tokenize(q.turns[0].encode(), add_bos=False)) for q in qs]
    assert len(sizes) >= 2 and all(2000 <= n <= 4000 for n in sizes), sizes


def test_quick_selects_two_per_category_one_conversation_one_long_context_short_generations():
    from speclocal.bench.session import Plan
    from speclocal.cli import bench

    p = argparse.ArgumentParser()
    bench.add_arguments(p)
    plan = Plan(p.parse_args(["--quick", "--methods", "plain,spec,lookup"]))
    per_cat = {c: sum(q.category == c for q in plan.questions) for c in plan.categories}
    assert per_cat["long-context"] == per_cat["multi-turn"] == per_cat["editing-session"] == 1
    assert all(n == 2 for c, n in per_cat.items() if c not in ("long-context", "multi-turn", "editing-session"))
    assert plan.settings.n_predict == 80 and plan.settings.reps == 1 and plan.settings.stability_n == 0
    assert plan.settings.bracket is False  # one plain run per turn: --quick stays under 10 minutes
    full = Plan(p.parse_args([]))
    assert full.settings.n_predict == 256 and full.settings.stability_n == 512 and len(full.stability) == 2
    assert full.settings.bracket is True
    assert Plan(p.parse_args(["--no-bracket"])).settings.bracket is False
    assert Plan(p.parse_args(["--quick", "--bracket"])).settings.bracket is True
    assert len(full.questions) == len(load_questions(None)) - 2
    # --draft-min is checked against the bench's own draft lengths, not the default draft max (3)
    deep = Plan(p.parse_args(["--draft-max", "4,8", "--draft-min", "4"]))
    assert [m.k for m in deep.methods if m.mode == "spec"] == [4, 8] and deep.settings.draft_min == 4


def test_a_plain_run_that_gave_no_tokens_is_left_out_of_the_drift():
    """A prompt whose first token ends the answer (0 t/s) must not stop the report (and so every --resume)."""
    from speclocal.bench.metrics import plain_drift

    def run(q, order, tps):
        return {"phase": "suite", "question_id": q, "turn": 0, "rep": 0, "method": "plain", "order": order,
                "decode_tps": tps}

    drift = plain_drift([run("a", 0, 0.0), run("a", 2, 0.0), run("b", 0, 10.0), run("b", 2, 11.0)])
    assert drift["n"] == 1 and drift["median"] == pytest.approx(1.1)


def test_run_order_alternates_and_brackets_plain():
    ms = parse_methods(["spec", "lookup"], [3], [4])
    names = lambda i, bracket: [m.name for m in run_order(ms, i, bracket)]  # noqa: E731
    assert names(0, False) == ["plain", "spec-k3", "lookup-k4"] and names(1, False) == ["lookup-k4", "spec-k3", "plain"]
    assert names(0, True) == ["plain", "spec-k3", "lookup-k4", "plain"]
    assert names(1, True) == ["plain", "lookup-k4", "spec-k3", "plain"]
    assert [m.name for m in run_order(ms[:1], 1, True)] == ["plain"]  # plain alone is not run twice


def test_each_prompt_runs_its_methods_in_both_orders_across_repetitions():
    """With an odd number of prompts the task index alone would give each prompt the same order in every
    repetition (13 quick prompts: auto always last for some), so a position effect in the machine's speed
    would never cancel; the key is the prompt's place in its repetition plus the repetition."""
    from types import SimpleNamespace

    from speclocal.bench.runner import BenchRunner, BenchSettings
    from speclocal.suite import Question
    from speclocal.engine import Sampling

    engine = SimpleNamespace(main=SimpleNamespace(tokenize=lambda text, add_special=False: text.split(), n_ctx=4096))
    questions = [Question(f"q{i}", "code", ("say hi",)) for i in range(3)]
    runner = BenchRunner(engine, parse_methods(["spec", "lookup"], [3], [4]), questions, [],
                         BenchSettings(n_predict=8, reps=2, sampling=Sampling(temp=0.0), bracket=True))
    orders = {(t.question.question_id, t.rep): [m.name for m in run_order(runner.methods, t.order, True)]
              for t in runner.tasks}
    for q in questions:
        first, second = orders[(q.question_id, 0)], orders[(q.question_id, 1)]
        assert first[1:-1] == second[1:-1][::-1]  # the methods between the two plains, reversed
    assert orders[("q0", 0)] != orders[("q1", 0)]  # and from one prompt to the next


def test_methods_expand_draft_lengths_and_keep_plain_first():
    ms = parse_methods(["spec", "lookup"], parse_int_list("2,4", "--draft-max"), [8])
    assert [(m.name, m.mode, m.k) for m in ms] == [("plain", "plain", 0), ("spec-k2", "spec", 2),
                                                   ("spec-k4", "spec", 4), ("lookup-k8", "lookup", 8)]
    with pytest.raises(SpeclocalError, match=">= 1"):
        parse_int_list("0,2", "--draft-max")


def test_windows_measure_tokens_per_second_per_32_tokens():
    # 96 tokens: one per 0.05 s, then the last 32 twice as fast
    steps, t = [], 0.0
    for i in range(96):
        t += 0.05 if i < 64 else 0.025
        steps.append((1, 0, 0, t))
    w = windows(steps)
    assert [n for n, _ in w] == [32, 64, 96]
    assert [round(r, 6) for _, r in w] == [20.0, 20.0, 40.0]
    # passes that emit several tokens: a window closes at the first pass end past 32 tokens
    w = windows([(20, 3, 3, 1.0), (20, 3, 3, 2.0), (30, 3, 3, 3.0)])
    assert w == [(40, 20.0)]


def test_report_is_a_pure_function_of_results_json(tiny_run, tmp_path):
    import shutil

    from speclocal.bench.report import rerender

    _, out, _, _ = tiny_run
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "report.md").unlink()
    rerender(copy)
    assert (copy / "report.md").read_text() == (out / "report.md").read_text()
    assert json.loads((copy / "results.json").read_text())["summary"] == json.loads(
        (out / "results.json").read_text())["summary"]


def test_methods_default_to_every_engine_mode():
    assert [m.name for m in parse_methods(None, [3], [4])] == ["plain", "spec-k3", "lookup-k4", "suffix-k16", "auto"]
    assert [m.name for m in parse_methods(["suffix"], [3], [4], [8, 16])] == ["plain", "suffix-k8", "suffix-k16"]
    with pytest.raises(SpeclocalError, match="unknown method 'fast'"):
        parse_methods(["plain", "fast"], [3], [4])


def test_auto_explanation_is_kept_in_the_record():
    from dataclasses import dataclass

    import numpy as np

    from speclocal.bench.runner import Method, Task, record_of
    from speclocal.suite import Question
    from speclocal.engine import GenerationResult, MemoryParts

    @dataclass
    class Choice:
        source: str
        k: int

    fields = dict(mode="auto", text="x", tokens=[1, 2], from_draft=[False, True], stop_reason="length", n_prompt=5,
                  n_prompt_cached=0, t_prompt=0.1, ttft=0.2, n_generated=2, t_decode=0.1, decode_tps=20.0, n_drafted=1,
                  n_accepted=1, acceptance=1.0, n_passes=1, tokens_per_pass=2.0, t_draft=0.0, t_verify=0.1,
                  t_sample=0.0, draft_share=0.0, peak_rss=1, memory=MemoryParts(10, 20, 30, 40),
                  steps=[(2, 1, 1, 0.1)])
    res = GenerationResult(**fields)
    res.auto = {"decisions": {"lookup": 1}, "last": Choice("lookup", 4), "draft_cost": np.float32(0.5)}
    rec = record_of(res, Method("auto", "auto", 0), Task("suite", Question("q", "code", ("hi",)), 0, 2, 1.0), 0, 0)
    assert rec["auto"] == {"decisions": {"lookup": 1}, "last": {"source": "lookup", "k": 4}, "draft_cost": 0.5}
    assert rec["draft_memory_added"] == 60 and json.dumps(rec)


def test_compare_bench_runs_matches_the_report_pools_runs_and_flags_disagreement(tiny_run, tmp_path, capsys,
                                                                               load_script):
    """scripts/compare_bench_runs.py on a real run: a run agrees with itself at the report's medians; a copy
    whose code spec ratios are 20 % higher disagrees in exactly that cell; "+" pools the pair ratios; "@N" picks a
    repetition."""
    cmp = load_script("compare_bench_runs")
    _, out, _, _ = tiny_run
    a = out / "results.json"
    data = json.loads(a.read_text())
    report_medians = {(cat, m): s["speedup"]["median"] for cat, by_m in data["summary"]["categories"].items()
                      for m, s in by_m.items() if m != "plain" and s.get("speedup")}
    assert cmp.medians({"a": cmp.load(a, None)}) == pytest.approx(report_medians) and len(report_medians) == 4
    assert cmp.main([str(a), str(a)]) == 0

    for r in data["runs"]:
        if r["category"] == "code" and r["method"] == "spec-k3" and r.get("speedup") is not None:
            r["speedup"] *= 1.2
    b = tmp_path / "results.json"
    b.write_text(json.dumps(data))
    capsys.readouterr()
    assert cmp.main([str(a), str(b), "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["category"], r["method"]) for r in rows if not r["agrees"]] == [("code", "spec-k3")]

    def ratios(path, cat, method):
        return [r["speedup"] for r in json.loads(path.read_text())["runs"]
                if r["phase"] == "suite" and r["category"] == cat and r["method"] == method]

    pooled = cmp.medians({str(path): cmp.load(path, rep) for path, rep in cmp.side(f"{a}+{b}")})
    assert pooled[("code", "spec-k3")] == pytest.approx(
        statistics.median(ratios(a, "code", "spec-k3") + ratios(b, "code", "spec-k3")))
    assert cmp.main([f"{a}+{tmp_path / 'missing.json'}", str(a)]) == 2
    data["settings"]["n_predict"] += 1
    (tmp_path / "other.json").write_text(json.dumps(data))
    capsys.readouterr()
    assert cmp.main([f"{a}+{tmp_path / 'other.json'}", str(a)]) == 2
    assert "cannot be pooled" in capsys.readouterr().err
    # PATH@N: repetition N of a run alone (this run has one)
    assert cmp.main([f"{a}@0", str(a)]) == 0
    capsys.readouterr()
    assert cmp.main([f"{a}@1", str(a)]) == 2
    assert "no suite runs in repetition 1" in capsys.readouterr().err


def test_the_report_ends_with_the_settings_to_use_elsewhere(tiny_run):
    """`speclocal serve` with auto, and per category the llama-server flags of the method recommended there."""
    _, out, _, _ = tiny_run
    data = json.loads((out / "results.json").read_text())
    report = (out / "report.md").read_text()
    section = report[report.index("## Settings to use elsewhere"):]
    assert "`speclocal serve -m " in section and "--mode auto`" in section
    for cat, rec in data["summary"]["recommendations"].items():
        line = next(x for x in section.splitlines() if x.startswith(f"  - {cat} ("))
        if rec["method"].startswith("spec"):
            assert "-md " in line and "--spec-draft-n-max 3" in line
        elif rec["method"].startswith("lookup"):
            assert "--spec-type ngram-simple" in line
        else:
            assert "plain" in line and "-md" not in line and "--spec" not in line


def test_bench_measures_the_curve_again_and_predicts_each_run_from_the_curves_around_it(smollm2):
    """With `remeasure`, the runner takes a new curve between prompts once `profile_every_s` has passed and one
    at the end; every record names the last curve measured before it, and the cost-model check predicts each
    run from the mean of the curves on either side (the real `measure` has its own tests: here a stub whose
    curves differ, so a wrong choice of curve shows)."""
    from speclocal.bench.metrics import mean_curve, prediction_check, suite_records
    from speclocal.bench.runner import BenchRunner, BenchSettings
    from speclocal.suite import Question
    from speclocal.engine import Engine, Sampling
    from speclocal.policy.costmodel import CostCurve, acceptance_mle, predicted_steps_speedup

    def curve(scale: float) -> dict:
        return CostCurve(tuple(1.0 + scale * i for i in range(17)), float("inf"), 0.01, 0.03, {"n": scale}).to_dict() | {
            "draft_cost": None}

    measured = [curve(0.2)]
    engine = Engine(smollm2, None, n_ctx=1024)
    try:
        questions = [Question(f"q{i}", "code", (f"Repeat this line twice: x{i} = [1, 2, 3, 4, 5, 6]",)) for i in range(2)]
        runner = BenchRunner(engine, parse_methods(["lookup"], [3], [4]), questions, [],
                             BenchSettings(n_predict=12, reps=1, sampling=Sampling(temp=0.0), bracket=True),
                             progress_stream=open(os.devnull, "w"), profiles=list(measured),
                             remeasure=lambda: curve(0.2 + 0.3 * len(runner.profiles)), profile_every_s=1e-9)
        assert runner.run()
    finally:
        engine.close()
    assert [p["meta"]["n"] for p in runner.profiles] == pytest.approx([0.2, 0.5, 0.8])  # start, between, end
    assert [(r["question_id"], r["profile"]) for r in runner.records] == [("q0", 0)] * 3 + [("q1", 1)] * 3
    from speclocal.bench.metrics import attach_speedups

    attach_speedups(runner.records)
    suite = suite_records(runner.records)
    check = prediction_check(suite, ["code"], runner.profiles[0], runner.profiles)
    start = prediction_check(suite, ["code"], runner.profiles[0])
    assert check["profiles"] == 3 and start["profiles"] == 1
    lookups = [r for r in suite if r["mode"] == "lookup" and acceptance_mle(r["steps"]) is not None]
    assert lookups, "the prompts are built for prompt lookup to draft"
    for r in lookups:
        c = mean_curve(runner.profiles[r["profile"]], runner.profiles[r["profile"] + 1])
        assert c.V(4) == pytest.approx(1.0 + 3 * (0.35 if r["profile"] == 0 else 0.65))
    preds = sorted(predicted_steps_speedup(r["steps"], c.cost_of("lookup"), c)
                   for r in lookups for c in [mean_curve(runner.profiles[r["profile"]], runner.profiles[r["profile"] + 1])])
    assert check["rows"][0]["predicted"] == pytest.approx(statistics.median(preds))
    assert check["rows"][0]["predicted"] != pytest.approx(start["rows"][0]["predicted"])
    from speclocal.bench.report import pct, profiles_lines

    (line, _) = profiles_lines({"profiles": runner.profiles, "summary": {"prediction_start_profile": start}})
    assert "measured 3 times" in line and "V(4) 1.60–3.40" in line and f"**{pct(start['median_error'])}**" in line
