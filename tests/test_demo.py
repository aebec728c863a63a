"""`speclocal demo`: the headless text version on the real tiny pair; the TUI version on a fake backend."""

from __future__ import annotations

import asyncio
import re
import time

from speclocal import demo


def demo_main(argv: list[str]) -> int:
    """`speclocal demo ARGV` through the CLI."""
    from speclocal.cli import main

    return main(["demo", *argv])


def test_headless_prints_both_modes_live_and_the_comparison_table(capsys, tiny_main, tiny_draft):
    rc = demo_main(["--headless", "-n", "12", "-m", str(tiny_main), "-md", str(tiny_draft), "-c", "512"])
    out = capsys.readouterr().out
    assert rc == 0
    # both prompts, each run plain then speculative, with a stats line after the streamed text
    assert out.count("=== code:") == 1 and out.count("=== chat:") == 1
    assert out.count("--- plain ---") == 2 and out.count("--- speculative · draft model ---") == 2
    stats = re.findall(r"^\[(plain|spec)\] 12 tokens · ([\d.]+) t/s", out, re.M)
    assert [m for m, _ in stats] == ["plain", "spec", "plain", "spec"]
    assert "\x1b[" not in out  # no colour codes when stdout is not a terminal
    table = out[out.index("Comparison"):].splitlines()
    rows = [line.split() for line in table[3:] if line.strip()]
    assert [(r[0], r[1]) for r in rows] == [("code", "plain"), ("code", "spec"), ("chat", "plain"), ("chat", "spec")]
    for plain, spec in ((rows[0], rows[1]), (rows[2], rows[3])):
        a, b, ratio = float(spec[3]), float(plain[3]), float(spec[4].rstrip("x"))  # all rounded to 2 decimals
        assert (a - 0.005) / (b + 0.005) - 0.005 <= ratio <= (a + 0.005) / (b - 0.005) + 0.005
        assert spec[5].endswith("%") and plain[5] == "-"
        assert spec[8] in ("identical", "first") or spec[8].startswith("first")


def test_headless_colours_accepted_draft_tokens_when_asked(capsys, smollm2):
    rc = demo_main(["--headless", "--against", "lookup", "--color", "always", "-n", "24", "-m", str(smollm2),
                    "-c", "512"])
    out = capsys.readouterr().out
    assert rc == 0 and out.count("--- speculative · prompt lookup ---") == 2
    assert ("\x1b[32m" in out) == bool(re.search(r"\[lookup\].*acceptance [1-9]", out))


def test_bad_input_is_a_clean_error(capsys):
    rc = demo_main(["--headless", "-n", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "n-predict must be >= 1" in err


def test_tui_demo_types_both_prompts_and_fills_the_history():
    from speclocal.tui.testing import FakeBackend

    fake = FakeBackend(step_delay=0.0005)

    async def go():
        app = demo.build_demo_app(backend=fake, pause=0.2)
        async with app.run_test(size=(120, 36)) as pilot:
            deadline = time.monotonic() + 20
            while len(app.history) < 2 or app.running:
                assert time.monotonic() < deadline, "demo did not finish"
                await pilot.pause(0.05)
            await pilot.pause(0.5)
            assert [r.mode for r in fake.requests] == ["plain", "spec", "plain", "spec"]
            # each prompt in a new chat: the second request holds only its own user turn
            assert [m["content"] for m in fake.requests[2].messages] == [demo.PROMPTS[1][1]]
            assert [r.task for r in app.history] == ["code", "chat"]
            assert all(r.speedup is not None for r in app.history)
            assert not app.demo_queue and app.demo_done == ["code", "chat"]

    asyncio.run(go())


def test_json_prints_each_prompts_runs_speedups_and_agreement_only(capsys, smollm2):
    import json

    rc = demo_main(["--json", "--against", "lookup", "-n", "8", "-m", str(smollm2), "-c", "512"])
    out = capsys.readouterr().out
    data = json.loads(out)  # nothing streamed besides the one object
    assert rc == 0 and data["interrupted"] is False
    assert [p["task"] for p in data["prompts"]] == [task for task, _ in demo.PROMPTS]
    for p in data["prompts"]:
        plain, lookup = p["runs"]
        assert (plain["mode"], lookup["mode"]) == ("plain", "lookup") and plain["n_generated"] == 8
        assert p["speedup"] == lookup["decode_tps"] / plain["decode_tps"] and p["speedup_e2e"] > 0
        assert p["equivalence"]["compared"] > 0 and p["n_prompt"] == plain["n_prompt"] > 0
