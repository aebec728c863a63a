"""`speclocal drafts [MAIN]`: every compatible draft model measured on this machine, ranked per task type."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from speclocal.errors import SpeclocalError
from speclocal.formatting import fmt_bytes, text_table
from speclocal.locations import models_dir
from speclocal.models.catalogue import load_catalogue, resolve_model
from speclocal.models.plan import local_models, remote_drafts, scan_drafts
from speclocal.options import add_options, load_args, settings_from_args
from speclocal.policy import drafts_rank as dr


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("main", metavar="MAIN", nargs="?",
                   help="main model: a .gguf path or a catalogue id (default: the pair's main model)")
    p.add_argument("--candidates", metavar="MODEL[,MODEL...]",
                   help="measure only these drafts (paths or catalogue ids; default: every compatible GGUF in the "
                        "catalogue and the models dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_options(p, "models", ("pair", "models_dir", "ctx_size", "threads", "n_gpu_layers", "repack"))
    add_options(p, "generation", ("n_predict",), n_predict=dr.N_PREDICT)


def _label(spec: str, path: Path) -> str:
    cat = load_catalogue()
    return spec if spec in cat.models else next((m.id for m in cat.models.values() if m.file == path.name), path.name)


def run(args: argparse.Namespace) -> int:
    s = settings_from_args(args)
    directory = models_dir(s.models_dir or None)
    main = resolve_model(args.main or load_catalogue().pair(s.pair or load_catalogue().default_pair).main, directory)
    if args.candidates is not None:
        specs = [x.strip() for x in args.candidates.split(",") if x.strip()]
        if not specs:
            raise SpeclocalError("--candidates names no model")
        found = [(_label(x, p), x, p) for x in specs for p in [resolve_model(x, directory)]]
    else:
        found = [(_label(v, p), v, p) for _, v, p in local_models(directory)]
    scan = scan_drafts(main, found)
    if args.candidates is not None and scan.rejected:
        label, _, _, why = scan.rejected[0]
        raise SpeclocalError(f"{label} cannot draft for {main.name}: {why}")
    remote = remote_drafts(scan.main, directory)
    if not scan.ok:
        fetch = f"; fetch one: speclocal fetch {remote[0].id}" if remote else ""
        raise SpeclocalError(f"no compatible draft model for {main.name} in {directory}{fetch}")
    n = args.n_predict or dr.N_PREDICT
    t0 = time.perf_counter()

    def progress(line: str) -> None:
        print(f"speclocal drafts: {time.perf_counter() - t0:5.0f} s {line}", file=sys.stderr, flush=True)

    ranking = dr.rank(main, [(label, path) for label, _, path in scan.ok], load_args(s), n, progress=progress)
    ranking["incompatible"] = [{"label": label, "path": str(path), "reason": why}
                               for label, _, path, why in scan.rejected]
    ranking["not_downloaded"] = [{"id": m.id, "params": m.params, "quant": m.quant, "size": m.size or None,
                                  "fetch": f"speclocal fetch {m.id}"} for m in remote]
    where = dr.save_ranking(ranking)
    if args.json:
        print(json.dumps(ranking, indent=2))
        return 0
    _print(ranking, where)
    return 0


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _print(r: dict, saved: Path | None) -> None:
    tasks = list(dr.TASK_SETS)
    curve = r["curve"]
    print(f"Draft models for {Path(r['main']).name} on {r['machine']} ({r['compute']}, {r['threads']} threads); "
          f"{r['prompts_per_task']} prompts x {r['n_predict']} tokens per task type; {r['seconds']:.0f} s")
    print(f"main model: single decode {curve['t_single'] * 1000:.0f} ms, V(2..{r['draft_k'] + 1}) = "
          + " ".join(f"{v:.2f}" for v in curve["verify"][1:]) + f" ({curve['source']})\n")
    rows = []
    for i, c in enumerate(r["candidates"], 1):
        m = c["memory"]
        cells = []
        for task in tasks:
            t = c["tasks"][task]
            k = t["best_k"] or dr.best_drafting_k(t)
            cells.append(f"{_x(t['speedup_by_k'][k - 1])} k={k}")
        o = c["overall"]
        rows.append([f"{i} {c['label']}", c["quantization"], f"{c['c']:.2f}", *cells,
                     f"{_x(o['predicted_drafting'])} k={o['k_drafting']}",
                     f"+{fmt_bytes(m['estimate'])} / {fmt_bytes(m['loaded'])}"])
    print(text_table(["candidate", "quant", "c", *tasks, "overall", "memory added"], rows))
    print("(predicted decode speedup at each draft's best length k, below 1.00x where plain is faster; c: a draft\n"
          f" token's cost in main-model decodes; memory: what the draft adds, weights + KV cache at -c {r['n_ctx']},\n"
          " estimated from its header / as llama.cpp allocated it)")
    print("\nacceptance by draft position 1..{} (a draft's i-th token kept, given the ones before it were):".format(
        r["draft_k"]))
    for i, c in enumerate(r["candidates"], 1):
        for task in tasks:
            print(f"  {i} {task:5} " + " ".join(f"{p:.2f}" for p in c["tasks"][task]["by_position"]))
    checked = [c for c in r["candidates"] if any("check" in t for t in c["tasks"].values())]
    if checked:
        print(f"\nmeasured check (plain, then speculative at k, back to back; {r['n_predict']} tokens, one prompt "
              "per task type; decode speed):")
        rows = [[c["label"], task, str(t["check"]["k"]), _x(t["check"]["predicted"]),
                 _x(t["check"]["predicted_prompt"]), _x(t["check"]["measured"]),
                 f"{t['check']['plain_tps']:.1f} -> {t['check']['spec_tps']:.1f} t/s",
                 "-" if t["check"]["acceptance"] is None else f"{t['check']['acceptance']:.0%}"]
                for c in checked for task, t in c["tasks"].items()]
        print(text_table(["draft", "task", "k", "predicted", "(its prompt)", "measured", "plain -> spec", "accepted"],
                         rows))
    a = r["answer"]
    print("\nanswer:")
    for task, t in a["tasks"].items():
        print(f"  {task:8} " + (f"{t['draft']} --draft-max {t['k']} ({_x(t['speedup'])} {t['how']})" if t["draft"]
                                 else f"no draft model pays ({_x(t['speedup'])} at best)"))
    o = a["overall"]
    print(f"  {'overall':8} " + (f"{o['draft']} --draft-max {o['k']} ({_x(o['speedup'])})" if o["draft"]
                                 else f"no single draft pays across task types ({_x(o['speedup'])} at best)"))
    if a["flags"]:
        print("use it:\n" + "\n".join(f"  {line}" for line in a["flags"].values()))
    else:
        print(f"{a['advice']}:\n  speclocal serve -m {r['main']} --mode auto   (speculates only where a drafter pays)")
    for c in r.get("incompatible", []):
        print(f"not a draft for it: {c['label']}: {c['reason']}")
    for m in r.get("not_downloaded", []):
        size = fmt_bytes(m["size"], binary=True) if m["size"] else "size unknown"
        print(f"not downloaded: {m['id']} ({m['params']} {m['quant']}, {size}): {m['fetch']}")
    pool = r["candidates"][0]["memory"]
    print(f"memory: {pool['pool']} has {fmt_bytes(pool['pool_available'], binary=True)} available; "
          f"saved: {saved or 'no (see the warning above)'}")
