"""Small costs the docs cite, each measured on the machine it runs on (the tiny pair from the catalogue).

    python scripts/step_costs.py sequences   # plain decode and a 5-token verify with one KV sequence vs two
    python scripts/step_costs.py auto        # auto's own work per step (no model: a replayed chat history)
    python scripts/step_costs.py profile     # the profile's V(n) measured again and again, and ways of timing it
    python scripts/step_costs.py layouts     # V(n) in each weight layout that runs here, flash attention on/off
    python scripts/step_costs.py depth       # V(n) and c measured deeper than the profile, against its fit

`sequences`: the main model loaded twice (n_seq_max 1 and 2), interleaved repetitions of 48 greedy single
decodes and 10 rollbacked verifies of 5 tokens. `auto`: 300 `AutoDrafter.draft()` calls over a Zipf-word
history on the cached profile, with and without the suffix drafter's runner-up. `profile`: four rounds of V(2),
V(4), V(9), V(17) timed as `speclocal profile` does (round-robin against 4-decode runs) and in adjacent pairs
(each verify between two decode runs), and a 4-decode run timed after a verify, after the draft model and
after a 5 ms pause (whether the first decode pays for threads waking up). `layouts`: the main model loaded
through llama.cpp's C API in every weight layout that survives a test decode here (`speclocal.models.layout`:
llama.cpp's default, CPU_REPACK without AMX, as stored) with flash attention auto, and in the layout speclocal
chooses with flash attention off and on, all at once, timed in turn, `--reps` times: 4-token runs of single
decodes and passes over n tokens at position 300 (medians; V(n) = a pass ÷ a single decode of the same
setting): which layout decodes faster here, and whether one flattens the verify curve. `depth`: a fresh
profile (V(n) and c 64, 1,024 and 3,072 deep), then the single decode, V(2), V(5), V(9), V(17) and c measured
again as the profile does at each of `--depths`, beside what the profile's piecewise-linear fit through its
depths predicts there (`CostCurve.at`): whether long prompts are predicted right.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from speclocal.engine import Engine
from speclocal.models import layout as layout_mod
from speclocal.engine.drafting.base import DraftParams
from speclocal.engine.drafting.lookup import PromptLookupDrafter
from speclocal.engine.drafting.model import ModelDrafter
from speclocal.engine.llama import LoadedModel
from speclocal.engine.sampling import Sampling
from speclocal.engine.drafting.suffix import SuffixDrafter
from speclocal.models.catalogue import resolve_pair
from speclocal.models.devices import compute_label, devices
from speclocal.policy.profile import CONTEXT_POS, REPS, RUN, _median_times, machine_id


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def sequences(main_path: Path, reps: int) -> None:
    models = {n: LoadedModel(main_path, 4096, 2, n_seq=n) for n in (1, 2)}
    tps, verify = {1: [], 2: []}, {1: [], 2: []}
    for rep in range(reps):
        for n in (1, 2) if rep % 2 else (2, 1):
            m = models[n]
            m.clear()
            tok = int(m.eval(m.tokenize("Write a Python function that reverses a string.", True), "last")[-1].argmax())
            t0 = time.perf_counter()
            for _ in range(48):
                tok = int(m.eval([tok], outputs="last")[-1].argmax())
            tps[n].append(48 / (time.perf_counter() - t0))
            t0 = time.perf_counter()
            for _ in range(10):
                m.eval([tok] * 5, outputs="all")
                m.truncate(len(m.tokens) - 5)
            verify[n].append((time.perf_counter() - t0) / 10)
    for n in (1, 2):
        print(f"n_seq_max {n}: decode {statistics.median(tps[n]):.1f} t/s (median; {min(tps[n]):.1f}-{max(tps[n]):.1f}), "
              f"verify of 5 tokens {statistics.median(verify[n]):.4f} s")


def auto_cost(curve_file: Path) -> None:
    import json

    from speclocal.policy.auto import DEFAULT_PRIORS, AutoDrafter
    from speclocal.policy.costmodel import CostCurve

    rng = np.random.default_rng(0)
    text = np.minimum(rng.zipf(1.3, 3000), 30000).tolist()
    curve = CostCurve.from_dict(json.loads(curve_file.read_text())["curve"])  # a `profile --json` report
    for runner_up in (False, True):
        p = DraftParams()
        auto = AutoDrafter(curve, "chat", None, PromptLookupDrafter(p), suffix=SuffixDrafter(p),
                           priors={t: dict(v) for t, v in DEFAULT_PRIORS.items()}, second_candidates=runner_up)
        history = text[:300]
        auto.prepare(history)
        times = []
        for tok in text[300:600]:
            times.append(timed(lambda: auto.draft(history, 16, Sampling(), rng)))
            auto.observe(0, 0)
            history = history + [tok]
        ms = np.array(times) * 1e3
        print(f"runner-up {'on ' if runner_up else 'off'}: AutoDrafter.draft() median {np.median(ms):.3f} ms, "
              f"mean {ms.mean():.3f}, p90 {np.percentile(ms, 90):.3f}")


def profile_spread(main_path: Path, draft_path: Path | None, rounds: int) -> None:
    engine = Engine(main_path, draft_path, n_ctx=4096)
    main = engine.main
    filler = main.tokenize("def f(x):\n    return x * 2\n" * 40, add_special=False)
    engine.reset()
    main.eval(filler[:CONTEXT_POS], outputs="none")
    probe = filler[CONTEXT_POS : CONTEXT_POS + 18]

    def decode_run() -> None:
        for t in probe[:RUN]:
            main.eval([t], outputs="all").argmax(axis=1)
        main.truncate(CONTEXT_POS)

    def verify(n: int) -> None:
        main.eval(probe[:n], outputs="all").argmax(axis=1)
        main.truncate(CONTEXT_POS)

    ns = (2, 4, 9, 17)
    for r in range(rounds):
        t = _median_times([decode_run] + [lambda n=n: verify(n) for n in ns], REPS)
        same_round = [x / t[0] * RUN for x in t[1:]]
        paired = [statistics.median(
            timed(lambda: verify(n)) / ((timed(decode_run) + timed(decode_run)) / 2) * RUN for _ in range(REPS))
            for n in ns]
        print(f"round {r}: t1 {t[0] / RUN * 1e3:.1f} ms; V{ns} round-robin "
              f"{[round(x, 2) for x in same_round]}, paired {[round(x, 2) for x in paired]}")
    after = {"after a verify": [], "after a 5 ms pause": []}
    if engine.draft is not None:
        d = engine.draft
        d.clear()
        d.eval(filler[:CONTEXT_POS], outputs="none")
        drafter = ModelDrafter(d, DraftParams(max=RUN), main.n_vocab)
        after["after the draft model"] = []
    for _ in range(3 * REPS):
        verify(9)
        after["after a verify"].append(timed(decode_run) / RUN)
        if engine.draft is not None:
            drafter.draft(filler[: CONTEXT_POS + 1], RUN, Sampling(temp=0.0), None)
            engine.draft.truncate(CONTEXT_POS)
            after["after the draft model"].append(timed(decode_run) / RUN)
        time.sleep(0.005)
        after["after a 5 ms pause"].append(timed(decode_run) / RUN)
    for what, ts in after.items():
        print(f"single decode {what}: median {statistics.median(ts) * 1e3:.1f} ms")
    engine.close()


def layouts(main_path: Path, reps: int) -> None:
    import llama_cpp.llama_cpp as ll

    from speclocal.engine.llama import init_backend

    init_backend()
    tokenizer = LoadedModel(main_path, 512, 2)
    filler = tokenizer.tokenize("def f(x):\n    return x * 2\n" * 60, add_special=False)
    chosen = tokenizer.layout
    tokenizer.close()
    ns = (4, 9, 16, 17)
    compute = compute_label(0, devices())
    usable = [name for name in layout_mod.candidates()
              if layout_mod.survives(name, [main_path], compute, 0)[0] is not False]
    settings = {f"{name}, flash auto": (name, -1) for name in usable}
    settings |= {f"{chosen}, flash off": (chosen, 0), f"{chosen}, flash on": (chosen, 1)}
    loaded = {}
    for name, (layout, flash) in settings.items():  # all loaded at once, timed in turn: drift hits all alike
        mp = ll.llama_model_default_params()
        mp.n_gpu_layers = 0
        overrides = layout_mod.apply(mp, layout, main_path)
        model = ll.llama_model_load_from_file(str(main_path).encode(), mp)
        del overrides
        cp = ll.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = 2048, 512, 512, 2, 2
        cp.flash_attn_type = flash
        loaded[name] = (model, ll.llama_init_from_model(model, cp), ll.llama_batch_init(512, 0, 1))

    def run(name: str, tokens: list[int], pos0: int) -> float:
        _, ctx, batch = loaded[name]
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, pos0 + i, 1, True
            batch.seq_id[i][0] = 0
        batch.n_tokens = len(tokens)
        t0 = time.perf_counter()
        if ll.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")
        ll.llama_synchronize(ctx)
        return time.perf_counter() - t0

    def rollback(name: str) -> None:
        ll.llama_memory_seq_rm(ll.llama_get_memory(loaded[name][1]), 0, 300, -1)

    for name in settings:
        for start in range(0, 300, 100):
            run(name, filler[start : start + 100], start)
    single = {name: [] for name in settings}
    passes = {name: {n: [] for n in ns} for name in settings}
    for rep in range(reps):
        for name in settings if rep % 2 else reversed(settings):
            for i in range(RUN):
                single[name].append(run(name, filler[300 + i : 301 + i], 300 + i))
            rollback(name)
            for n in ns:
                passes[name][n].append(run(name, filler[300 : 300 + n], 300))
                rollback(name)
    base = statistics.median(single[f"{chosen}, flash auto"])
    for name in settings:
        t1 = statistics.median(single[name])
        print(f"{name}: decode {t1 * 1e3:.0f} ms ({t1 / base:.2f} of {chosen}); "
              + ", ".join(f"V({n}) {statistics.median(passes[name][n]) / t1:.2f} "
                          f"({statistics.median(passes[name][n]) * 1e3:.0f} ms)" for n in ns), flush=True)
    for model, ctx, batch in loaded.values():
        ll.llama_batch_free(batch)
        ll.llama_free(ctx)
        ll.llama_model_free(model)


def depth(main_path: Path, draft_path: Path, depths: list[int]) -> None:
    from speclocal.policy import profile as prof

    engine = Engine(main_path, draft_path, n_ctx=max(4096, 2 * max(depths) + 64))
    try:
        curve = prof.cost_curve(engine, refresh=True)
        filler = prof._filler(engine)
        print(f"{'depth':>6} {'what':>8} {'measured':>9} {'predicted':>9} {'error':>7}")
        for d in depths:
            deep = prof._measure_deep(engine, filler, [d], REPS, curve.t_single)["deep"][0]
            fit = curve.at(d)
            rows = [("t1 ms", deep.t_single * 1e3, fit.t_single * 1e3)]
            rows += [(f"V({n})", v, fit.verify[n - 1]) for n, v in deep.verify]
            rows.append(("c", deep.draft_cost, fit.draft_cost))
            for what, m, p in rows:
                print(f"{d:>6} {what:>8} {m:>9.2f} {p:>9.2f} {(p - m) / m:>+7.1%}")
    finally:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("sequences", "auto", "profile", "layouts", "depth"))
    ap.add_argument("--depths", default="1024,3000", help="depth: context depths in tokens (default 1024,3000)")
    ap.add_argument("--reps", type=int, default=8, help="sequences, layouts: repetitions (default 8)")
    ap.add_argument("--rounds", type=int, default=4, help="profile: rounds (default 4)")
    ap.add_argument("--curve", type=Path, default=Path(__file__).resolve().parents[1] / "docs/profile-sweep-amd-epyc.json",
                    help="auto: a `speclocal profile --json` report whose curve auto decides on (default: the docs' one)")
    args = ap.parse_args()
    print(f"machine: {machine_id()}")
    main_path, draft_path = resolve_pair()
    if args.what == "sequences":
        sequences(main_path, args.reps)
    elif args.what == "auto":
        auto_cost(args.curve)
    elif args.what == "layouts":
        layouts(main_path, args.reps)
    elif args.what == "depth":
        depth(main_path, draft_path, [int(x) for x in args.depths.split(",")])
    else:
        profile_spread(main_path, draft_path, args.rounds)


if __name__ == "__main__":
    main()
