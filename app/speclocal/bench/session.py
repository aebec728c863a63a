"""One bench session: the plan decided from the command line, the models loaded, every run measured, the
report written (and checkpointed after each run)."""

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
from speclocal.bench.report import write_json, write_outputs
from speclocal.bench.runner import BenchRunner, BenchSettings, Method, parse_int_list, parse_methods
from speclocal.engine import Engine, Sampling
from speclocal.errors import SpeclocalError
from speclocal.models.catalogue import names_draft
from speclocal.options import settings_from_args
from speclocal.policy import open_engine
from speclocal.policy.profile import cost_curve
from speclocal.suite import load_questions

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
        self.lengths = {"draft_max": args.draft_lengths, "lookup_max": args.lookup_lengths,
                        "suffix_max": getattr(args, "suffix_lengths", None)}
        self.profile_every = args.profile_every
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
        questions = load_questions(args.questions)
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
        self.stability = suite_mod.stability_questions(load_questions(None)) if stability_n else []
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
    if plan.needs_draft_model and not names_draft(s.pair, s.main, s.draft):
        raise SpeclocalError("method spec needs a draft model: give -md/--model-draft or --pair, "
                             "or choose --methods plain,lookup")
    return open_engine(s, need_draft=plan.wants_draft_model)


def build_data(plan: Plan, runner: BenchRunner | None, engine: Engine, machine: dict, models: dict, started: str,
               elapsed: float, partial: bool, profile: dict | None = None) -> dict:
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
            "layout": engine.layout.layout, "backend_sampling": engine.backend_sampling, **plan.lengths, "categories": plan.categories,
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


def run_session(plan: Plan, out: Path) -> dict:
    """Load the models, run the plan and write its report into `out` (a checkpoint after every finished run,
    for a report after a crash); returns the data written, `partial` when interrupted."""
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
            return build_data(plan, runner, engine, machine, models, started, time.monotonic() - t0, partial,
                              profile)

        def checkpoint(record: dict) -> None:  # every finished run on disk, for a report after a crash
            write_json(out / CHECKPOINT, data_now(True))

        profile = curve_dict(max_age_s=PROFILE_MAX_AGE_S)
        runner = BenchRunner(engine, plan.methods, plan.questions, plan.stability, plan.settings, profiles=[profile],
                             remeasure=lambda: curve_dict(refresh=True), profile_every_s=plan.profile_every,
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
    return data
