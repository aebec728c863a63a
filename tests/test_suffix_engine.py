"""The suffix drafter and its store through the engine, run, bench and auto, on real GGUF models."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from speclocal.engine import DraftParams, Engine, GenerationRequest
from speclocal.engine.store.store import SuffixStore

APP = str(Path(__file__).resolve().parent.parent / "app")
NOVEL = "Write a Python function that adds two numbers and returns the sum."


def chat(text: str, mode: str, n: int = 24, **kw) -> GenerationRequest:
    return GenerationRequest(messages=({"role": "user", "content": text},), mode=mode, n_predict=n, **kw)


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file under `directory` with its size and mtime (what "untouched" means)."""
    if not directory.exists():
        return {}
    return {str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*"))}


@pytest.fixture
def smol_store(smollm2, tmp_path):
    engine = Engine(smollm2, None, n_ctx=1024, store_dir=tmp_path / "store")
    yield engine, tmp_path / "store"
    engine.close()


def test_a_second_generation_drafts_its_answer_from_the_store(smol_store):
    """The store keeps suffix generations: the same prompt again drafts the answer from it, in fewer passes;
    plain runs add nothing; request store "read" drafts from it without adding."""
    engine, d = smol_store
    engine.reset()
    plain = engine.generate(chat(NOVEL, "plain"))
    assert not d.exists()  # a plain run does not even open the store
    first = engine.generate(chat(NOVEL, "suffix"))
    store = engine.suffix_store()
    assert store.n_generations == 1 and first.store["added"] > 0 and first.store["generations"] == 1
    assert "store" not in first.step_sources
    engine.reset()
    second = engine.generate(chat(NOVEL, "suffix", store="read"))
    assert second.tokens == first.tokens == plain.tokens  # greedy: the drafter changes the speed, not the text
    assert "store" in second.step_sources
    assert second.n_passes < first.n_passes and second.tokens_per_pass > 1.5
    assert store.n_generations == 1 and second.store["added"] == 0  # "read": nothing added


def test_no_store_leaves_the_store_untouched(smol_store):
    engine, d = smol_store
    engine.generate(chat(NOVEL, "suffix", n=8, store="off"))
    assert not d.exists()  # never created
    engine.generate(chat(NOVEL, "suffix", n=8))  # now there is one
    before = snapshot(d)
    assert before
    r = engine.generate(chat(NOVEL + " Use type hints.", "suffix", n=8, store="off"))
    assert r.store is None and "store" not in r.step_sources
    assert snapshot(d) == before


def test_run_no_store_flag_and_the_user_store(capsys, smollm2, user_dirs):
    from speclocal import locations
    from speclocal.cli import main

    d = locations.suffix_store_dir()
    assert str(d).startswith(str(user_dirs["data"]))  # the tests' own data dir, never the user's
    assert main(["run", NOVEL, "--mode", "suffix", "--no-store", "-m", str(smollm2), "-n", "8", "-c", "512"]) == 0
    assert not d.exists()
    assert main(["run", NOVEL, "--mode", "suffix", "-m", str(smollm2), "-n", "8", "-c", "512"]) == 0
    out = capsys.readouterr().out
    assert "suffix store: 1 generations" in out
    assert d.is_dir() and oct(d.stat().st_mode & 0o777) == "0o700"
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in d.iterdir() if p.suffix in (".base", ".tail"))


def test_a_store_never_drafts_for_another_tokenizer(smollm2, gemma3, tmp_path):
    d = tmp_path / "store"
    raw = GenerationRequest(prompt="The seven days of the week are", mode="suffix", n_predict=24)  # gemma: no template
    a = Engine(smollm2, None, n_ctx=512, store_dir=d)
    try:
        a.generate(raw)
        fp_a = a.main.vocab_fingerprint()
        assert a.suffix_store().n_generations == 1
    finally:
        a.close()
    b = Engine(gemma3, None, n_ctx=512, store_dir=d)
    try:
        assert b.main.vocab_fingerprint() != fp_a
        assert b.suffix_store().n_generations == 0  # the same directory, another tokenizer: nothing to read
        r = b.generate(raw)
        assert "store" not in r.step_sources
        b.reset()
        again = b.generate(raw)  # its own store now has its own generation
        assert "store" in again.step_sources
    finally:
        b.close()
    assert SuffixStore(d, fp_a).n_generations == 1  # the first tokenizer's store is as it was
    assert len(list(d.glob("*.tail"))) == 2


KILLER = textwrap.dedent("""
    import os, sys
    from speclocal import files
    from speclocal.engine import Engine, GenerationRequest
    model, directory = sys.argv[1], sys.argv[2]
    e = Engine(model, None, n_ctx=512, store_dir=directory)
    req = lambda text: GenerationRequest(messages=({"role": "user", "content": text},), mode="suffix", n_predict=12)
    r = e.generate(req("Write a haiku about rivers."))
    print(e.main.vocab_fingerprint(), " ".join(map(str, e.prompt_tokens(req("Write a haiku about rivers.")) + r.tokens)),
          flush=True)
    files.os.replace = lambda a, b: os._exit(9)  # the next store write dies with its temp file complete
    e.generate(req("Write a haiku about mountains."))
    print("not killed", flush=True)
""")


