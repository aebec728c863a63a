"""How fast can model-free drafting make these prompts on this machine at best? A replay, not a timing.

    python scripts/lookup_ceiling.py [--pair tiny] [--categories code-edit,editing-session] [-n 128]
                                     [--profile FILE] [--answers FILE] [--no-copy]
                                     [--mat [--suffix-alpha A] [--store-others] | --calibration [--write-priors FILE]
                                      | --steps] [--json]

For each built-in prompt of the categories, turn by turn (each later turn continuing from the main model's own
answer, as the bench does), the main model's greedy answer is generated once; then drafting policies are
replayed over it token by token, and each step is charged this machine's measured cost curve (`speclocal
profile`: V(d+1) single-token decodes for a pass over d drafted tokens + 1), or the curve in `--profile FILE`
(a bench results.json, or a profile file; `memory-bound`: a GPU's or unified memory's, V(n) ≈ 1). Greedy
verification accepts a draft's longest prefix equal to the answer, so the replay gives exactly the steps a real
run would take; only the clock is the cost model's.

`--answers FILE` keeps the greedy answers in FILE and reuses them (a replay then takes seconds, not a model run;
docs/replay-answers-tiny-n128.json holds the tiny pair's at -n 128 on the AMD EPYC development machine).

Policies: `lookup-kK` is PromptLookupDrafter at draft length K (what `--mode lookup` runs); `suffix-k16` the
SuffixDrafter (`--mode suffix`, no store; `--no-copy`: without its copy pointer, here and in auto and the
hindsight); `auto-lookup` the AutoDrafter with prompt lookup only, `auto` with the suffix drafter and lookup
(what `--mode auto` runs), both with default priors and no draft model (on a curve where the draft model
cannot pay, auto never runs it); `hindsight` is `speclocal.bench.ceiling.hindsight_speedup`: at every step
whichever is accepted longest of the continuation of every earlier occurrence of the current token and the
suffix drafter's candidate branches, cut to the length that pays best; no policy that copies from the context
or follows the suffix drafter's candidates can beat it. `auto/ceiling` is auto's share of it. `--steps`
prints, before the table, every step auto drafted (where auto loses). `copy ceiling` is max_k (k+1)/V(k+1),
exact copying at the best k.

`--mat` prints instead the mean accepted tokens per step (Spec-Bench's MAT, pooled per category) of lookup-k4,
suffix-k16 (`--suffix-alpha` sets its length factor) and the best copying in hindsight (the longest
continuation of any earlier occurrence at each step, up to 16, whatever it costs): no drafter that copies
from the context has a higher MAT (the copy pointer's proposals too continue an occurrence of the current
token). `--store-others` adds suffix-k16 with a store holding the answers to every other built-in prompt in FILE
(all turns of every other question: earlier work, never this conversation's own answers). `--calibration` prints
instead the suffix drafter's calibration per task type and match-length class: accepted / predicted tokens of its
proposals (k = 16) at every position of the answers, then the copy pointer's rates (hits / trials of its proposal
at every position), and the draft model's acceptance as auto estimates it (accepted / (accepted + rejections) in a
greedy run drafting --draft-max's default), each shrunk towards all tasks' value by SHRINK predicted tokens
(trials); `--write-priors FILE` also writes them as the priors file `app/speclocal/data/priors.json`, where auto's
priors (`policy.auto.DEFAULT_PRIORS`) and the pointer's defaults (`CopyPointer.PRIORS`, the row "all") come from.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np


def replay_counts(prompt: list[int], answer: list[int], drafter, k: int, curve,
                  trace: list | None = None) -> tuple[int, float]:
    """A drafter replayed over `answer`: main-model steps taken, and their cost in single decodes (each step's in
    single decodes at its depth, weighed by what such a decode takes there against plain's mean over the answer).
    `trace`: gets (position, source, drafted, accepted, cost at its depth) for every step that drafted."""
    from speclocal.engine import Sampling

    history, i, steps, cost, plain = list(prompt), 0, 0, 0.0, 0.0  # cost, plain: in seconds (t_single 0: units)
    drafter.prepare(prompt)
    rng = np.random.default_rng(0)
    while i < len(answer):
        room = min(k, len(answer) - i - 1)  # as the engine: never draft past the last token wanted
        d = drafter.draft(history, room, Sampling(), rng) if room > 0 else None
        tokens = d.tokens if d is not None else []
        accepted = 0
        while accepted < len(tokens) and i + accepted < len(answer) and tokens[accepted] == answer[i + accepted]:
            accepted += 1
        drafter.observe(len(tokens), accepted)
        deep = curve.at(len(history))  # each step in units of a single decode at its depth
        step_cost = deep.V(len(tokens) + 1) + (deep.cost_of(d.source.reported).per_step if tokens else 0.0)
        step = min(accepted + 1, len(answer) - i)
        cost += step_cost * (deep.t_single or 1.0)
        plain += step * (deep.t_single or 1.0)
        if trace is not None and tokens:
            trace.append((i, d.source.reported, len(tokens), accepted, step_cost))
        history += answer[i: i + step]
        i += step
        steps += 1
    return steps, cost / plain * len(answer) if plain else 0.0


def replay(prompt: list[int], answer: list[int], drafter, k: int, curve, trace: list | None = None) -> float:
    """Predicted speedup of a drafter over `answer`: tokens produced / cost in single decodes."""
    return len(answer) / replay_counts(prompt, answer, drafter, k, curve, trace)[1]


def copy_steps(prompt: list[int], answer: list[int], k_max: int = 16) -> int:
    """Steps of the best copying in hindsight, whatever it costs: at each step the longest continuation (up to
    k_max) of any earlier occurrence of the current token. Its MAT bounds every drafter that copies."""
    history, i, steps = list(prompt), 0, 0
    while i < len(answer):
        rest, best = answer[i:], 0
        room = min(k_max, len(rest) - 1)
        for j in range(len(history) - 1):
            if history[j] == history[-1]:
                m = 0
                while m < room and j + 1 + m < len(history) and history[j + 1 + m] == rest[m]:
                    m += 1
                best = max(best, m)
        step = min(best + 1, len(rest))
        history += rest[:step]
        i += step
        steps += 1
    return steps


class OthersStore:
    """A suffix store held in memory (what `SuffixDrafter` reads of one: its indexed segments) over `answers`."""

    def __init__(self, answers: list[list[int]]) -> None:
        from speclocal.engine.store.file_format import Records

        segment = Records.of(answers).index().segment()
        self.segments = (segment,) if segment is not None else ()


SHRINK = 20.0  # predicted tokens: a task type's calibration with little data leans on all tasks' value


def calibration_counts(prompt: list[int], answer: list[int], task: str, counts: dict) -> None:
    """Add the suffix drafter's accepted and predicted tokens at every position of `answer` to `counts`,
    keyed (task, match-length class), and the copy pointer's outcomes, keyed (task, its rate's name)."""
    from speclocal.engine import DraftParams, Sampling
    from speclocal.engine.drafting.context import ContextIndex
    from speclocal.engine.drafting.copy import CopyPointer
    from speclocal.engine.drafting.suffix import SuffixDrafter
    from speclocal.policy.auto import match_class

    index, pointer = ContextIndex(), CopyPointer()
    index.extend(prompt)
    for t in answer + [None]:  # the pointer's proposal at every position, scored at the next
        pointer.propose(index, index.match(), 16, 0.0)
        if t is not None:
            index.extend([t])
    for name, rate in pointer.rates.items():
        x = counts.setdefault((task, name), [0.0, 0.0])
        x[0] += rate.hits
        x[1] += rate.trials
    drafter = SuffixDrafter(DraftParams(lookup_max=16), copy=False)
    drafter.prepare(prompt)
    for i in range(len(answer) - 1):
        d = drafter.draft(prompt + answer[:i], min(16, len(answer) - i - 1), Sampling())
        if d.tokens:
            m = 0
            while m < len(d.tokens) and d.tokens[m] == answer[i + m]:
                m += 1
            x = counts.setdefault((task, match_class(d.match_len)), [0.0, 0.0])
            x[0] += m
            x[1] += d.expected


def model_counts(draft, prompt: list[int], answer: list[int], task: str, counts: dict) -> None:
    """Add to `counts[(task, "model")]` what auto's estimate of the draft model's acceptance would count over
    `answer` in a greedy run drafting --draft-max's default tokens a step: accepted tokens, and accepted tokens +
    rejections (a = accepted / (accepted + rejections)), from one teacher-forced pass of the draft model
    (`policy.drafts_rank.teacher_matches`, `simulate_steps`)."""
    from speclocal import options
    from speclocal.policy.drafts_rank import simulate_steps, teacher_matches

    steps = simulate_steps(teacher_matches(draft, prompt, answer), options.default("draft_max"))
    x = counts.setdefault((task, "model"), [0.0, 0.0])
    x[0] += sum(accepted for _, accepted in steps)
    x[1] += sum(accepted + (accepted < drafted) for drafted, accepted in steps)


def calibration_table(counts: dict) -> dict[str, dict[int | str, float]]:
    """Per task type: the suffix drafter's accepted / predicted per match-length class, then the copy pointer's
    rates (hits / trials), each shrunk towards all tasks' value by SHRINK predicted tokens (trials)."""
    from speclocal.engine.drafting.copy import RATES
    from speclocal.policy.auto import SUFFIX_CLASSES

    tasks = sorted({t for t, _ in counts})
    pooled = {}
    for cl in list(SUFFIX_CLASSES) + list(RATES) + ["model"]:
        acc = sum(counts.get((t, cl), (0, 0))[0] for t in tasks)
        pred = sum(counts.get((t, cl), (0, 0))[1] for t in tasks)
        pooled[cl] = acc / pred if pred else 1.0
    table = {t: {cl: (counts.get((t, cl), (0, 0))[0] + SHRINK * pooled[cl]) / (counts.get((t, cl), (0, 0))[1] + SHRINK)
                 for cl in pooled} for t in tasks}
    table["all"] = pooled
    return table


