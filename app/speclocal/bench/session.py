"""One bench session: the plan decided from the command line, the models loaded, every run measured, the
report written (and checkpointed after each run)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from dataclasses import replace
from pathlib import Path

from speclocal import options
from speclocal.bench import resume
from speclocal.bench import suite as suite_mod
from speclocal.bench.resume import CHECKPOINT
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
PRIORS = "auto-priors.json"  # in --out: auto's task priors, from the defaults and learnt within this bench alone
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


def stability_questions(stability_n: int) -> list:
    """The stability run's prompts (none when it is off)."""
    return suite_mod.stability_questions(load_questions(None)) if stability_n else []


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
        draft_ks = parse_int_list(args.draft_lengths, "--draft-max")
        s = settings_from_args(args, n_predict=QUICK_N if args.quick else DEFAULT_N, draft_max=max(draft_ks))
        self.settings_used = s
        method_names = suite_mod.parse_list(args.methods)
        self.methods: list[Method] = parse_methods(method_names, draft_ks,
                                                   parse_int_list(args.lookup_lengths, "--lookup-max"),
                                                   parse_int_list(args.suffix_lengths, "--suffix-max"))
        shortest = min((m for m in self.methods if m.k), key=lambda m: m.k, default=None)
        if shortest is not None and s.draft_min > shortest.k:  # every drafter drops drafts shorter than it
            raise SpeclocalError(f"--draft-min must be <= the shortest draft length ({shortest.name}), got "
                                 f"{s.draft_min}")
        # one seed for every run of the bench (drawn once when --seed is -1, and recorded in its settings)
        sampling = Sampling(temp=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p, seed=s.seed).seeded()
        questions = load_questions(args.questions)
        self._suite = [q for q in questions if q.category != suite_mod.STABILITY_CATEGORY]
        self._chosen = bool(args.categories or args.per_category is not None or args.quick)  # prompts named
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
        self._stability_named = args.stability_n is not None
        self.stability = stability_questions(stability_n)
        self.settings = BenchSettings(n_predict=s.n_predict, reps=reps, sampling=sampling, draft_min=s.draft_min,
                                      draft_p_min=s.draft_p_min, stability_n=stability_n,
                                      equivalence=not args.no_equivalence,
                                      bracket=not args.quick if args.bracket is None else args.bracket,
                                      store=bool(getattr(args, "store", False)))

    def include(self, earlier: dict) -> None:
        """`--resume`: the plan is the earlier sittings' prompts, and those chosen by --categories,
        --per-category or --quick besides; their seed and stability run are kept unless named."""
        ids = [q["question_id"] for q in earlier["questions"] if q["category"] != suite_mod.STABILITY_CATEGORY]
        missing = sorted(set(ids) - {q.question_id for q in self._suite})
        if missing:
            raise SpeclocalError(f"--resume: {', '.join(missing)} of the earlier sittings is not in {self.suite_name}")
        by_id = {q.question_id: q for q in self._suite}
        added = [q for q in self.questions if self._chosen and q.question_id not in ids]
        self.questions = [by_id[i] for i in ids] + added  # in the earlier sittings' order, then the new ones
        self.categories = list(dict.fromkeys(q.category for q in self.questions))
        if not self._stability_named:  # its default follows the prompts chosen: the earlier sittings' is meant
            n = earlier["settings"]["stability_n"]
            self.settings.stability_n = n
            self.stability = stability_questions(n)
        if self.settings_used.seed == -1:
            self.settings.sampling = replace(self.settings.sampling, seed=earlier["settings"]["sampling"]["seed"])

    def task_keys(self) -> set[tuple]:
        """Every prompt's repetition the plan measures (`resume.task_key`)."""
        return ({resume.task_key("suite", q.question_id, rep) for q in self.questions for rep in range(self.settings.reps)}
                | {resume.task_key("stability", q.question_id, 0) for q in self.stability})

    @property
    def needs_draft_model(self) -> bool:
        return any(m.mode == "spec" for m in self.methods)

    @property
    def wants_draft_model(self) -> bool:
        return any(m.uses_draft_model for m in self.methods)


def load_engine(plan: Plan, priors_file: Path) -> Engine:
    """The bench's engine; its auto learns task priors in `priors_file`, never from or into the user's, so that
    a bench's auto does not depend on earlier use (and does not change the user's)."""
    s = plan.settings_used
    if plan.needs_draft_model and not names_draft(s.pair, s.main, s.draft):
        raise SpeclocalError("method spec needs a draft model: give -md/--model-draft or --pair, "
                             "or choose --methods plain,lookup")
    return open_engine(s, need_draft=plan.wants_draft_model, priors_file=priors_file)


