"""The bench outputs: results.json (everything raw), results.csv (one row per run), report.md."""

from __future__ import annotations

import csv
import functools
import io
import json
from importlib import resources
from pathlib import Path

import jinja2

from speclocal.bench.metrics import CONTEXT_BIN, ENABLE_AT, WINDOW
from speclocal.files import atomic_write
from speclocal.formatting import fmt_bytes, fmt_num
from speclocal.policy.costmodel import CostCurve

CSV_FIELDS = [
    "phase", "category", "question_id", "turn", "rep", "order", "method", "mode", "k", "n_prompt", "n_generated",
    "stop_reason", "decode_tps", "speedup", "speedup_e2e", "ttft", "t_prompt", "t_decode", "draft_prompt_tokens", "t_draft_prompt", "n_drafted", "n_accepted", "acceptance",
    "n_passes", "tokens_per_pass", "draft_share", "peak_rss", "main_weights", "draft_weights", "main_kv", "draft_kv",
    "main_held", "draft_held", "draft_memory_added", "tokens_match_until", "compared", "identical", "margin", "near_tie",
]
TABLE_HEADER = ["category", "method", "prompts", "plain t/s", "t/s", "speedup", "e2e speedup", "acceptance",
                "tokens/pass", "TTFT s", "memory added", "identical", "verdict"]
TABLE_ALIGN = "llrrrrrrrrrrl"
PLOTS = [
    ("speedup_by_category.png", "Speedup vs plain by category"),
    ("acceptance_by_category.png", "Acceptance by category"),
    ("tps_over_position.png", f"Tokens/s over the generation ({WINDOW}-token windows)"),
    ("acceptance_vs_context.png", "Acceptance vs context length"),
    ("what_if.png", "What-if: the measured acceptance on a memory-bound machine"),
]


def json_text(data: dict) -> str:
    """Indented JSON, except that each raw run (with its per-pass steps) takes one line: readable, diffable
    and a fraction of the size of fully indented steps."""
    head = {k: v for k, v in data.items() if k != "runs"}
    text = json.dumps(head, indent=1, ensure_ascii=False, allow_nan=False)
    if "runs" not in data:
        return text + "\n"
    runs = ",\n".join("  " + json.dumps(r, ensure_ascii=False, allow_nan=False) for r in data["runs"])
    body = text[:-2] + ",\n" if head else "{\n"
    return body + ' "runs": [\n' + runs + ("\n" if runs else "") + " ]\n}\n"


def write_json(path: Path, data: dict) -> None:
    atomic_write(path, json_text(data))


def csv_text(records: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    for r in records:
        row = {k: r.get(k) for k in CSV_FIELDS}
        for k, v in r["memory"].items():  # what llama.cpp holds per device, summed here (results.json has each)
            row[k] = sum(sum(parts.values()) for parts in v.values()) if isinstance(v, dict) else v
        eq = r.get("equivalence") or {}
        for k in ("tokens_match_until", "compared", "identical", "margin", "near_tie"):
            row[k] = eq.get(k)
        w.writerow({k: "" if v is None else v for k, v in row.items()})
    return buf.getvalue()


# ---- formatting -----------------------------------------------------------------------------------
def mem(n: int | None) -> str:
    """Bytes as the report shows them; nothing added is "0"."""
    return fmt_bytes(n, binary=True) if n else "0"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.1f}%"


def fmt_spread(s: dict | None, spec: str = ".2f", suffix: str = "") -> str:
    """A spread (speclocal.stats) as "median (min–max)"."""
    if s is None:
        return "-"
    if s["n"] == 1:
        return f"{s['median']:{spec}}{suffix}"
    return f"{s['median']:{spec}}{suffix} ({s['min']:{spec}}–{s['max']:{spec}})"


