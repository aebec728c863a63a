"""From raw run records to the numbers the report shows. Pure functions over the JSON records.

Definitions (the report states them too):
- t/s: decode tokens per second of one run (prompt processing excluded); per category, the median over
  every run (prompt x turn x repetition) and its min-max range.
- speedup: per pair, a method's t/s divided by plain's t/s on the same prompt, turn and repetition
  (the mean of plain's two runs when they bracket the methods); per category, the median of those
  pair ratios (and their min-max).
- acceptance: accepted / drafted tokens summed over the category's runs; tokens per pass likewise
  (generated tokens / main-model passes).
- MAT (Spec-Bench's mean accepted tokens): tokens per main-model step, the main model's own token included
  (1.0 for plain), pooled over the category's runs; per draft source (auto: the draft model, lookup, the
  suffix drafter from the conversation or from its store, or no draft) over the steps whose draft came from
  it.
- memory added: the draft model's weights + KV cache, for methods that use it (0 for prompt lookup).
- verdict: "enable" when the median speedup, as shown (2 decimals), is at least ENABLE_AT and no greedy
  output differs from plain's except at a near tie; otherwise "disable".
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from speclocal.drafts import Source
from speclocal.engine.types import e2e_speedup
from speclocal.stats import spread
from speclocal.policy.costmodel import (
    CostCurve, Depth, acceptance_mle, memory_bound_curve, predicted_steps_speedup, what_if as best_per_task,
)

ENABLE_AT = 1.05
WINDOW = 32  # tokens per window for tokens/s over the generation
CONTEXT_BIN = 256  # tokens per bin for acceptance by context position


def suite_records(records: list[dict]) -> list[dict]:
    return [r for r in records if r["phase"] == "suite"]


def pair_key(r: dict) -> tuple:
    return (r["phase"], r["question_id"], r["turn"], r["rep"])


def plain_baselines(records: list[dict], rate=lambda r: r["decode_tps"]) -> dict[tuple, float]:
    """Plain's t/s (decode, or another `rate` of a run) per prompt, turn and repetition: the mean of its runs
    there (two when bracketed)."""
    runs: dict[tuple, list[float]] = defaultdict(list)
    for r in records:
        if r["method"] == "plain":
            runs[pair_key(r)].append(rate(r))
    return {k: statistics.fmean(v) for k, v in runs.items()}


def attach_speedups(records: list[dict]) -> None:
    """Set each record's `speedup` (decode t/s) and `speedup_e2e` (end to end, prompt processing by every model
    included: `e2e_speedup`) against plain of the same prompt, turn and repetition (None if unpaired)."""
    tps, prompt = plain_baselines(records), plain_baselines(records, lambda r: r["t_prompt"])
    for r in records:
        key = pair_key(r)
        p = tps.get(key)
        if r["method"] == "plain":
            r["speedup"] = r["speedup_e2e"] = 1.0
        else:
            r["speedup"] = r["decode_tps"] / p if p else None
            r["speedup_e2e"] = e2e_speedup(r["n_generated"], r["t_prompt"] + r["t_decode"], prompt[key], p) if p \
                else None


def plain_drift(records: list[dict]) -> dict | None:
    """Bracketed runs: plain's later t/s over its earlier one in each prompt turn, i.e. how much the machine's
    own speed moved while the other methods ran (None without bracketing)."""
    runs: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if r["method"] == "plain":
            runs[pair_key(r)].append(r)
    pairs = [sorted(rs, key=lambda r: r["order"]) for rs in runs.values() if len(rs) == 2]
    return spread([b["decode_tps"] / a["decode_tps"] for a, b in pairs if a["decode_tps"] > 0])  # 0: no tokens


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def step_sources(r: dict) -> list:
    """Each step's draft source (None: no draft) of a run: its recorded `step_sources`, or for a run recorded
    without them, its mode's source on every step that drafted ("auto" for auto: unknown which)."""
    sources = r.get("step_sources")
    if sources is not None and len(sources) == len(r.get("steps") or []):
        return sources
    src = Source.of_mode(r["mode"]).value if r.get("mode") in FIXED_MODES else "auto"
    return [src if s[1] > 0 else None for s in r.get("steps") or []]


