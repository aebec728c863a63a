"""Which draft model for a main model, by measurement on this machine (`speclocal drafts`).

For each compatible candidate: its draft cost c (timed as the profile times it, against the main model's
single decode), its acceptance by draft position per task type, the memory it adds, and the speedup the cost
model predicts at its best draft length; then the top two checked by real runs (plain, then speculative at
that length, back to back, per task type).

Acceptance by position is read teacher-forced: the main model's greedy answer to each prompt is generated
once (a plain run), and each candidate reads prompt + answer in one batched pass. With greedy verification a
draft that starts at answer position s has its first i tokens accepted exactly when the candidate's greedy
choice matches the answer at s .. s+i-1 (its own earlier drafts, where accepted, are the answer's tokens), so
one pass gives what a speculative run with draft length DRAFT_K would, from every start position instead of
only where that run's steps happened to start, in a few seconds instead of minutes. The measured check runs
the engine's real loop.

The ranking is saved per main model (`load_ranking`): the TUI's draft picker shows it."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Callable

from speclocal import locations
from speclocal.files import atomic_write, read_json
from speclocal.policy.costmodel import best_prefix, prefix_speedup
from speclocal.suite import load_questions

DRAFT_K = 8  # draft positions measured: the longest draft length ranked
N_PREDICT = 48  # tokens of each answer
PROMPTS_PER_TASK = 2
CURVE_REPS = 5  # the main model's V(n) (when no saved profile has it) and each c: medians of this many passes
TASK_SETS = {"code": "code", "json": "json", "chat": "qa"}  # task type -> the built-in suite's category
RANKING_VERSION = 1
PAYS = 1.05  # a draft pays where it is at least this much faster than plain (a 2-core machine's runs vary ±5 %)
NO_DRAFT = "no draft model pays here: use prompt lookup / suffix drafting / plain"

Progress = Callable[[str], None]


def task_prompts(per_task: int = PROMPTS_PER_TASK) -> dict[str, list[str]]:
    """The first `per_task` single-turn prompts of each task type from the built-in suite."""
    questions = load_questions(None)
    return {task: [q.turns[0] for q in questions if q.category == cat][:per_task] for task, cat in TASK_SETS.items()}


# ---- acceptance by draft position --------------------------------------------------------------------------
def run_lengths(matches: list[bool], k: int = DRAFT_K) -> list[int]:
    """For each start position s: how many of the candidate's choices from s on match the answer (at most k)."""
    out, run = [0] * len(matches), 0
    for s in range(len(matches) - 1, -1, -1):
        run = run + 1 if matches[s] else 0
        out[s] = min(run, k)
    return out


def position_counts(matches: list[bool], k: int = DRAFT_K) -> tuple[list[int], list[int]]:
    """(all accepted, drafted) per draft position 1..k over every start position whose first i tokens lie
    inside the answer: a draft from s keeps its first i tokens when the run from s is at least i long."""
    runs = run_lengths(matches, k)
    n = len(matches)
    accepted = [sum(1 for s in range(n - i + 1) if runs[s] >= i) for i in range(1, k + 1)]
    drafted = [max(n - i + 1, 0) for i in range(1, k + 1)]
    return accepted, drafted


def simulate_steps(matches: list[bool], k: int) -> list[tuple[int, int]]:
    """(drafted, accepted) per drafting step of a greedy speculative run over this answer drafting k tokens a
    step, never past its last token (as the decode loop): a step from s accepts the run there and the main model
    adds one token, so the next starts run + 1 later."""
    runs, out, s, n = run_lengths(matches, k), [], 0, len(matches)
    while s < n - 1:
        drafted = min(k, n - 1 - s)
        out.append((drafted, min(runs[s], drafted)))
        s += out[-1][1] + 1
    return out


