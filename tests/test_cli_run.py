"""`speclocal run` through the real CLI: JSON report of compare, and clean errors on bad input."""

import json

import pytest

from speclocal.cli import main


def test_compare_json_reports_both_modes_speedup_and_equivalence(capsys, tiny_main, tiny_draft):
    rc = main(["run", "Write a Python function that reverses a string.", "--mode", "compare", "-n", "16",
               "-m", str(tiny_main), "-md", str(tiny_draft), "-c", "512", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    plain, spec = out["runs"]
    assert (plain["mode"], spec["mode"]) == ("plain", "spec")
    assert plain["n_generated"] == spec["n_generated"] == 16
    assert plain["acceptance"] is None and 0 < spec["acceptance"] <= 1
    assert spec["n_drafted"] > 0 and spec["tokens_per_pass"] > 1
    assert out["speedup"] == pytest.approx(spec["decode_tps"] / plain["decode_tps"])
    # end to end: prompt processing (the draft model's own too) plus decoding, each mode from empty caches
    for r in (plain, spec):
        assert r["t_total"] == pytest.approx(r["t_prompt"] + r["t_decode"]) and r["n_prompt_cached"] == 0
        assert r["e2e_tps"] == pytest.approx(16 / r["t_total"]) and r["e2e_tps"] < r["decode_tps"]
    # plain's time for as many tokens over spec's (equal lengths here: the ratio of total times)
    assert out["speedup_e2e"] == pytest.approx(
        (plain["t_prompt"] + spec["n_generated"] / plain["decode_tps"]) / spec["t_total"])
    assert out["speedup_e2e"] == pytest.approx(plain["t_total"] / spec["t_total"], rel=1e-6)
    assert plain["seed"] == spec["seed"]  # compared modes sample from one seed, recorded
    eq = out["equivalence"]
    assert eq["tokens_match_until"] <= eq["compared"] == 16
    assert eq["identical"] == (eq["tokens_match_until"] == 16)
    assert spec["memory"]["draft_weights"] > 0 and spec["memory"]["main_kv"] > 0
    # what llama.cpp holds per device (this CPU: the host only), its KV buffer the size the engine computes
    for role in ("main", "draft"):
        held = spec["memory"][f"{role}_held"]
        assert list(held) == ["host"] and held["host"]["kv"] == pytest.approx(spec["memory"][f"{role}_kv"], abs=2**20 / 100)
        assert held["host"]["weights"] >= spec["memory"][f"{role}_weights"] * 0.99 and held["host"]["compute"] > 0


def test_single_mode_streams_text_then_stats(capsys, smollm2):
    rc = main(["run", "Count: 1, 2, 3,", "--raw", "--mode", "lookup", "-m", str(smollm2), "-n", "12", "-c", "256"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "decode tokens/s" in out and "acceptance" in out
    assert "held by llama.cpp: host " in out and "(draft" not in out  # one model, all of it on the host


@pytest.mark.parametrize(
    "args, message",
    [
        (["--mode", "spec", "--draft-max", "0"], "--draft-max must be >= 1"),
        (["--temp", "-1"], "--temp must be >= 0"),
        (["--temp", "nan"], "--temp must be a finite number, got nan"),
        (["--draft-p-min", "inf"], "--draft-p-min must be a finite number, got inf"),
        (["-n", "0"], "n-predict must be >= 1"),
        (["-m", "no/such/model.gguf"], "model file not found"),
        (["-m", "no-such-id"], "unknown model"),
        pytest.param(["-c", "4000000"], "not enough memory", marks=pytest.mark.models),  # reads the pair's headers
    ],
)
def test_bad_input_is_one_clean_line(capsys, args, message):
    rc = main(["run", "hello", *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def test_incompatible_pair_is_refused_with_the_rule(capsys, tiny_main, smollm2):
    rc = main(["run", "hello", "--mode", "spec", "-m", str(tiny_main), "-md", str(smollm2)])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert "cannot draft for" in err and "n_vocab" in err


def test_prompt_over_context_is_refused(capsys, smollm2):
    rc = main(["run", "word " * 400, "--mode", "plain", "-m", str(smollm2), "-c", "256"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "context is 256" in err


def test_standard_input_that_is_not_utf8_is_one_clean_line(capsys, monkeypatch):
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("caf\xe9 au lait".encode("cp1252"))))
    rc = main(["run", "-", "-n", "1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "standard input is not UTF-8 text" in err, err