def mat(runs: list[dict]) -> dict | None:
    """Mean accepted tokens per step (Spec-Bench's MAT, the main model's token included) of the runs, overall
    and per draft source: {"mat", "steps", "by_source": {source or "none": {"steps", "share", "mat",
    "accepted"}}}; `accepted` = accepted draft tokens per step of that source."""
    cells: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])  # steps, tokens, accepted
    for r in runs:
        for st, src in zip(r.get("steps") or [], step_sources(r)):
            c = cells["none" if src is None else src]
            c[0] += 1
            c[1] += st[0]
            c[2] += st[2]
    n = sum(c[0] for c in cells.values())
    if not n:
        return None
    by = {src: {"steps": c[0], "share": c[0] / n, "mat": c[1] / c[0], "accepted": c[2] / c[0]}
          for src, c in sorted(cells.items(), key=lambda x: -x[1][0])}
    return {"mat": sum(c[1] for c in cells.values()) / n, "steps": n, "by_source": by}


def group_stats(runs: list[dict], plain_runs: list[dict], method: str) -> dict:
    speedups = [r["speedup"] for r in runs if r.get("speedup") is not None]
    speedups_e2e = [r["speedup_e2e"] for r in runs if r.get("speedup_e2e") is not None]
    drafted = sum(r["n_drafted"] for r in runs)
    eqs = [r["equivalence"] for r in runs if r.get("equivalence")]
    real = [e for e in eqs if not e["identical"] and not e["near_tie"]]
    out = {
        "method": method,
        "runs": len(runs),
        "prompts": len({(r["question_id"], r["turn"]) for r in runs}),
        "tps": spread([r["decode_tps"] for r in runs]),
        "plain_tps": spread([r["decode_tps"] for r in plain_runs]),
        "speedup": spread(speedups),
        "speedup_e2e": spread(speedups_e2e),
        "acceptance": _ratio(sum(r["n_accepted"] for r in runs), drafted) if drafted else None,
        "tokens_per_pass": _ratio(sum(r["n_generated"] for r in runs), sum(r["n_passes"] for r in runs)),
        "mat": mat(runs),
        "ttft": spread([r["ttft"] for r in runs]),
        "memory_added": max((r["draft_memory_added"] for r in runs), default=0),
        "peak_rss": max((r["peak_rss"] for r in runs), default=0),
        "equivalence": {
            "checked": len(eqs),
            "identical": sum(1 for e in eqs if e["identical"]),
            "near_tie_divergences": sum(1 for e in eqs if not e["identical"] and e["near_tie"]),
            "real_divergences": len(real),
            "min_tokens_match_until": min((e["tokens_match_until"] for e in eqs), default=None),
        },
    }
    sp = out["speedup"]
    out["verdict"] = None if method == "plain" else (
        "enable" if sp is not None and round(sp["median"], 2) >= ENABLE_AT and not real else "disable")
    return out


def summarize(records: list[dict], methods: list[str], categories: list[str], profile: dict | None = None,
              profiles: list[dict] | None = None) -> dict:
    """Per category and method, overall per method, recommendations, stability, acceptance by context and,
    given the machine profile (cost curve), the cost model checked against the runs and the what-if; with the
    `profiles` measured during the run, each run is predicted from the curves measured around it (and, for
    comparison, from the first alone)."""
    suite = suite_records(records)
    by_cat: dict[str, dict[str, dict]] = {}
    for cat in categories:
        cat_runs = [r for r in suite if r["category"] == cat]
        if not cat_runs:
            continue
        plain_runs = [r for r in cat_runs if r["method"] == "plain"]
        by_cat[cat] = {m: group_stats([r for r in cat_runs if r["method"] == m], plain_runs, m)
                       for m in methods if any(r["method"] == m for r in cat_runs)}
    overall = {m: group_stats([r for r in suite if r["method"] == m], [r for r in suite if r["method"] == "plain"], m)
               for m in methods if any(r["method"] == m for r in suite)}
    return {
        "categories": by_cat,
        "overall": overall,
        "recommendations": {cat: recommend(stats) for cat, stats in by_cat.items()},
        "plain_drift": plain_drift(suite),
        "stability": stability(records, methods),
        "acceptance_by_context": acceptance_by_context(records),
        "tps_by_position": tps_by_position(records),
        "per_prompt": per_prompt(suite, methods),
        "auto": auto_choices(suite, categories),
        "auto_vs_best": auto_vs_best(by_cat, suite),
        "prediction": prediction_check(suite, categories, profile, profiles),
        "prediction_start_profile": prediction_check(suite, categories, profile) if profiles and len(profiles) > 1 else None,
        "what_if": what_if(suite, categories, profile),
    }