def predict(accepted: list[int], drafted: list[int], c: float, curve) -> dict:
    """The cost model's speedup at draft lengths 1..k from acceptance by position (q[i-1]: the share of drafts
    whose first i tokens were all accepted), and the best length (0: plain beats every length)."""
    q = [a / d if d else 0.0 for a, d in zip(accepted, drafted)]
    k, s = best_prefix(q, c, curve, len(q))
    by_pos = [q[0] if q else 0.0] + [q[i] / q[i - 1] if q[i - 1] else 0.0 for i in range(1, len(q))]
    return {"q": q, "by_position": by_pos, "best_k": k, "predicted": s,
            "speedup_by_k": [prefix_speedup(q, j, c, curve) for j in range(1, len(q) + 1)]}


def teacher_matches(draft, prompt: list[int], answer: list[int]) -> list[bool]:
    """Whether the draft model's greedy choice, having read the prompt and answer[:j], is answer[j], for every j:
    as in the decode loop, whose first step drafts answer[0] onwards after the prompt's last (pending) token."""
    draft.clear()
    draft.eval(prompt[:-1], outputs="none")
    if not answer:
        return []
    seq, choice = prompt[-1:] + answer[:-1], []
    for i in range(0, len(seq), draft.n_batch):  # every position's logits: at most n_batch tokens per pass
        choice.extend(draft.eval(seq[i:i + draft.n_batch], outputs="all").argmax(axis=1))
    draft.clear()
    return [int(c) == t for c, t in zip(choice, answer)]


# ---- measuring -----------------------------------------------------------------------------------------------
def rank(main: Path, candidates: list[tuple[str, Path]], load: dict, n_predict: int = N_PREDICT,
         per_task: int = PROMPTS_PER_TASK, check_top: int = 2, progress: Progress = lambda s: None) -> dict:
    """Measure every candidate (label, path) as a draft for `main` (Engine keywords `load`: n_ctx, threads, ...)
    and check the `check_top` best by real runs. Returns the ranking (see `save_ranking`), best first."""
    from speclocal.engine import Engine
    from speclocal.models.plan import check_load
    from speclocal.policy.profile import cached_curve, draft_cost, machine_id, measure

    t_start = time.perf_counter()
    prompts = task_prompts(per_task)
    n_steps = 2 + len(candidates) + min(check_top, len(candidates))
    step = iter(range(1, n_steps + 1))

    def say(what: str) -> None:
        progress(f"[{next(step)}/{n_steps}] {what}")

    say(f"{main.name}: the main model's cost curve and its answers ({sum(map(len, prompts.values()))} prompts)")
    engine = Engine(main, None, store_dir=None, **load)
    try:
        curve = cached_curve(engine)
        curve_source = "saved profile"
        if curve is None:
            curve, curve_source = measure(engine, reps=CURVE_REPS, k_max=DRAFT_K), "measured now"
        say("plain answers")
        answers = {}
        for task, texts in prompts.items():
            answers[task] = []
            for text in texts:
                req = _request(text, "plain", n_predict)
                engine.reset()
                res = engine.generate(req)
                answers[task].append((engine.prompt_tokens(req), res.tokens))
        setup = {"threads": engine.n_threads, "compute": engine.compute, "n_ctx": engine.main.n_ctx}
    finally:
        engine.close()

    rows = []
    for label, path in candidates:
        say(f"{label}: draft cost and acceptance")
        check = check_load(main, path, load.get("n_ctx", 4096), load.get("n_gpu_layers", "auto"))
        engine = Engine(main, path, store_dir=None, **load)
        try:
            c = draft_cost(engine, CURVE_REPS)
            tasks = {}
            for task, pairs in answers.items():
                counts = [position_counts(teacher_matches(engine.draft, prompt, answer)) for prompt, answer in pairs]
                acc, drafted = ([sum(col) for col in zip(*(x[i] for x in counts))] for i in (0, 1))
                tasks[task] = {"accepted": acc, "drafted": drafted, **predict(acc, drafted, c, curve),
                               "first_prompt": predict(*counts[0], c, curve)["speedup_by_k"]}
            mem = engine.memory()
        finally:
            engine.close()
        est = check.memory.models[1]
        pool = next((p for p in check.pools if p.pool == "system RAM"), check.pools[0])
        rows.append({"label": label, "path": str(path), "quantization": check.draft.quantization,
                     "params": check.draft.n_params, "c": c, "tasks": tasks, **_overall(tasks, c, curve),
                     "memory": {"estimate": est.weights + est.kv_cache, "weights": est.weights,
                                "kv_cache": est.kv_cache, "compute": est.compute,
                                "loaded": mem.draft_weights + mem.draft_kv, "pool": pool.pool,
                                "pool_need": pool.need, "pool_available": pool.available, "fits": check.fits}})
    rows.sort(key=lambda r: -r["overall"]["predicted_drafting"])

    for row in rows[:check_top]:
        say(f"{row['label']}: measured check, plain then speculative per task type")
        engine = Engine(main, Path(row["path"]), store_dir=None, **load)
        try:
            for task, texts in prompts.items():
                t = row["tasks"][task]
                k = t["best_k"] or best_drafting_k(t)
                runs = []
                for mode in ("plain", "spec"):
                    engine.reset()
                    runs.append(engine.generate(_request(texts[0], mode, n_predict, k)))
                plain, spec = runs
                t["check"] = {"k": k, "predicted": t["speedup_by_k"][k - 1],
                              "predicted_prompt": t["first_prompt"][k - 1],  # from that prompt's own acceptance
                              "measured": spec.decode_tps / plain.decode_tps if plain.decode_tps else None,
                              "plain_tps": plain.decode_tps, "spec_tps": spec.decode_tps,
                              "acceptance": spec.acceptance, "n_generated": spec.n_generated}
        finally:
            engine.close()
    ranking = {"version": RANKING_VERSION, "main": str(main), "main_key": _file_key(main), "machine": machine_id(),
               **setup, "n_predict": n_predict, "prompts_per_task": per_task, "draft_k": DRAFT_K,
               "curve": {"source": curve_source, "t_single": curve.t_single,
                         "verify": list(curve.verify[: DRAFT_K + 1])},
               "candidates": rows, "measured_at": time.time(),
               "seconds": round(time.perf_counter() - t_start, 1)}
    ranking["answer"] = answer(ranking)
    return ranking


