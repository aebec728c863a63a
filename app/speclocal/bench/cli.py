"""`speclocal bench`: the seed's evaluation on your machine and models, written as a shareable report."""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
import time
from pathlib import Path

from speclocal import options
from speclocal.bench import suite as suite_mod
from speclocal.bench.metrics import attach_speedups, summarize
from speclocal.bench import runner as runner_mod
from speclocal.bench.report import (
    TABLE_ALIGN, TABLE_HEADER, category_rows, md_table, prediction_lines, recommendation_lines, write_json,
    write_outputs,
)
from speclocal.bench.runner import BenchRunner, BenchSettings, Method, parse_int_list, parse_methods
from speclocal.engine import Engine, Sampling
from speclocal.errors import SpeclocalError
from speclocal.files import read_json
from speclocal.options import add_options, settings_from_args
from speclocal.policy import open_engine
from speclocal.policy.profile import cost_curve

DEFAULT_OUT = "speclocal-bench"
DEFAULT_N = options.default("n_predict")
QUICK_N = 80  # keeps --quick under 10 minutes on a 2-core CPU (docs/benchmarks.md)
QUICK_PER_CATEGORY = 2
QUICK_CAPS = {suite_mod.LONG_CONTEXT: 1, suite_mod.MULTI_TURN: 1,  # one 3-turn conversation, one long prompt,
              suite_mod.EDITING_SESSION: 1}  # one 4-turn editing session
STABILITY_N = 512
PROFILE_MAX_AGE_S = 3600
PROFILE_EVERY_S = 300  # re-measure the cost curve this often: one profile for a 24-minute bench read every V(n)
# and c off by the machine's drift (docs/benchmarks.md, "The cost model against synthetic acceptance")
DEFAULT_CTX = 8192  # the long-context prompts are up to ~3.8k tokens, plus generation


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("suite")
    g.add_argument("--out", metavar="DIR", default=DEFAULT_OUT,
                   help=f"output directory for results.json, results.csv, report.md and plots (default ./{DEFAULT_OUT})")
    g.add_argument("--quick", action="store_true",
                   help=f"smoke run, under 10 minutes on a 2-core CPU with the tiny pair: {QUICK_PER_CATEGORY} prompts "
                        f"per category (one 3-turn conversation, one 4-turn editing session, one long-context prompt), n {QUICK_N}, 1 rep, "
                        "no stability run")
    g.add_argument("--questions", metavar="FILE",
                   help="a Spec-Bench question.jsonl ({question_id, category, turns}) instead of the built-in suite")
    g.add_argument("--categories", metavar="A,B", help="only these categories (default: all)")
    g.add_argument("--per-category", type=int, metavar="N", help="at most N prompts per category")
    g.add_argument("--methods", metavar="LIST",
                   help="comma-separated from plain, spec, lookup, suffix, auto (default: all available); plain "
                        "always runs, it is the baseline")
    g.add_argument("--draft-max", dest="draft_lengths", default=str(options.default("draft_max")), metavar="K[,K...]",
                   help="draft lengths for the draft model: one method spec-kK each (default "
                        f"{options.default('draft_max')}); auto drafts with the model up to the largest")
    g.add_argument("--lookup-max", dest="lookup_lengths", default="4", metavar="K[,K...]",
                   help="draft lengths for prompt lookup: one method lookup-kK each (default 4); auto drafts by "
                        f"lookup up to {options.default('lookup_max')} (--lookup-max's default elsewhere)")
    g.add_argument("--suffix-max", dest="suffix_lengths", default=str(runner_mod.SUFFIX_MAX), metavar="K[,K...]",
                   help="caps for the suffix drafter, which picks its own length below them: one method suffix-kK "
                        f"each (default {runner_mod.SUFFIX_MAX})")
    g.add_argument("--store", action="store_true",
                   help="let suffix and auto draft from the suffix store of earlier generations (the user's, "
                        "$SPECLOCAL_DATA_DIR). Every run reads it as it was when the bench started, and what suffix "
                        "and auto produced (never plain's answers) is added when the bench ends, so no run copies "
                        "another's answer to the same prompt; a second bench then shows what the store gives. "
                        "Default: off, so results do not depend on earlier use")
    g.add_argument("--reps", type=int, default=None,
                   help="repetitions of every measurement (default 1; use 2 or more when comparing runs: on a shared "
                        "2-core VM a category median moved ~7 %% between single runs)")
    g.add_argument("--stability-n", type=int, default=None, metavar="N",
                   help=f"tokens for the stability run (code + chat prompt, every method; default {STABILITY_N} for the "
                        "full built-in suite, 0 = off; off with --quick or --questions)")
    g.add_argument("--bracket", action=argparse.BooleanOptionalAction, default=None,
                   help="run plain before and after the other methods of each prompt turn and compare each method "
                        "with the mean of the two, so a change of the machine's speed moves method and baseline "
                        "together; one more run per turn (default: on, off with --quick)")
    g.add_argument("--profile-every", type=float, default=PROFILE_EVERY_S, metavar="SECONDS",
                   help="measure the cost curve again (~40 s) between prompts once this much time has passed, and at "
                        "the end; the cost model is checked against the curves measured around each run, and auto "
                        f"follows the latest (default {PROFILE_EVERY_S}; 0 = only the one at the start)")
    g.add_argument("--no-equivalence", action="store_true",
                   help="skip the greedy equivalence check against plain (saves one prompt evaluation per divergence)")
    add_options(p, "generation", ("n_predict", "temperature", "top_k", "top_p", "min_p", "seed", "draft_min",
                                  "draft_p_min"), n_predict=f"{DEFAULT_N}; {QUICK_N} with --quick")
    add_options(p, "models", ctx_size=f"{DEFAULT_CTX}, for the long-context prompts")
    p.set_defaults(ctx_size=DEFAULT_CTX)