def md_table(header: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "l" * len(header)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _identical(st: dict) -> str:
    eq = st["equivalence"]
    return f"{eq['identical']}/{eq['checked']}" if eq["checked"] else "-"


def category_rows(summary: dict) -> list[list[str]]:
    rows = []
    for cat, stats in summary["categories"].items():
        others = [m for m in stats if m != "plain"] or ["plain"]
        for m in others:
            st = stats[m]
            rows.append([cat, m, str(st["prompts"]), fmt_spread(st["plain_tps"]), fmt_spread(st["tps"]),
                         fmt_spread(st["speedup"], suffix="x"), fmt_spread(st.get("speedup_e2e"), suffix="x"),
                         pct(st["acceptance"]), fmt_num(st["tokens_per_pass"]),
                         fmt_num(st["ttft"]["median"] if st["ttft"] else None), mem(st["memory_added"]), _identical(st),
                         st["verdict"] or "baseline"])
    return rows


def recommendation_lines(summary: dict) -> list[str]:
    lines = []
    for cat, rec in summary["recommendations"].items():
        if rec["method"] != "plain":
            lines.append(f"- **{cat}**: enable `{rec['method']}` — {rec['speedup']:.2f}x plain's decode speed "
                         f"(median), acceptance {pct(rec['acceptance'])}.")
        elif rec.get("best_other"):
            lines.append(f"- **{cat}**: keep speculation off — the best method, `{rec['best_other']}`, ran at "
                         f"{rec['best_other_speedup']:.2f}x plain (acceptance {pct(rec['acceptance'])}); "
                         f"enabling needs ≥ {ENABLE_AT:.2f}x and outputs equal to plain's.")
        else:
            lines.append(f"- **{cat}**: plain only ({rec.get('reason', 'no speculative method measured')}).")
    return lines


def elsewhere_lines(data: dict) -> list[str]:
    """The settings to use elsewhere: `speclocal serve` (auto decides per request), and for each category the
    llama-server flags of the method recommended here (the pinned llama.cpp's flag names)."""
    models = data.get("models") or {}
    main = (models.get("main") or {}).get("path", "MAIN.gguf")
    draft = (models.get("draft") or {}).get("path")
    pair = f"-m {main}" + (f" -md {draft}" if draft else "")
    lines = [f"- `speclocal serve {pair} --mode auto`: one endpoint (OpenAI's API) that speculates per request "
             "where this machine's cost curve says it pays.", "- llama-server, one method for all requests: "]
    for cat, rec in data["summary"]["recommendations"].items():
        method, k = rec["method"], next((m["k"] for m in data.get("method_details", [])
                                         if m["name"] == rec["method"]), 0)
        if method.startswith("spec") and draft:
            flags, why = f"-m {main} -md {draft} --spec-draft-n-max {k} --spec-draft-n-min 0", method
        elif method.startswith("lookup"):
            flags = f"-m {main} --spec-type ngram-simple --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m {k}"
            why = method
        else:
            flags, why = f"-m {main}", "plain: speculation does not pay here"
        lines.append(f"  - {cat} ({why}): `llama-server {flags}`")
    return lines


def findings(summary: dict) -> list[str]:
    """A few data-driven sentences: the seed's expectations against what was measured here."""
    out = []
    cats = summary["categories"]
    model_methods = sorted({m for s in cats.values() for m in s if m.startswith("spec-")})
    lookup_methods = sorted({m for s in cats.values() for m in s if m.startswith("lookup-")})
    for m in model_methods[:1]:
        ranked = sorted(((s[m]["acceptance"], c) for c, s in cats.items() if m in s and s[m]["acceptance"] is not None),
                        reverse=True)
        if ranked:
            out.append(f"Draft-model acceptance (`{m}`) by category, highest first: "
                       + ", ".join(f"{c} {pct(a)}" for a, c in ranked) + ".")
        wins = [c for c, s in cats.items() if m in s and s[m]["verdict"] == "enable"]
        sp = [s[m]["speedup"]["median"] for s in cats.values() if m in s and s[m]["speedup"]]
        if sp:
            out.append(f"`{m}` median speedup ranges {min(sp):.2f}x–{max(sp):.2f}x across categories; it pays in "
                       + (", ".join(wins) if wins else "no category") + " on this machine.")
    for m in lookup_methods[:1]:
        wins = [c for c, s in cats.items() if m in s and s[m]["verdict"] == "enable"]
        out.append(f"Prompt lookup (`{m}`, no second model, no memory added) pays in "
                   + (", ".join(wins) if wins else "no category") + ".")
    if model_methods and not any(cats[c].get(m, {}).get("verdict") == "enable" for c in cats for m in model_methods):
        out.append("A draft model that does not pay even at high acceptance means verifying several tokens costs "
                   "nearly as much as decoding them one by one: decoding is compute-bound here (typical of small "
                   "x86 CPUs). On memory-bound machines (GPUs, unified memory) the same acceptance pays.")
    return out


def mat_rows(summary: dict) -> list[list[str]]:
    """Per category and method: MAT, and per draft source its MAT and share of the steps."""
    rows = []
    for cat, stats in summary["categories"].items():
        for m, st in stats.items():
            x = st.get("mat")
            if not x:
                continue
            by = ", ".join(f"{src} {c['mat']:.2f} ({c['share']:.0%})" for src, c in x["by_source"].items())
            rows.append([cat, m, f"{x['mat']:.2f}", str(x["steps"]), by])
    return rows


def mat_ratio_lines(summary: dict) -> list[str]:
    """Per category: the suffix drafter's MAT over prompt lookup's (the best of each method's caps)."""
    out = []
    for cat, stats in summary["categories"].items():
        best = {}
        for prefix in ("suffix-", "lookup-"):
            cells = [(st["mat"]["mat"], m) for m, st in stats.items() if m.startswith(prefix) and st.get("mat")]
            if cells:
                best[prefix] = max(cells)
        if len(best) == 2:
            (s_mat, s_m), (l_mat, l_m) = best["suffix-"], best["lookup-"]
            out.append(f"- **{cat}**: `{s_m}` {s_mat:.2f} against `{l_m}` {l_mat:.2f}: {s_mat / l_mat:.2f}x.")
    return out


def curve_line(profile: dict) -> str:
    curve = CostCurve.from_dict(profile)
    v = curve.verify
    shown = ", ".join(f"V({n})={v[n - 1]:.2f}" for n in (1, 2, 3, 4, 5, 9, len(v)) if n <= len(v))
    model = curve.draft_cost != float("inf")
    deep = ["; {} tokens deep: ".format(d.pos) + ", ".join([f"V({n})={x:.2f}" for n, x in d.verify]
                                                        + ([f"c = {d.draft_cost:.2f}"] if d.draft_cost is not None else []))
            for d in curve.deep if d.verify or d.draft_cost is not None]
    return (f"This machine's profile (`speclocal profile`): {shown}; a draft-model token costs "
            + (f"c = {curve.draft_cost:.2f}" if model else "nothing (no draft model)")
            + f", a prompt-lookup proposal {curve.lookup_cost:.4f}"
            + (f" and a suffix-drafter proposal {curve.suffix_cost:.4f}" if curve.suffix_cost is not None else "")
            + " of a main-model decode"
            + (f", the draft model's prompt processing {curve.draft_prefill:.3f} per token"
               if model and curve.draft_prefill is not None else "")
            + "".join(deep) + ".")


def prediction_lines(data: dict) -> list[str]:
    pc = data["summary"].get("prediction")
    if not pc or not pc["rows"]:
        return []
    rows = [[r["category"], r["method"], str(r["runs"]), fmt_num(r["predicted"], ".2f", "x"), fmt_num(r["measured"], ".2f", "x"),
             pct(r["error"])] for r in pc["rows"]]
    return ["## The cost model against the fixed-k runs", "",
            curve_line(data["profile"]) + " For every run of a fixed draft length the speedup is predicted from the "
            "run's own acceptance (the i.i.d. estimate accepted ÷ (accepted + rejections), fitted separately to the "
            "steps that drafted 1–3, 4–7 and 8 or more tokens) and its steps' draft lengths, S = Σ E(a_d, d) ÷ "
            "Σ (D(d) + V(d+1)), D(d) = d·c for the draft model and one search per proposal for prompt lookup and the "
            "suffix drafter, and set against the measured pair ratio. Error = |predicted − measured| "
            "÷ measured, on the category medians.", "",
            md_table(["category", "method", "runs", "predicted", "measured", "error"], rows, "llrrrr"), "",
            f"Median error across categories and methods: **{pct(pc['median_error'])}** (run by run: "
            f"{pct(pc['median_run_error'])} over {pc['runs']} runs).", ""] + context_lines(pc) + profiles_lines(data)


def context_lines(pc: dict) -> list[str]:
    """The cost model's error by context depth (prompt + half the answer): where long prompts are mispredicted."""
    by = pc.get("by_context") or []
    if not by:
        return []
    rows = [[f"{lo}–{hi - 1}" if hi < 1 << 30 else f"≥ {lo}", x["method"], str(x["runs"]), pct(x["median_error"]),
             f"{x['median_signed_error']:+.0%}"] for x in by for lo, hi in [x["context"]]]
    return ["By context depth (the prompt and half the answer, in tokens; signed: + = predicted too fast):", "",
            md_table(["context", "method", "runs", "median error", "median signed error"], rows, "llrrr"), ""]


def profiles_lines(data: dict) -> list[str]:
    """How the cost curve moved during the run, and what predicting from the first one alone would have given."""
    profiles, first = data.get("profiles") or [], data["summary"].get("prediction_start_profile")
    if len(profiles) < 2 or not first:
        return []
    v4 = [p["verify"][3] for p in profiles]
    cs = [p["draft_cost"] for p in profiles if p["draft_cost"] is not None]
    spread = f"V(4) {min(v4):.2f}–{max(v4):.2f}" + (f", c {min(cs):.2f}–{max(cs):.2f}" if cs else "")
    return [f"The cost curve was measured {len(profiles)} times during the bench ({spread}); each run is predicted "
            "from the mean of the curves measured just before and just after it. From the first curve alone the "
            f"median error would be **{pct(first['median_error'])}** (run by run {pct(first['median_run_error'])}).", ""]


def what_if_lines(data: dict) -> list[str]:
    wi = data["summary"].get("what_if")
    if not wi:
        return []

    def cell(x: dict | None, where: str) -> str:
        if not x:
            return "-"
        k, s = x[where]["k"], x[where]["speedup"]
        return "plain (1.00x)" if k == 0 else f"{s:.2f}x (k={k})"

    rows = [[w["category"], pct((w["model"] or {}).get("acceptance")), cell(w["model"], "here"),
             cell(w["model"], "memory_bound"), pct((w["lookup"] or {}).get("acceptance")), cell(w["lookup"], "here"),
             cell(w["lookup"], "memory_bound")] for w in wi]
    return ["## What-if: the same acceptance on another machine", "",
            "Best predicted speedup and draft length for each category's measured acceptance, on this machine's curve "
            "and on a memory-bound one (a GPU or unified-memory box: V(n) ≈ 1 + 0.02(n−1), a draft token 0.1 of a main "
            "one). `speclocal profile --what-if FILE` does the same for a saved profile of another machine.", "",
            md_table(["category", "draft acceptance", "draft here", "draft memory-bound", "lookup acceptance",
                      "lookup here", "lookup memory-bound"], rows, "lrrrrrr"), ""]


def overall_rows(overall: dict) -> list[list[str]]:
    return [[m, str(o["runs"]), fmt_spread(o["tps"]), fmt_spread(o["speedup"], suffix="x"), pct(o["acceptance"]),
             fmt_num(o["tokens_per_pass"]), fmt_spread(o["ttft"]), mem(o["memory_added"]), mem(o["peak_rss"]),
             _identical(o) if m != "plain" else "-"] for m, o in overall.items()]


def stability_rows(stab: list[dict]) -> list[list[str]]:
    return [[x["question_id"], x["method"], str(x["n_generated"]), fmt_num(x["decode_tps"]), fmt_num(x["window_mean"]),
             f"{fmt_num(x['window_min'])}–{fmt_num(x['window_max'])}", pct(x["cv"]), pct(x["acceptance"])]
            for x in stab]


def by_context_table(abc: dict, methods: list[str]) -> str:
    """Acceptance (drafted tokens) per context range, one column per method."""
    bins = sorted({b["context_from"] for v in abc.values() for b in v})
    ms = [m for m in methods if m in abc]
    rows = []
    for lo in bins:
        row = [f"{lo}–{lo + CONTEXT_BIN}"]
        for m in ms:
            cell = next((b for b in abc[m] if b["context_from"] == lo), None)
            row.append(f"{pct(cell['acceptance'])} ({cell['drafted']})" if cell else "")
        rows.append(row)
    return md_table(["context tokens"] + ms, rows, "l" + "r" * len(ms))


def auto_rows(auto: dict) -> list[list[str]]:
    rows = []
    for cat, a in auto.items():
        total = sum(a["decisions"].values()) or 1
        used = ", ".join(f"{src} {n / total:.0%}" for src, n in sorted(a["decisions"].items(), key=lambda x: -x[1]))
        rows.append([cat, ", ".join(a["tasks"]), used or "-", fmt_num(a["predicted_speedup"], ".2f", "x")])
    return rows


def auto_vs_best_rows(avb: list[dict]) -> list[list[str]]:
    def e2e(x: dict) -> list[str]:
        e = x.get("e2e")
        if not e:
            return ["-"] * 5
        return [fmt_num(e["auto"], suffix="x"), f"{e['best']} ({fmt_num(e['best_speedup'], suffix='x')})",
                fmt_num(e["vs_best"], suffix="x"), fmt_num(e.get("ceiling"), suffix="x"),
                f"{e['draft_prompt_runs']}/{e['runs']}"]

    return [[x["category"], fmt_num(x["auto"], suffix="x"), f"{x['best']} ({fmt_num(x['best_speedup'], suffix='x')})",
             fmt_num(x["vs_best"], suffix="x"), *e2e(x), f"{fmt_num(x['auto_tps'])} / {fmt_num(x['plain_tps'])}",
             fmt_num(x.get("ceiling"), suffix="x"), pct(x.get("of_ceiling"))] for x in avb]


def per_prompt_table(pp: list[dict], methods: list[str]) -> str:
    """Per prompt turn: plain's t/s and each other method's median speedup (acceptance)."""
    ms = [m for m in methods if m != "plain"]
    rows = []
    for p in pp:
        plain = p["methods"].get("plain")
        row = [p["category"], p["question_id"], str(p["turn"] + 1), str(p["n_prompt"]),
               fmt_num(plain["tps"]["median"]) if plain else "-"]
        for m in ms:
            x = p["methods"].get(m)
            row.append("-" if not x or not x["speedup"] else
                       f"{x['speedup']['median']:.2f}x" + (f" ({pct(x['acceptance'])})" if x["acceptance"] is not None else ""))
        rows.append(row)
    return md_table(["category", "prompt", "turn", "prompt tokens", "plain t/s"] + ms, rows, "lllrr" + "r" * len(ms))


def divergence_rows(div: list[dict]) -> list[list[str]]:
    return [[r["question_id"], str(r["turn"] + 1), str(r["rep"] + 1), r["method"],
             f"{r['equivalence']['tokens_match_until']}/{r['equivalence']['compared']}",
             fmt_num(r["equivalence"]["margin"], ".3f"), "yes" if r["equivalence"]["near_tie"] else "**NO**"]
            for r in div]


def store_state(data: dict) -> dict | str | None:
    """The suffix store as the report states it: None where no method drafts from it, "off", or its counts."""
    if not any(m.get("mode") in ("suffix", "auto") for m in data.get("method_details", [])):
        return None
    info = data["settings"].get("store_info")
    if not (data["settings"].get("store") and info):
        return "off"
    return {"directory": info["directory"], "before": info["before"] or {}, "after": info["after"] or {},
            "tokens_added": info["tokens_added"]}


def load_state(data: dict) -> dict | None:
    """The 1-minute load average over the runs; busy where it is well above the bench's own threads."""
    loads = sorted(r["load_avg_1m"] for r in data["runs"] if r.get("load_avg_1m") is not None)
    if not loads:
        return None
    med = loads[len(loads) // 2]
    return {"median": med, "max": loads[-1], "busy": med > data["settings"]["threads"] + 0.75}


def report_context(data: dict) -> dict:
    """The names bench-report.md.j2 reads: the data, its parts, and the helpers that turn them into rows."""
    s = data["summary"]
    return {
        "data": data, "s": s, "st": data["settings"], "mach": data["machine"], "models": data["models"],
        "store": store_state(data), "load": load_state(data), "mat_rows": mat_rows(s),
        "mat_ratios": mat_ratio_lines(s), "findings": findings(s),
        "diverged": [r for r in data["runs"] if r.get("equivalence") and not r["equivalence"]["identical"]],
        "compared": sum(1 for r in data["runs"] if r.get("equivalence")),
        "ENABLE_AT": ENABLE_AT, "WINDOW": WINDOW, "PLOTS": PLOTS, "TABLE_HEADER": TABLE_HEADER,
        "TABLE_ALIGN": TABLE_ALIGN, "md_table": md_table, "category_rows": category_rows,
        "recommendation_lines": recommendation_lines, "elsewhere_lines": elsewhere_lines,
        "overall_rows": overall_rows, "stability_rows": stability_rows, "by_context_table": by_context_table,
        "auto_rows": auto_rows, "auto_vs_best_rows": auto_vs_best_rows, "per_prompt_table": per_prompt_table,
        "divergence_rows": divergence_rows, "prediction_lines": prediction_lines, "what_if_lines": what_if_lines,
    }


@functools.cache
def report_template() -> jinja2.Template:
    """data/bench-report.md.j2; undefined names fail loudly rather than render empty."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True, autoescape=False)
    env.filters.update(mem=mem, f=format)
    text = resources.files("speclocal").joinpath("data/bench-report.md.j2").read_text(encoding="utf-8")
    return env.from_string(text)


def report_markdown(data: dict) -> str:
    return report_template().render(report_context(data))


def write_outputs(out: Path, data: dict, plots: bool = True) -> list[str]:
    """Write every output; returns the file names written (plots may fail alone, with a note)."""
    written = []
    write_json(out / "results.json", data)
    written.append("results.json")
    atomic_write(out / "results.csv", csv_text([r for r in data["runs"]]))
    written.append("results.csv")
    if plots:
        from speclocal.bench.plots import write_plots

        written += write_plots(out, data)
    atomic_write(out / "report.md", report_markdown(data))
    written.append("report.md")
    return written


def rerender(out: Path) -> list[str]:
    """Recompute the summary from a results.json's raw runs and rewrite every output beside it."""
    from speclocal.bench.metrics import attach_speedups, summarize

    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    attach_speedups(data["runs"])
    data["summary"] = summarize(data["runs"], data["methods"], data["settings"]["categories"], data.get("profile"),
                                data.get("profiles"))
    return write_outputs(out, data)


if __name__ == "__main__":  # python -m speclocal.bench.report DIR: re-render DIR/report.md and plots
    import sys

    for d in sys.argv[1:] or ["."]:
        print(", ".join(rerender(Path(d))))