def _request(text: str, mode: str, n_predict: int, k: int = DRAFT_K):
    from speclocal.engine import GenerationRequest
    from speclocal.engine.drafting.base import DraftParams

    return GenerationRequest(messages=({"role": "user", "content": text},), mode=mode, n_predict=n_predict,
                             draft=DraftParams(max=k, p_min=0.0), store="off")


def best_drafting_k(task: dict) -> int:
    """The draft length the cost model likes best, plain left out (what a check of a draft that does not pay runs)."""
    by_k = task["speedup_by_k"]
    return max(range(1, len(by_k) + 1), key=lambda k: by_k[k - 1])


def _overall(tasks: dict, c: float, curve) -> dict:
    """One draft length for every task type: the one with the best geometric mean of the predicted speedups."""
    means = [math.exp(sum(math.log(t["speedup_by_k"][k - 1]) for t in tasks.values()) / len(tasks))
             for k in range(1, DRAFT_K + 1)]
    k = max(range(1, DRAFT_K + 1), key=lambda j: means[j - 1])
    return {"overall": {"best_k": k if means[k - 1] > 1.0 else 0, "predicted": max(means[k - 1], 1.0),
                        "k_drafting": k, "predicted_drafting": means[k - 1]}}


# ---- the answer ----------------------------------------------------------------------------------------------
def value(row: dict, task: str) -> tuple[float, int, str]:
    """What a candidate gives for a task type: (speedup, draft length, "measured" or "predicted"): the real runs'
    where it was checked, else the cost model's at its best length."""
    t = row["tasks"][task]
    chk = t.get("check")
    if chk and chk.get("measured"):
        return chk["measured"], chk["k"], "measured"
    return t["predicted"], t["best_k"], "predicted"