def prepare_out(path: str) -> Path:
    """Create the output directory and prove it is writable, before any model is loaded."""
    out = Path(path).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".speclocal-write-test"
        probe.write_text("ok", encoding="utf-8")
        probe.unlink()
    except OSError as e:
        raise SpeclocalError(f"cannot write to --out {path}: {e.strerror or e}") from None
    return out


class Plan:
    """Everything decided from the command line alone (no model loaded yet)."""

    def __init__(self, args: argparse.Namespace):
        self.quick = args.quick
        if args.per_category is not None and args.per_category < 1:
            raise SpeclocalError(f"--per-category must be >= 1, got {args.per_category}")
        if args.profile_every < 0:
            raise SpeclocalError(f"--profile-every must be >= 0, got {args.profile_every:g}")
        reps = args.reps if args.reps is not None else 1
        if reps < 1:
            raise SpeclocalError(f"--reps must be >= 1, got {reps}")
        s = settings_from_args(args, n_predict=QUICK_N if args.quick else DEFAULT_N)
        self.settings_used = s
        method_names = suite_mod.parse_list(args.methods)
        self.methods: list[Method] = parse_methods(method_names, parse_int_list(args.draft_lengths, "--draft-max"),
                                                   parse_int_list(args.lookup_lengths, "--lookup-max"),
                                                   parse_int_list(args.suffix_lengths, "--suffix-max"))
        # one seed for every run of the bench (drawn once when --seed is -1, and recorded in its settings)
        sampling = Sampling(temp=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, seed=s.seed).seeded()
        questions = suite_mod.load_questions(args.questions)
        self.suite_name = args.questions or "the built-in suite"
        per_cat = args.per_category if args.per_category is not None else (QUICK_PER_CATEGORY if args.quick else None)
        self.questions = suite_mod.select(questions, suite_mod.parse_list(args.categories), per_cat,
                                          caps=QUICK_CAPS if args.quick else None)
        self.categories = list(dict.fromkeys(q.category for q in self.questions))
        stability_n = args.stability_n
        if stability_n is None:
            stability_n = 0 if (args.quick or args.questions or args.categories or args.per_category) else STABILITY_N
        if stability_n < 0:
            raise SpeclocalError(f"--stability-n must be >= 0, got {stability_n}")
        self.stability = suite_mod.stability_questions(suite_mod.load_questions(None)) if stability_n else []
        self.settings = BenchSettings(n_predict=s.n_predict, reps=reps, sampling=sampling, draft_min=s.draft_min,
                                      draft_p_min=s.draft_p_min, stability_n=stability_n,
                                      equivalence=not args.no_equivalence,
                                      bracket=not args.quick if args.bracket is None else args.bracket,
                                      store=bool(getattr(args, "store", False)))

    @property
    def needs_draft_model(self) -> bool:
        return any(m.mode == "spec" for m in self.methods)

    @property
    def wants_draft_model(self) -> bool:
        return any(m.uses_draft_model for m in self.methods)


def load_engine(plan: Plan) -> Engine:
    s = plan.settings_used
    if plan.needs_draft_model and s.main and not (s.draft or s.pair):
        raise SpeclocalError("method spec needs a draft model: give -md/--model-draft or --pair, "
                             "or choose --methods plain,lookup")
    return open_engine(s, need_draft=plan.wants_draft_model)