def settings_of(plan: Plan, engine: Engine | None, store_info: dict | None) -> dict:
    """The bench's settings as results.json records them (what a resumed sitting must share); without the
    engine, those the command line alone decides."""
    chosen = plan.settings.to_dict() | {"suite": plan.suite_name, "quick": plan.quick, **plan.lengths,
                                        "auto_priors": PRIORS}  # where auto learnt (before: the user's priors)
    if engine is None:
        return chosen
    return chosen | {
        "threads": engine.n_threads, "ctx_size": engine.main.n_ctx,
        "n_gpu_layers": engine.n_gpu_layers, "compute": engine.compute,
        "layout": engine.layout.layout, "backend_sampling": engine.backend_sampling,
        "categories": plan.categories, "store_info": store_info,
    }


def build_data(plan: Plan, runner: BenchRunner | None, engine: Engine, machine: dict, models: dict, started: str,
               elapsed: float, partial: bool, profile: dict | None = None, earlier: dict | None = None) -> dict:
    """results.json's content: this sitting's runs, after the earlier sittings' (`--resume`), summarized."""
    import os

    machine = dict(machine, load_average_at_end=list(os.getloadavg()) if hasattr(os, "getloadavg") else None)
    data = {
        "format": resume.FORMAT,
        "partial": partial,
        "runs_planned": runner.total_runs if runner else 0,
        "runs_done": len(runner.records) if runner else 0,
        "started": started,
        "elapsed_s": elapsed,
        "machine": machine,
        "models": models,
        "settings": settings_of(plan, engine, runner.store_info if runner else None),
        "methods": [m.name for m in plan.methods],
        "method_details": [{"name": m.name, "mode": m.mode, "k": m.k, "lookup_k": m.lookup_k} for m in plan.methods],
        "questions": [{"question_id": q.question_id, "category": q.category, "turns": len(q.turns)}
                      for q in plan.questions + (runner.stability if runner else [])],
        "warmup": runner.warmup if runner else [],
        "profile": profile,
        "profiles": runner.profiles if runner else [],
        "runs": runner.records if runner else [],
    }
    if earlier is not None:
        data = resume.combine(earlier, data)
    attach_speedups(data["runs"])
    data["summary"] = summarize(data["runs"], data["methods"], plan.categories, data["profile"], data["profiles"])
    return data


def run_session(plan: Plan, out: Path, earlier: dict | None = None) -> dict:
    """Load the models, run the plan and write its report into `out` (a checkpoint after every finished run,
    for a report after a crash); returns the data written, `partial` when interrupted. Given the `earlier`
    sittings' data (`--resume`), their finished prompts are not run again and the report covers them too."""
    from speclocal.bench.machine import machine_info, model_info

    started = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    t0 = time.monotonic()
    machine = machine_info()
    engine = load_engine(plan, out / PRIORS)
    try:
        models = {"main": model_info(engine.main.path), "draft": model_info(engine.draft.path) if engine.draft else None}
        done: set[tuple] = set()
        if earlier is not None:
            resume.check_same_bench(earlier, {"machine": machine, "models": models, "methods": [m.name for m in plan.methods],
                                              "settings": settings_of(plan, engine, None)})
            done, kept = resume.finished(earlier)
            print(f"speclocal bench: resuming: {len(kept)} runs of {len(done)} finished prompt repetitions kept from "
                  f"{len(resume.sittings(earlier))} earlier sitting(s)", file=sys.stderr)
        def data_now(partial: bool) -> dict:
            return build_data(plan, runner, engine, machine, models, started, time.monotonic() - t0, partial,
                              profile, earlier)

        def checkpoint(record: dict) -> None:  # every finished run on disk, for a report after a crash
            write_json(out / CHECKPOINT, data_now(True))

        # the cost curve auto uses and the report checks: re-measured unless an hour old at most (an older one
        # from the same shared machine predicted much worse: docs/benchmarks.md)
        profile = cost_curve(engine, max_age_s=PROFILE_MAX_AGE_S).to_dict()
        runner = BenchRunner(engine, plan.methods, plan.questions, plan.stability, plan.settings, profiles=[profile],
                             remeasure=lambda: cost_curve(engine, refresh=True).to_dict(),
                             profile_every_s=plan.profile_every,
                             on_record=checkpoint, done=done, priors_file=out / PRIORS)
        if earlier is None:  # a new bench starts from the default priors; a resumed one goes on from its own
            (out / PRIORS).unlink(missing_ok=True)
        print(f"speclocal bench: {len(plan.questions)} prompts in {len(plan.categories)} categories "
              f"({', '.join(plan.categories)}), methods {', '.join(m.name for m in plan.methods)}, "
              f"{runner.total_runs} measured runs -> {out}", file=sys.stderr)
        partial = not runner.run()
        if partial:
            print(f"speclocal bench: interrupted; writing a partial report of {len(runner.records)} finished runs "
                  f"(of {runner.total_runs}); the same command with --resume continues it", file=sys.stderr)
        data = data_now(partial)
        write_outputs(out, data)
        (out / CHECKPOINT).unlink(missing_ok=True)
    finally:
        engine.close()
    return data