def overall_value(row: dict) -> tuple[float, int]:
    """(speedup over every task type, the one draft length for all): the geometric mean of the measured ones
    where the candidate was checked, else of the predicted ones at that length."""
    checks = [t["check"]["measured"] for t in row["tasks"].values() if t.get("check", {}).get("measured")]
    k = row["overall"]["k_drafting"]
    if len(checks) < len(row["tasks"]):
        return row["overall"]["predicted_drafting"], k
    return math.exp(sum(math.log(v) for v in checks) / len(checks)), k


def answer(ranking: dict) -> dict:
    """The best draft per task type and overall where one pays (>= PAYS), with the flags that use it; else the
    advice to use the model-free drafters or plain."""
    rows, main = ranking["candidates"], ranking["main"]
    tasks = {}
    for task in TASK_SETS:
        best = max(rows, key=lambda r: value(r, task)[0], default=None)
        s, k, how = value(best, task) if best else (1.0, 0, "predicted")
        pays = best is not None and k > 0 and s >= PAYS
        tasks[task] = {"draft": best["label"] if pays else None, "path": best["path"] if pays else None,
                       "k": k if pays else 0, "speedup": s, "how": how}
    best = max(rows, key=lambda r: overall_value(r)[0], default=None)
    s, k = overall_value(best) if best else (1.0, 0)
    pays = best is not None and s >= PAYS
    out = {"tasks": tasks, "overall": {"draft": best["label"] if pays else None, "path": best["path"] if pays else None,
                                       "k": k if pays else 0, "speedup": s}}
    use = out["overall"] if pays else next((t for t in tasks.values() if t["draft"]), None)
    out["flags"] = flags(main, use["path"], use["k"]) if use else None
    out["advice"] = None if use else NO_DRAFT
    return out


def flags(main: str, draft: str, k: int) -> dict:
    """The command lines that run `main` with `draft` drafting k tokens a step."""
    pair = f"-m {main} -md {draft} --draft-max {k}"
    return {"tui": f"speclocal {pair}", "serve": f"speclocal serve {pair} --mode spec",
            "llama-server": f"llama-server {pair} --draft-min 0 --draft-p-min 0"}


# ---- saved rankings (the TUI's draft picker reads them) ---------------------------------------------------------
def _file_key(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size}:{st.st_mtime_ns}"


def ranking_path(main: Path) -> Path:
    return locations.rankings_dir() / f"{hashlib.sha256(str(main.resolve()).encode()).hexdigest()[:20]}.json"


def save_ranking(ranking: dict) -> Path | None:
    """Save a measured ranking; where it went, or None where the cache could not be written (the ranking is
    still shown, and measured again next time)."""
    path = ranking_path(Path(ranking["main"]))
    try:
        atomic_write(path, json.dumps(ranking, indent=1))
    except OSError as e:
        logging.getLogger(__name__).warning("could not save the draft ranking to %s: %s", path, e)
        return None
    return path


def load_ranking(main: Path) -> dict | None:
    """The saved ranking for `main`, or None (none saved, or the file or the machine has changed since)."""
    from speclocal.policy.profile import machine_id

    try:
        data = read_json(ranking_path(main))
        ok = (isinstance(data, dict) and data.get("version") == RANKING_VERSION
              and data.get("main_key") == _file_key(main) and data.get("machine") == machine_id())
    except OSError:
        return None
    return data if ok else None


def ranking_note(ranking: dict, draft: Path) -> str | None:
    """One line on a candidate from a saved ranking: its place and speedup per task type, or None if not in it."""
    for place, row in enumerate(ranking["candidates"], 1):
        if Path(row["path"]).resolve() == draft.resolve():
            per = " ".join(f"{task} {s:.2f}x" if k else f"{task} plain"
                           for task in row["tasks"] for s, k, _ in [value(row, task)])
            return f"#{place}: {per}"
    return None