def build_data(plan: Plan, runner: BenchRunner | None, engine: Engine, machine: dict, models: dict, args,
               started: str, elapsed: float, partial: bool, profile: dict | None = None) -> dict:
    records = runner.records if runner else []
    attach_speedups(records)
    import os

    machine = dict(machine, load_average_at_end=list(os.getloadavg()) if hasattr(os, "getloadavg") else None)
    method_names = [m.name for m in plan.methods]
    summary = summarize(records, method_names, plan.categories, profile, runner.profiles if runner else None)
    return {
        "format": "speclocal-bench/1",
        "partial": partial,
        "runs_planned": runner.total_runs if runner else 0,
        "runs_done": len(records),
        "started": started,
        "elapsed_s": elapsed,
        "machine": machine,
        "models": models,
        "settings": plan.settings.to_dict() | {
            "suite": plan.suite_name, "quick": plan.quick, "threads": engine.n_threads, "ctx_size": engine.main.n_ctx,
            "n_gpu_layers": engine.n_gpu_layers, "compute": engine.compute,
            "layout": engine.layout.layout, "draft_max": args.draft_lengths, "lookup_max": args.lookup_lengths,
            "suffix_max": getattr(args, "suffix_lengths", None), "categories": plan.categories,
            "store_info": runner.store_info if runner else None,
        },
        "methods": method_names,
        "method_details": [{"name": m.name, "mode": m.mode, "k": m.k, "lookup_k": m.lookup_k} for m in plan.methods],
        "questions": [{"question_id": q.question_id, "category": q.category, "turns": len(q.turns)}
                      for q in plan.questions + (runner.stability if runner else [])],
        "warmup": runner.warmup if runner else [],
        "profile": profile,
        "profiles": runner.profiles if runner else [],
        "runs": records,
        "summary": summary,
    }


CHECKPOINT = ".partial.json"  # in --out while a bench runs: what a crash leaves for `salvage`


def run(args: argparse.Namespace) -> int:
    plan = Plan(args)  # every cheap check before touching the disk or loading models
    out = prepare_out(args.out)
    from speclocal.bench.machine import machine_info, model_info

    started = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    t0 = time.monotonic()
    machine = machine_info()
    engine = load_engine(plan)
    try:
        models = {"main": model_info(engine.main.path), "draft": model_info(engine.draft.path) if engine.draft else None}
        # the cost curve auto uses and the report checks: re-measured unless an hour old at most (an older one
        # from the same shared machine predicted much worse: docs/benchmarks.md)
        def curve_dict(**kw) -> dict:
            d = cost_curve(engine, **kw).to_dict()
            if not math.isfinite(d["draft_cost"]):
                d["draft_cost"] = None  # no draft model (results.json is strict JSON)
            return d

        def data_now(partial: bool) -> dict:
            return build_data(plan, runner, engine, machine, models, args, started, time.monotonic() - t0, partial,
                              profile)

        def checkpoint(record: dict) -> None:  # every finished run on disk, for a report after a crash
            write_json(out / CHECKPOINT, data_now(True))

        profile = curve_dict(max_age_s=PROFILE_MAX_AGE_S)
        runner = BenchRunner(engine, plan.methods, plan.questions, plan.stability, plan.settings, profiles=[profile],
                             remeasure=lambda: curve_dict(refresh=True), profile_every_s=args.profile_every,
                             on_record=checkpoint)
        print(f"speclocal bench: {len(plan.questions)} prompts in {len(plan.categories)} categories "
              f"({', '.join(plan.categories)}), methods {', '.join(m.name for m in plan.methods)}, "
              f"{runner.total_runs} measured runs -> {out}", file=sys.stderr)
        partial = not runner.run()
        if partial:
            print(f"speclocal bench: interrupted; writing a partial report of {len(runner.records)} finished runs "
                  f"(of {runner.total_runs})", file=sys.stderr)
        data = data_now(partial)
        write_outputs(out, data)
        (out / CHECKPOINT).unlink(missing_ok=True)
    finally:
        engine.close()
    show_summary(data, out)
    return 130 if partial else 0


def salvage(args: argparse.Namespace, crashed: str) -> int:
    """After the bench's process crashed: the partial report of every run it finished (its checkpoint)."""
    out = Path(args.out).expanduser()
    data = read_json(out / CHECKPOINT)
    if not isinstance(data, dict) or not data.get("runs"):
        print("speclocal bench: no run had finished: no report written", file=sys.stderr)
        return 1
    data.update(partial=True, crashed=crashed)
    print(f"speclocal bench: writing a partial report of {data['runs_done']} finished runs "
          f"(of {data['runs_planned']})", file=sys.stderr)
    write_outputs(out, data)
    (out / CHECKPOINT).unlink(missing_ok=True)
    show_summary(data, out)
    return 0


def show_summary(data: dict, out: Path) -> None:
    """The console's end of a bench: the table per category, the recommendation, predicted against measured."""
    print(md_table(TABLE_HEADER, category_rows(data["summary"]), TABLE_ALIGN))
    print()
    print("\n".join(recommendation_lines(data["summary"])))
    predicted = prediction_lines(data)
    if predicted:  # predicted against measured, per fixed method: the cost model on the machine it runs on
        print("\n" + "\n".join(line for line in predicted[4:] if line))
    print(f"\nreport: {out / 'report.md'} (results.json, results.csv and plots beside it)"
          + (" — PARTIAL" if data.get("partial") else ""))