def recommend(stats: dict[str, dict]) -> dict:
    """The best enabled method of a category, or plain with the best (losing) method for the record."""
    candidates = [s for m, s in stats.items() if m != "plain" and s["speedup"] is not None]
    if not candidates:
        return {"method": "plain", "speedup": None, "best_other": None, "reason": "no speculative method measured"}
    best = max(candidates, key=lambda s: s["speedup"]["median"])
    if best["verdict"] == "enable":
        return {"method": best["method"], "speedup": best["speedup"]["median"], "acceptance": best["acceptance"],
                "best_other": None}
    return {"method": "plain", "speedup": 1.0, "best_other": best["method"],
            "best_other_speedup": best["speedup"]["median"], "acceptance": best["acceptance"]}


def windows(steps: list, size: int = WINDOW) -> list[tuple[int, float]]:
    """Tokens/s in consecutive windows of `size` generated tokens: [(tokens at window end, t/s)].

    Window boundaries fall on main-pass ends (a pass can emit several tokens), so a window holds
    at least `size` tokens; its rate is tokens in the window / time the window took."""
    out: list[tuple[int, float]] = []
    last_n, last_t, n = 0, 0.0, 0
    for tokens, _drafted, _accepted, t_end in steps:
        n += tokens
        if n - last_n >= size:
            dt = t_end - last_t
            if dt > 0:
                out.append((n, (n - last_n) / dt))
            last_n, last_t = n, t_end
    return out


def cv(xs: list[float]) -> float | None:
    if len(xs) < 2:
        return None
    mean = statistics.fmean(xs)
    return statistics.pstdev(xs) / mean if mean else None


def stability(records: list[dict], methods: list[str] | None = None) -> list[dict]:
    out = []
    rank = {m: i for i, m in enumerate(methods or [])}
    for r in sorted((r for r in records if r["phase"] == "stability"),
                    key=lambda r: (r["question_id"], rank.get(r["method"], len(rank)))):
        w = windows(r["steps"])
        rates = [x for _, x in w]
        out.append({"question_id": r["question_id"], "category": r["category"], "method": r["method"],
                    "n_generated": r["n_generated"], "stop_reason": r["stop_reason"], "decode_tps": r["decode_tps"],
                    "windows": w, "window_mean": statistics.fmean(rates) if rates else None,
                    "window_min": min(rates, default=None), "window_max": max(rates, default=None), "cv": cv(rates),
                    "acceptance": r["acceptance"]})
    return out


