"""`speclocal bench --resume`: a bench continued in later sittings (after Ctrl-C, a crash, or a machine's time
running out). The earlier sittings' finished prompts are kept; the rest runs; the report covers them all."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import NoReturn

from speclocal.bench.runner import run_order
from speclocal.errors import SpeclocalError
from speclocal.files import read_json

FORMAT = "speclocal-bench/1"
CHECKPOINT = ".partial.json"  # in --out while a bench runs: what a crash leaves for `salvage` and `--resume`
# what must be the same for two sittings to be one bench (the categories may grow)
# (compared where both sittings recorded them: `cpu_signature` is newer than some benches)
SAME_MACHINE = ("cpu", "cpu_signature", "cores_logical", "llama_cpp_python", "llama_cpp_system_info")
NOT_COMPARED = ("categories", "store_info")
FIRST_NAMED = ("suite", "quick", "n_predict", "reps")  # the settings others' defaults follow: named first


def task_key(phase: str, question_id: str, rep: int) -> tuple[str, str, int]:
    """One prompt's repetition: every turn of it by every method, the unit a bench resumes by."""
    return phase, question_id, rep


def load(out: Path) -> dict:
    """The bench so far in `out`: the checkpoint a crash left, else results.json."""
    for name in (CHECKPOINT, "results.json"):
        path = out / name
        data = read_json(path)  # None when missing, or corrupt (then set aside: results.json is next)
        if data is not None:
            if not _complete(data):
                raise SpeclocalError(f"--resume: {path} is not the results of a speclocal bench this version "
                                     "can continue")
            return data
    raise SpeclocalError(f"--resume: no bench to continue in {out} (no results.json)")


def _complete(data) -> bool:
    """Whether `data` holds everything resuming reads."""
    try:
        return (data["format"] == FORMAT and isinstance(data["runs"], list) and all(
                    isinstance(r, dict) and {"phase", "question_id", "rep"} <= r.keys() for r in data["runs"])
                and all({"question_id", "category", "turns"} <= q.keys() for q in data["questions"])
                and {"bracket_plain", "stability_n", "sampling", "categories"} <= data["settings"].keys()
                and "seed" in data["settings"]["sampling"]
                and {"machine", "models", "methods", "profiles", "warmup", "started", "elapsed_s", "runs_done",
                     "profile"} <= data.keys())
    except (KeyError, TypeError, AttributeError):
        return False


def finished(data: dict) -> tuple[set[tuple], list[dict]]:
    """The prompts' repetitions finished in `data` (every turn by every method) and their runs; the runs of
    one cut short are dropped (it runs again whole: a later turn needs the earlier turns' answers)."""
    turns = {q["question_id"]: q["turns"] for q in data["questions"]}
    runs_per_turn = len(run_order(data["methods"], 0, data["settings"]["bracket_plain"]))
    count = Counter(task_key(r["phase"], r["question_id"], r["rep"]) for r in data["runs"])
    done = {k for k, n in count.items() if n == turns.get(k[1], 0) * runs_per_turn}
    return done, [r for r in data["runs"] if task_key(r["phase"], r["question_id"], r["rep"]) in done]


def _features(system_info: str) -> set[str]:
    """llama.cpp's system info ("CPU : AVX2 = 1 | AMX_INT8 = 1 | ...") as a set of its parts."""
    return {re.sub(r"^CPU :\s*", "", p.strip()) for p in system_info.split("|") if p.strip()}


def check_same_bench(earlier: dict, later: dict) -> None:
    """Refuse to join sittings measured on another machine, other models or with other settings."""
    def differ(what: str, a, b, advice: str = "resume with the same settings") -> NoReturn:
        raise SpeclocalError(f"--resume: the bench in this --out was measured with {what} {a}, this one with {b}; "
                             f"{advice}, or choose another --out")

    here = "resume on the machine that measured it"
    for key in SAME_MACHINE:
        a, b = earlier["machine"].get(key), later["machine"].get(key)
        if a is None or b is None or a == b:
            continue
        if key != "llama_cpp_system_info":
            differ(f"machine {key}", f"'{a}'", f"'{b}'", here)
        only = [" | ".join(sorted(_features(x) - _features(y))) for x, y in ((a, b), (b, a))]
        if any(only):  # name only the features that differ (AMX_INT8 = 1, ...)
            differ("llama.cpp features", *(f"'{o}'" if o else "no others" for o in only), here)
    for role in ("main", "draft"):
        a, b = (d["models"].get(role) or {} for d in (earlier, later))
        if a.get("sha256") != b.get("sha256"):
            differ(f"{role} model", *(f"{m.get('file')} (sha256 {str(m.get('sha256'))[:12]}…)" for m in (a, b)))
    if earlier["methods"] != later["methods"]:
        differ("methods", ",".join(earlier["methods"]), ",".join(later["methods"]))
    check_settings(earlier["settings"], later["settings"])


def check_settings(earlier: dict, later: dict) -> None:
    """Refuse to join sittings whose settings differ, on every setting `later` names."""
    for key in sorted(later.keys() - set(NOT_COMPARED), key=lambda k: (k not in FIRST_NAMED, k)):
        if earlier.get(key) != later[key]:
            raise SpeclocalError(f"--resume: the bench in this --out was measured with {key} {earlier.get(key)}, "
                                 f"this one with {later[key]}; resume with the same settings, or choose another --out")


def sittings(data: dict) -> list[dict]:
    """When and how long each sitting of the bench ran."""
    return data.get("sittings") or [{"started": data["started"], "elapsed_s": data["elapsed_s"],
                                     "runs_done": data["runs_done"]}]


def combine(earlier: dict, later: dict) -> dict:
    """One bench of two sittings: the earlier one's finished prompts, then the later one's runs, each run with the
    cost curve measured around it (the later curves follow the earlier ones). The summary is left to the caller
    (`session.build_data`)."""
    _, kept = finished(earlier)
    offset = len(earlier["profiles"])
    runs = kept + [dict(r, profile=r["profile"] + offset) if "profile" in r else r for r in later["runs"]]
    sitting = len(sittings(earlier))  # a run is predicted from the curves around it in its own sitting only
    profiles = ([p if "sitting" in p else dict(p, sitting=0) for p in earlier["profiles"]]
                + [dict(p, sitting=sitting) for p in later["profiles"]])
    later_sitting = {"started": later["started"], "elapsed_s": later["elapsed_s"], "runs_done": later["runs_done"]}
    ids = {q["question_id"] for q in earlier["questions"]}
    questions = earlier["questions"] + [q for q in later["questions"] if q["question_id"] not in ids]
    categories = list(dict.fromkeys(earlier["settings"]["categories"] + later["settings"]["categories"]))
    return dict(
        later, started=earlier["started"], questions=questions, settings=later["settings"] | {"categories": categories},
        elapsed_s=sum(s["elapsed_s"] for s in sittings(earlier)) + later["elapsed_s"],
        sittings=sittings(earlier) + [later_sitting], runs_planned=len(kept) + later["runs_planned"], runs_done=len(runs),
        machine=earlier["machine"] | {"load_average_at_end": later["machine"].get("load_average_at_end")},
        profile=earlier["profile"], profiles=profiles, warmup=earlier["warmup"] + later["warmup"], runs=runs)
