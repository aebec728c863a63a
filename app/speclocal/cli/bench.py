"""`speclocal bench`: the seed's evaluation on your machine and models, written as a shareable report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from speclocal import options
from speclocal.bench import resume
from speclocal.bench import runner as runner_mod
from speclocal.bench.report import (
    TABLE_ALIGN, TABLE_HEADER, category_rows, md_table, prediction_lines, recommendation_lines, write_outputs,
)
from speclocal.bench.session import (
    DEFAULT_CTX, DEFAULT_N, PROFILE_EVERY_S, QUICK_N, QUICK_PER_CATEGORY, STABILITY_N, Plan, prepare_out,
    run_session, settings_of,
)
from speclocal.bench.resume import CHECKPOINT
from speclocal.errors import SpeclocalError
from speclocal.files import read_json
from speclocal.options import add_options

DEFAULT_OUT = "speclocal-bench"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("suite")
    g.add_argument("--out", metavar="DIR", default=DEFAULT_OUT,
                   help=f"output directory for results.json, results.csv, report.md, plots and auto-priors.json (what "
                        f"auto learnt within this bench) (default ./{DEFAULT_OUT})")
    g.add_argument("--resume", action="store_true",
                   help="continue the bench in --out (after Ctrl-C, a crash or a machine's time running out): its "
                        "finished prompts are kept, the rest of the plan runs (auto going on from what it learnt), and "
                        "the report covers every sitting. "
                        "The earlier sittings' prompts stay in the plan (--categories may add more); the machine, "
                        "models, methods and settings must be the same")
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


def run(args: argparse.Namespace) -> int:
    plan = Plan(args)  # every cheap check before touching the disk or loading models
    earlier = None
    if args.resume:
        if plan.settings.store:  # a cut-short prompt would draft from its own answers, stored when it stopped
            raise SpeclocalError("--resume cannot continue a bench with --store; run it again whole")
        earlier = resume.load(Path(args.out).expanduser())
        plan.include(earlier)
    out = prepare_out(args.out)
    if earlier is not None:
        done, _ = resume.finished(earlier)
        resume.check_settings(earlier["settings"], settings_of(plan, None, None))
        if plan.task_keys() <= done:
            print(f"speclocal bench: nothing left to run in {out}: every prompt of the plan is finished",
                  file=sys.stderr)
            if earlier.get("partial"):  # a checkpoint or a partial report that was in fact complete
                write_outputs(out, dict(earlier, partial=False))
                (out / CHECKPOINT).unlink(missing_ok=True)
            show_summary(earlier, out)
            return 0
    data = run_session(plan, out, earlier)
    show_summary(data, out)
    return 130 if data["partial"] else 0


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