def acceptance_by_context(records: list[dict], bin_size: int = CONTEXT_BIN) -> dict[str, list[dict]]:
    """Per method: acceptance of the drafts made while the context (prompt + generated) was in each bin."""
    acc: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for r in records:
        if r["phase"] == "warmup" or not r["n_drafted"]:
            continue
        pos = r["n_prompt"]
        for tokens, drafted, accepted, _t in r["steps"]:
            if drafted:
                cell = acc[r["method"]][pos // bin_size * bin_size]
                cell[0] += accepted
                cell[1] += drafted
            pos += tokens
    return {m: [{"context_from": lo, "context_to": lo + bin_size, "accepted": a, "drafted": d, "acceptance": a / d}
                for lo, (a, d) in sorted(bins.items())] for m, bins in acc.items()}


def tps_by_position(records: list[dict]) -> dict[str, list[dict]]:
    """Per method: mean tokens/s of window j over all runs that reached it (suite and stability runs)."""
    acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        for j, (_end, rate) in enumerate(windows(r["steps"])):
            acc[r["method"]][(j + 1) * WINDOW].append(rate)
    return {m: [{"position": pos, "tps": statistics.fmean(v), "runs": len(v)} for pos, v in sorted(d.items())]
            for m, d in acc.items()}


def per_prompt(suite: list[dict], methods: list[str]) -> list[dict]:
    rows: dict[tuple, dict] = {}
    for r in suite:
        key = (r["category"], r["question_id"], r["turn"])
        row = rows.setdefault(key, {"category": key[0], "question_id": key[1], "turn": key[2], "n_prompt": r["n_prompt"],
                                    "methods": {}})
        row["methods"].setdefault(r["method"], []).append(r)
    out = []
    for row in rows.values():
        ms = {}
        for m in methods:
            runs = row["methods"].get(m)
            if not runs:
                continue
            sp = [r["speedup"] for r in runs if r.get("speedup") is not None]
            drafted = sum(r["n_drafted"] for r in runs)
            ms[m] = {"tps": spread([r["decode_tps"] for r in runs]), "speedup": spread(sp),
                     "acceptance": sum(r["n_accepted"] for r in runs) / drafted if drafted else None,
                     "n_generated": statistics.median(r["n_generated"] for r in runs)}
        out.append({k: row[k] for k in ("category", "question_id", "turn", "n_prompt")} | {"methods": ms})
    return out


def auto_choices(suite: list[dict], categories: list[str]) -> dict[str, dict]:
    """Per category: what auto mode chose, step by step, summed over its runs (from its explanations)."""
    out = {}
    for cat in categories:
        runs = [r for r in suite if r["category"] == cat and isinstance(r.get("auto"), dict)]
        if not runs:
            continue
        decisions: dict[str, int] = defaultdict(int)
        for r in runs:
            for source, n in (r["auto"].get("decisions") or {}).items():
                decisions[source] += int(n)
        predicted = [r["auto"]["predicted_speedup"] for r in runs
                     if isinstance(r["auto"].get("predicted_speedup"), (int, float))]
        out[cat] = {"runs": len(runs), "decisions": dict(decisions),
                    "tasks": sorted({str(r["auto"].get("task")) for r in runs}),
                    "predicted_speedup": statistics.median(predicted) if predicted else None,
                    "sentence": runs[0]["auto"].get("sentence")}
    return out


FIXED_MODES = ("spec", "lookup", "suffix")
PREDICTION_CONTEXTS = ((0, 512), (512, 2048), (2048, 1 << 30))  # context bins of the cost model's error, tokens


def mean_curve(a: dict, b: dict) -> CostCurve:
    """The mean of two profiles of one machine (a run measured between them is predicted from it)."""
    ca, cb = CostCurve.from_dict(a), CostCurve.from_dict(b)

    def mean(x: float | None, y: float | None) -> float | None:
        return None if x is None or y is None else (x + y) / 2

    def mean_depth(x: Depth, y: Depth) -> Depth:
        vy = dict(y.verify)
        return Depth(x.pos, (x.t_single + y.t_single) / 2, tuple((n, (v + vy[n]) / 2) for n, v in x.verify if n in vy),
                     mean(x.draft_cost, y.draft_cost))

    other = {y.pos: y for y in cb.deep}
    return CostCurve(tuple((x + y) / 2 for x, y in zip(ca.verify, cb.verify)), (ca.draft_cost + cb.draft_cost) / 2,
                     (ca.lookup_cost + cb.lookup_cost) / 2, (ca.t_single + cb.t_single) / 2, dict(ca.meta),
                     mean(ca.suffix_cost, cb.suffix_cost), mean(ca.draft_prefill, cb.draft_prefill),
                     tuple(mean_depth(x, other[x.pos]) for x in ca.deep if x.pos in other))


def prediction_check(suite: list[dict], categories: list[str], profile: dict | None,
                     profiles: list[dict] | None = None) -> dict | None:
    """The cost model against the fixed-k runs: each run's speedup predicted from its own steps
    (`predicted_steps_speedup`: their acceptance per class of draft length, their draft lengths) and the machine's
    V(n) and c (at the run's context depth), next to the measured pair ratio. Per category and method: medians
    and the relative error of the predicted median; per context bin and method: the runs' median error, and its
    median sign. The curve is
    `profile`, or, for a run that says which of `profiles` was the last measured before it, the mean of that
    one and the next (the curves measured around the run)."""
    if not profile:
        return None
    runs = predicted_runs(suite, CostCurve.from_dict(profile), profiles)
    rows = prediction_rows(runs, categories)
    errors = [x["error"] for x in rows if x["error"] is not None]
    run_errors = [abs(x["predicted"] - x["measured"]) / x["measured"] for x in runs if x["measured"]]
    return {"rows": rows, "median_error": statistics.median(errors) if errors else None,
            "median_run_error": statistics.median(run_errors) if run_errors else None, "runs": len(runs),
            "profiles": len(profiles) if profiles else 1, "by_context": prediction_by_context(runs)}


def predicted_runs(suite: list[dict], start: CostCurve, profiles: list[dict] | None) -> list[dict]:
    """Each fixed-k run that drafted: its predicted and measured speedup, and its context depth."""
    def curve_of(r: dict) -> CostCurve:
        i = r.get("profile")
        if not profiles or i is None or not 0 <= i < len(profiles):
            return start
        after = profiles[i + 1] if i + 1 < len(profiles) else None  # measured in the same sitting (`--resume`)
        if after is not None and after.get("sitting") == profiles[i].get("sitting"):
            return mean_curve(profiles[i], after)
        return CostCurve.from_dict(profiles[i])

    runs = []
    for r in suite:
        if r["mode"] not in FIXED_MODES or r.get("speedup") is None or not r.get("steps"):
            continue
        context = r["n_prompt"] + r["n_generated"] // 2  # the passes' costs at the answer's mid-point
        curve = curve_of(r).at(context)
        predicted = predicted_steps_speedup(r["steps"], curve.cost_of(Source.of_mode(r["mode"]).value), curve)
        if predicted is not None:
            runs.append({"category": r["category"], "method": r["method"], "context": context,
                         "predicted": predicted, "measured": r["speedup"]})
    return runs


def prediction_rows(runs: list[dict], categories: list[str]) -> list[dict]:
    """Per category and method: the median predicted and measured speedup, and the relative error."""
    rows = []
    for cat in categories:
        for m in dict.fromkeys(x["method"] for x in runs):
            group = [x for x in runs if x["category"] == cat and x["method"] == m]
            if not group:
                continue
            pred = statistics.median(x["predicted"] for x in group)
            meas = statistics.median(x["measured"] for x in group)
            rows.append({"category": cat, "method": m, "runs": len(group), "predicted": pred, "measured": meas,
                         "error": abs(pred - meas) / meas if meas else None})
    return rows


def prediction_by_context(runs: list[dict]) -> list[dict]:
    """Per context bin and method: the runs' median error and median signed error."""
    by_context = []
    for lo, hi in PREDICTION_CONTEXTS:
        for m in dict.fromkeys(x["method"] for x in runs):
            group = [x for x in runs if x["method"] == m and lo <= x["context"] < hi and x["measured"]]
            if group:
                errs = [(x["predicted"] - x["measured"]) / x["measured"] for x in group]
                by_context.append({"context": [lo, hi], "method": m, "runs": len(group),
                                   "median_error": statistics.median(abs(e) for e in errs),
                                   "median_signed_error": statistics.median(errs)})
    return by_context


def what_if(suite: list[dict], categories: list[str], profile: dict | None) -> list[dict] | None:
    """From each category's measured acceptance (pooled MLE over its fixed-k runs), the best predicted
    speedup and k here and on a memory-bound machine (V(n) ~ 1 for small n, draft cost 0.1)."""
    if not profile:
        return None
    curves = {"here": CostCurve.from_dict(profile), "memory_bound": memory_bound_curve()}
    sources = {mode: Source.of_mode(mode).value for mode in FIXED_MODES}
    acceptance: dict[str, dict[str, float]] = {source: {} for source in sources.values()}
    for cat in categories:
        for mode, source in sources.items():
            steps = [s for r in suite if r["category"] == cat and r["mode"] == mode for s in (r.get("steps") or [])]
            a = acceptance_mle(steps) if steps else None
            if a is not None:
                acceptance[source][cat] = a
    best = {(source, where): best_per_task(acceptance[source], curve, source)
            for source in acceptance for where, curve in curves.items()}
    out = []
    for cat in categories:
        row: dict = {"category": cat}
        for source in acceptance:
            row[source] = None if cat not in acceptance[source] else {"acceptance": acceptance[source][cat], **{
                where: {"k": best[(source, where)][cat]["k"], "speedup": best[(source, where)][cat]["predicted_speedup"]}
                for where in curves}}
        if row["model"] or row["lookup"]:
            out.append(row)
    return out


def auto_vs_best(by_cat: dict[str, dict[str, dict]], suite: list[dict] | None = None) -> list[dict]:
    """Per category: auto's median speedup (per-pair ratio to plain) against the best median speedup of plain
    (1.0) and every fixed method, the same end to end (`e2e`, with how many of auto's runs brought the draft model
    in), the median t/s beside them, and, where the plain runs carry it, auto's median
    speedup as a share of the median hindsight ceiling of copying (`bench.ceiling`, predicted per prompt turn on
    the curve measured before it)."""
    out = []
    for cat, stats in by_cat.items():
        auto = stats.get("auto")
        if not auto or not auto.get("speedup") or "plain" not in stats:
            continue
        fixed = {m: s["speedup"]["median"] for m, s in stats.items() if m not in ("auto", "plain") and s.get("speedup")}
        fixed["plain"] = 1.0
        best = max(fixed, key=fixed.get)
        a = auto["speedup"]["median"]
        row = {"category": cat, "auto": a, "auto_tps": auto["tps"]["median"], "best": best, "best_speedup": fixed[best],
               "plain_tps": stats["plain"]["tps"]["median"], "vs_best": a / fixed[best], "vs_plain": a,
               "ceiling": None, "of_ceiling": None}
        fixed_e2e = {m: s["speedup_e2e"]["median"] for m, s in stats.items()
                     if m not in ("auto", "plain") and s.get("speedup_e2e")}
        if auto.get("speedup_e2e"):
            fixed_e2e["plain"] = 1.0
            best_e2e = max(fixed_e2e, key=fixed_e2e.get)
            runs = [r for r in suite or [] if r["category"] == cat and r["method"] == "auto"]
            # the copying ceiling end to end: the plain run's prompt processing as it was, its decoding that much faster
            e2e_ceilings = [(r["t_prompt"] + r["t_decode"]) / (r["t_prompt"] + r["t_decode"] / r["hindsight"])
                            for r in suite or [] if r["category"] == cat and r.get("hindsight") and "t_decode" in r]
            row["e2e"] = {"auto": auto["speedup_e2e"]["median"], "best": best_e2e, "best_speedup": fixed_e2e[best_e2e],
                          "vs_best": auto["speedup_e2e"]["median"] / fixed_e2e[best_e2e], "runs": len(runs),
                          "draft_prompt_runs": sum(1 for r in runs if (r.get("auto") or {}).get("draft_model_brought_in")),
                          "ceiling": statistics.median(e2e_ceilings) if e2e_ceilings else None}
        ceilings = [r["hindsight"] for r in suite or [] if r["category"] == cat and r.get("hindsight")]
        if ceilings:
            row["ceiling"] = statistics.median(ceilings)
            row["of_ceiling"] = a / row["ceiling"]
        out.append(row)
    return out