def write_priors(table: dict, path: Path) -> None:
    """Write the calibration priors auto and the copy pointer start from (`speclocal/data/priors.json`, read by
    `engine.drafting.copy.calibration_priors`), to two decimals: per task type the suffix drafter's calibration
    per match-length class and the copy pointer's rates, the pointer's rates over all tasks ("all"), and per task
    type the draft model's greedy acceptance ("model")."""
    from speclocal.engine.drafting.copy import RATES
    from speclocal.policy.auto import SUFFIX_CLASSES
    from speclocal.tasks import TASKS

    tasks = [t for t in TASKS if t in table]
    data = {"suffix": {t: {str(c): round(table[t][c], 2) for c in SUFFIX_CLASSES} for t in tasks},
            "copy": {t: {name: round(table[t][name], 2) for name in RATES} for t in ["all"] + tasks},
            "model": {t: round(table[t]["model"], 2) for t in tasks}}
    path.write_text(json.dumps(data, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pair", default=None)
    p.add_argument("--categories", default="code-edit", help="comma-separated built-in categories")
    p.add_argument("-n", "--n-predict", type=int, default=128)
    p.add_argument("--profile", help="take the cost curve from this bench results.json or profile file, or "
                                     "'memory-bound' (a GPU / unified-memory machine's, as `speclocal profile --what-if`)")
    p.add_argument("--calibration", action="store_true",
                   help="print the suffix drafter's calibration per task type and match-length class instead")
    p.add_argument("--write-priors", type=Path, metavar="FILE",
                   help="with --calibration: also write it as the priors file (app/speclocal/data/priors.json)")
    p.add_argument("--mat", action="store_true",
                   help="print instead the mean accepted tokens per step (pooled per category) of lookup-k4, "
                        "suffix-k16 and the best copying in hindsight")
    p.add_argument("--no-copy", action="store_true",
                   help="the suffix drafter without its copy pointer (in suffix-k16, auto and the hindsight), as before it")
    p.add_argument("--suffix-alpha", type=float, default=None,
                   help="the suffix drafter's length factor in suffix-k16 and auto (drafts at most alpha x match length)")
    p.add_argument("--answers", type=Path,
                   help="a cache of the greedy answers (for this -n): read from FILE where it holds them, generated "
                        "and added to FILE where it does not")
    p.add_argument("--store-others", action="store_true",
                   help="with --mat and --answers: also the suffix drafter with a store of the other prompts' answers")
    p.add_argument("--steps", action="store_true",
                   help="print every step auto drafted (position, source, drafted, accepted, cost) before the table")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)

    from speclocal.bench.ceiling import hindsight_speedup
    from speclocal.files import atomic_write
    from speclocal.engine import DraftParams, Engine, GenerationRequest
    from speclocal.engine.drafting.lookup import PromptLookupDrafter
    from speclocal.engine.drafting.suffix import SuffixDrafter
    from speclocal.models.catalogue import resolve_pair
    from speclocal.policy.auto import DEFAULT_PRIORS, AutoDrafter
    from speclocal.policy.profile import cost_curve
    from speclocal.policy.costmodel import CostCurve, memory_bound_curve
    from speclocal.suite import load_questions
    from speclocal.tasks import detect_task

    cats = [c.strip() for c in args.categories.split(",") if c.strip()]
    questions = [q for q in load_questions(None) if q.category in cats]
    if not questions:
        print(f"error: no built-in prompts in categories {cats}", file=sys.stderr)
        return 2
    curve = None
    if args.profile == "memory-bound":
        curve = memory_bound_curve()
    elif args.profile:  # read before loading any model, so a bad file fails at once
        try:
            d = json.loads(Path(args.profile).read_text(encoding="utf-8"))
            curve = CostCurve.from_dict(d.get("profile") or d.get("curve") or d)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            print(f"error: cannot read a cost curve from {args.profile}: {e}", file=sys.stderr)
            return 2
    try:
        cache = json.loads(args.answers.read_text(encoding="utf-8")) if args.answers and args.answers.exists() else {}
        cached = {(t["question_id"], t["turn"]): t for t in cache.get("turns", [])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: cannot read answers from {args.answers}: {e}", file=sys.stderr)
        return 2
    if args.store_others and not (args.mat and cached):
        print("error: --store-others needs --mat and --answers FILE holding the answers to the suite", file=sys.stderr)
        return 2
    if cached and (cache.get("n") != args.n_predict or cache.get("pair") != args.pair):
        print(f"error: the answers in {args.answers} are for -n {cache.get('n')} and pair {cache.get('pair')}",
              file=sys.stderr)
        return 2
    engine = None

    def loaded() -> Engine:
        nonlocal engine
        if engine is None:
            main_path, draft_path = resolve_pair(args.pair)
            engine = Engine(main_path, draft_path)
        return engine

    curve = curve or cost_curve(loaded(), max_age_s=3600)
    rows, counts = [], {}
    free = DraftParams(max=16, lookup_max=16)
    kw = {} if args.suffix_alpha is None else {"alpha": args.suffix_alpha}  # the suffix drafter's length factor
    kw["copy"] = not args.no_copy
    for q in questions:
        history: list[dict] = []
        for turn, content in enumerate(q.turns):
            messages = history + [{"role": "user", "content": content}]
            hit = cached.get((q.question_id, turn + 1))
            if hit is None:
                req = GenerationRequest(messages=tuple(messages), mode="plain", n_predict=args.n_predict)
                prompt = loaded().prompt_tokens(req)
                engine.reset()
                res = engine.generate(req)
                hit = cached[(q.question_id, turn + 1)] = {
                    "question_id": q.question_id, "turn": turn + 1, "prompt": prompt, "answer": res.tokens,
                    "text": res.text}
                if args.answers:
                    atomic_write(args.answers, json.dumps({"pair": args.pair, "n": args.n_predict,
                                                           "turns": list(cached.values())}))
            prompt, answer = hit["prompt"], hit["answer"]
            history = messages + [{"role": "assistant", "content": hit["text"]}]
            task = detect_task(content)
            if args.calibration:
                calibration_counts(prompt, answer, task, counts)
                model_counts(loaded().draft, prompt, answer, task, counts)
                continue
            if args.mat:
                pooled = counts.setdefault(q.category, {"tokens": 0, "lookup-k4": 0, "suffix-k16": 0, "hindsight": 0})
                pooled["tokens"] += len(answer)
                pooled["lookup-k4"] += replay_counts(prompt, answer, PromptLookupDrafter(DraftParams(lookup_max=4)),
                                                     4, curve)[0]
                pooled["suffix-k16"] += replay_counts(prompt, answer, SuffixDrafter(free, **kw), 16, curve)[0]
                pooled["hindsight"] += copy_steps(prompt, answer)
                if args.store_others:
                    store = OthersStore([t["answer"] for (qid, _), t in cached.items() if qid != q.question_id])
                    pooled["suffix+store"] = pooled.get("suffix+store", 0) + replay_counts(
                        prompt, answer, SuffixDrafter(free, store, **kw), 16, curve)[0]
                continue
            priors = {t: dict(v) for t, v in DEFAULT_PRIORS.items()}
            row = {"question_id": q.question_id, "turn": turn + 1, "category": q.category, "task": task,
                   "n": len(answer), "hindsight": hindsight_speedup(prompt, answer, curve, suffix=SuffixDrafter(free, **kw))}
            for k in (3, 4):
                row[f"lookup-k{k}"] = replay(prompt, answer, PromptLookupDrafter(DraftParams(max=k)), k, curve)
            row["suffix-k16"] = replay(prompt, answer, SuffixDrafter(free, **kw), 16, curve)
            row["auto-lookup"] = replay(prompt, answer, AutoDrafter(curve, task, None, PromptLookupDrafter(free),
                                                                    priors=priors), 16, curve)
            trace = [] if args.steps else None
            row["auto"] = replay(prompt, answer, AutoDrafter(curve, task, None, PromptLookupDrafter(free),
                                                             priors=priors, suffix=SuffixDrafter(free, **kw)), 16, curve,
                                 trace)
            if trace is not None:
                print(f"{q.question_id} turn {turn + 1}: auto {row['auto']:.2f}x; steps that drafted (position, "
                      "source, drafted, accepted, cost in decodes):")
                for pos, source, drafted, accepted, cost in trace:
                    print(f"  {pos:4d} {source:7s} {drafted:2d} {accepted:2d} {cost:5.2f}")
            row["auto/ceiling"] = row["auto"] / row["hindsight"]
            rows.append(row)
    if args.calibration:
        table = calibration_table(counts)
        if args.write_priors:
            write_priors(table, args.write_priors)
        if args.json:
            print(json.dumps(table, indent=1))
        else:
            for task, by_class in table.items():
                print(f"{task}: " + ", ".join(f"{cl}: {r:.2f}" for cl, r in by_class.items()))
        return 0
    if args.mat:
        mats = {c: {m: x["tokens"] / x[m] for m in x if m != "tokens"} for c, x in counts.items()}
        if args.json:
            print(json.dumps(mats, indent=1))
            return 0
        extra = ["suffix+store"] if args.store_others else []
        print(("| category | lookup-k4 | suffix-k16 | hindsight copy | " + "".join(f"{m} | " for m in extra)
               + "suffix ÷ lookup | hindsight ÷ lookup | " + "".join(f"{m} ÷ lookup | " for m in extra)).rstrip())
        print("|---|" + "---:|" * (5 + 2 * len(extra)))
        for c, m in mats.items():
            print((f"| {c} | {m['lookup-k4']:.2f} | {m['suffix-k16']:.2f} | {m['hindsight']:.2f} | "
                   + "".join(f"{m[x]:.2f} | " for x in extra)
                   + f"{m['suffix-k16'] / m['lookup-k4']:.2f} | {m['hindsight'] / m['lookup-k4']:.2f} | "
                   + "".join(f"{m[x] / m['lookup-k4']:.2f} | " for x in extra)).rstrip())
        return 0
    ceiling = max((k + 1) / curve.V(k + 1) for k in range(1, curve.k_max + 1))
    policies = ["lookup-k3", "lookup-k4", "suffix-k16", "auto-lookup", "auto", "hindsight", "auto/ceiling"]
    medians = {c: {pol: statistics.median(r[pol] for r in rows if r["category"] == c) for pol in policies}
               for c in cats}
    if args.json:
        print(json.dumps({"curve": curve.to_dict(), "copy_ceiling": ceiling, "rows": rows, "medians": medians},
                         indent=1))
        return 0
    print(f"curve: V(2..5) = {', '.join(f'{curve.V(n):.2f}' for n in range(2, 6))}; exact-copy ceiling "
          f"{ceiling:.2f}x")
    print("| prompt | " + " | ".join(policies) + " |")
    print("|---|" + "---:|" * len(policies))
    for r in rows:
        print(f"| {r['question_id']} turn {r['turn']} | " + " | ".join(f"{r[pol]:.2f}" for pol in policies) + " |")
    for c in cats:
        print(f"| **{c} median** | " + " | ".join(f"**{medians[c][pol]:.2f}**" for pol in policies) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