def test_a_kill_during_the_engines_store_write_leaves_a_readable_store(smollm2, tmp_path):
    d = tmp_path / "store"
    p = subprocess.run([sys.executable, "-c", KILLER, str(smollm2), str(d)], capture_output=True, text=True,
                       timeout=300, env=dict(os.environ, PYTHONPATH=APP))
    assert p.returncode == 9, p.stderr[-2000:]
    fp, tokens = p.stdout.splitlines()[0].split(" ", 1)
    store = SuffixStore(d, fp)
    assert not list(d.glob("*.corrupt-*"))
    assert store.generations() == [[int(t) for t in tokens.split()]]  # the first generation, whole; not the second
    assert list(d.glob("*.tmp"))  # it died with its temp file written: the store is the old one
    store.add([1, 2, 3], [4, 5])
    assert not list(d.glob("*.tmp")) and store.n_generations == 2  # the next write clears it and goes on


def test_compare_stays_fair_with_the_store_on(smol_store):
    """`run --mode compare`: plain never adds to the store, so the other mode cannot copy plain's answer."""
    from speclocal.compare import compare

    engine, d = smol_store
    report = compare(engine, chat(NOVEL, "plain"), chat(NOVEL, "suffix"))
    plain, suffix = report["runs"]
    assert "store" not in suffix.step_sources  # the store held nothing of this prompt
    assert engine.suffix_store().n_generations == 1  # the suffix run's own output, added after it ran
    assert report["equivalence"].identical


def test_bench_with_store_reads_it_as_it_was_and_adds_only_suffix_and_auto_outputs(smollm2, tmp_path):
    """Both repetitions see the same store (nothing added mid-bench), so they draft alike; at the end the
    store holds one output per prompt turn of the suffix runs, never plain's."""
    from speclocal.bench.runner import BenchRunner, BenchSettings, parse_methods
    from speclocal.suite import Question
    from speclocal.engine import Sampling

    d = tmp_path / "store"
    engine = Engine(smollm2, None, n_ctx=1024, store_dir=d)
    try:
        engine.generate(chat("Write a haiku about rivers.", "suffix", n=8))  # an unrelated earlier generation
        q = Question("q1", "editing-session", (NOVEL, "Rename the function to `plus`. Return the whole file."))
        settings = BenchSettings(n_predict=20, reps=2, sampling=Sampling(temp=0.0, seed=1), store=True)
        runner = BenchRunner(engine, parse_methods(["suffix"], [3], [4], [16]), [q], [], settings,
                             progress_stream=open(os.devnull, "w"))
        assert runner.run()
        suffix = [r for r in runner.records if r["method"] == "suffix-k16"]
        by_rep = {(r["turn"], r["rep"]): r for r in suffix}
        for turn in (0, 1):
            a, b = by_rep[(turn, 0)], by_rep[(turn, 1)]
            # the same drafts: rep 2 did not find rep 1's answer in the store
            assert [s[:3] for s in a["steps"]] == [s[:3] for s in b["steps"]]
            assert a["step_sources"] == b["step_sources"]  # (drafts from the earlier, unrelated generation alike)
        info = runner.store_info
        assert info["before"]["generations"] == 1 and info["after"]["generations"] == 3  # + one per turn
        store = SuffixStore(d, engine.main.vocab_fingerprint())
        plain_outputs = [r["text"] for r in runner.records if r["method"] == "plain"]
        assert store.n_generations == 3 and plain_outputs
        # a bench without --store neither reads nor writes it
        before = snapshot(d)
        off = BenchRunner(engine, parse_methods(["suffix"], [3], [4], [16]), [q], [],
                          replace(settings, reps=1, store=False), progress_stream=open(os.devnull, "w"))
        assert off.run() and snapshot(d) == before
        assert all("store" not in r["step_sources"] for r in off.records)  # off: the store is not read either
    finally:
        engine.close()


def test_auto_drafts_a_multi_turn_edit_with_the_suffix_drafter_and_keeps_chat_plain(tiny_main, fresh_priors):
    """The real tiny main model on this machine's measured curve: the second edit of a file (the file and the
    first edit already in the conversation) is drafted from the suffix drafter; a chat question stays plain."""
    from speclocal.policy import auto_drafter

    code = ("def total(items):\n    result = 0\n    for item in items:\n        result += item['price'] * item['qty']\n"
            "    return result\n\n\ndef summary(items):\n    t = total(items)\n    return f'{len(items)} items, "
            "total {t:.2f}'\n")
    renamed = code.replace("total(", "order_total(")
    messages = ({"role": "user", "content": f"Rename `total` to `order_total` and return the whole file.\n\n```python\n{code}```"},
                {"role": "assistant", "content": f"```python\n{renamed}```"},
                {"role": "user", "content": "Rename `summary` to `describe`. Return the whole file."})
    engine = Engine(tiny_main, None, n_ctx=2048, auto_drafter=auto_drafter)
    try:
        edit = engine.generate(GenerationRequest(messages=messages, mode="auto", n_predict=80,
                                                 draft=DraftParams(lookup_max=16)))
        d = edit.auto["decisions"]
        assert edit.auto["task"] == "edit" and "suffix" in edit.auto["sources"]
        assert d.get("suffix", 0) > 0 and "suffix" in edit.step_sources, d
        assert edit.tokens_per_pass > 1.5, (edit.tokens_per_pass, d)
        engine.reset()
        talk = engine.generate(chat("What are three benefits of regular walks?", "auto", n=48))
        d = talk.auto["decisions"]
        assert talk.auto["task"] == "chat"
        assert d.get("plain", 0) >= 0.8 * sum(d.values()), d
    finally:
        engine.close()
